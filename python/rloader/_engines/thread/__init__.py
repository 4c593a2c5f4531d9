"""Worker threads (``worker_type="thread"``): the pool's Python side and its workers' state
(``pool``), and one intra-op thread per worker thread (``intra_op``). Their
``get_worker_info`` is ``rloader._thread_info``, below collation, which asks it too."""
