"""Each worker thread's ``WorkerInfo`` (NOTE [Thread worker info] in ``_threads.py``).

A module of its own so that collation (``_collate.py``) can ask whether it runs on a worker
thread without importing the thread pool.
"""

from __future__ import annotations

import threading

local = threading.local()


def info():
    """The calling worker thread's ``WorkerInfo``, or None on any other thread."""
    return getattr(local, "info", None)


def in_thread_worker() -> bool:
    """Whether the calling thread is one of rloader's worker threads."""
    return getattr(local, "info", None) is not None
