"""Each worker thread's ``WorkerInfo`` (NOTE [Thread worker info] in ``_engines/thread/pool.py``).

A module of its own so that collation (``_collate.py``) can ask whether it runs on a worker
thread without importing the thread pool.
"""

from __future__ import annotations

import threading
import weakref

local = threading.local()


class InfoCell:
    """Holds a worker thread's ``WorkerInfo``; the thread refers to its cell weakly."""

    __slots__ = ("info", "__weakref__")

    def __init__(self, info) -> None:
        self.info = info


def set_info(cell: InfoCell) -> None:
    """Makes ``cell.info`` the calling worker thread's ``WorkerInfo``.

    The thread keeps a weak reference: the strong one is its worker's (``_ThreadWorker.info``),
    which the garbage collector sees through the pool (NOTE [Worker slots] in
    rust/rloader-py/src/threads/worker.rs). A thread's locals are not visible to the collector:
    held there, the info's dataset would keep a loader it refers to alive for good.
    """
    local.info = weakref.ref(cell)


def info():
    """The calling worker thread's ``WorkerInfo``, or None on any other thread."""
    ref = getattr(local, "info", None)
    cell = None if ref is None else ref()
    return None if cell is None else cell.info


def in_thread_worker() -> bool:
    """Whether the calling thread is one of rloader's worker threads."""
    return info() is not None
