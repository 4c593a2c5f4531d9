"""Where a loader's batches are made: in the iterating thread (``single_process``), in
worker processes (``process/``: the pool, a worker's entry point, the wire format, a dead
worker's error) or in worker threads (``thread/``: the pool's Python side, one intra-op thread
per worker); ``dispatch`` picks one. Imports run downward: ``dispatch`` over ``process`` and
``thread``, over ``single_process``, ``batch_memory`` and ``iterable_len``."""
