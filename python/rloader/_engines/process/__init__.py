"""Worker processes: the main process's side (``pool``: start, new epoch, stop), a worker's
entry point and the hooks Rust calls there (``worker``), a batch as bytes and back (``wire``),
and noticing a dead worker (``death``)."""
