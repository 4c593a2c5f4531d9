"""The engines behind an auto iterator: the loader as one engine sees it (``EngineView``) and
what the iterator keeps of each engine it started (``Engine``)."""

from __future__ import annotations

import collections
import weakref
from typing import Any, NamedTuple, Optional

from . import measure

STAGES = ("fetch_s", "collate_s", "transport_s", "pin_s")
POOL_CPU = "pool_cpu_s"  # of ``stages``: a thread pool's worker threads' CPU seconds (or None)


def stages(d: dict) -> dict:
    """The loading stages' seconds of an engine's ``stats()``, and (``POOL_CPU``) its worker
    threads' CPU seconds (``measure.pool_clock``; None but for a thread pool). Read together,
    so that a window's start has both, however its engine's epoch began."""
    out = {k: d[k] for k in STAGES}
    out[POOL_CPU] = measure.pool_clock(d)
    return out


class EngineView:
    """The loader as one engine sees it: its attributes, but the engine's worker count, kind,
    prefetch, persistence and order."""

    def __init__(self, loader, **overrides) -> None:
        # Weakly, as AutoIter holds its loader: a persistent loader holds its iterator.
        self.__dict__["_loader_ref"] = weakref.ref(loader)
        self.__dict__.update(overrides)

    @property
    def _loader(self):
        return self.__dict__["_loader_ref"]()

    # The loader whose record a pool keeps its shared memory in (start_pool): a stopped pool's
    # region serves the loader's next pool.
    _rloader_owner = _loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class Raised(NamedTuple):
    """An error met while draining an engine, raised in its place (``Engine.drain``)."""

    error: BaseException


class Engine:
    """One engine of the epoch (the main process's loop, or a pool) and what the iterator
    measures of it."""

    def __init__(self, it, workers: int, kind: str, segment: Any) -> None:
        self.it = it
        self.workers = workers
        self.kind = kind
        self.segment = segment
        self.stages = stages(it._stats.as_dict())  # at the start: subtracted from later reads
        self.window_start = dict(self.stages)
        self.memory_due = 0.0  # when its workers' memory is read next (clock())
        self.warm = False  # has handed out its first round (``AutoIter._decide``)
        self.start_s: Optional[float] = None  # its start, while measured (``AutoIter._next``)
        # Its in-flight batches, taken before its workers were stopped (``drain``).
        self.drained: Optional[collections.deque] = None
        self.exhausted = False  # ... and whether that took all it drew
        self.first_window = True  # its windows this epoch have not ended yet (``_last_window``)
        self.prefetch = 0  # its batches in flight per worker (0: the main process)
        self.prefetch_fixed = False  # its prefetch cannot change in place (``PrefetchTuning``)
        self.lived = 0  # batches it handed out in the epochs before this one
        self.e_from = (0, 0.0, 0.0)  # the epoch's (batches, wait, user) as it began serving
        self.warm_from: Optional[tuple] = None  # ... once its first round was handed out

    def next(self):
        """Its next batch: the drained ones first."""
        if self.drained:
            item = self.drained.popleft()
            if isinstance(item, Raised):
                raise item.error
            return item
        if self.exhausted:
            raise StopIteration
        return next(self.it)

    @property
    def handed(self) -> int:
        """Batches it has handed out to the consumer."""
        return self.it._progress[0] - len(self.drained or ())

    def drain(self) -> None:
        """Takes its in-flight batches (its segment closed: it draws nothing more) and stops its
        workers, so that they are gone before the next pool starts (the memory budget holds
        through a switch); ``next`` hands the batches out in order. An error while taking them
        is kept in its place and raised when the consumer reaches it, and the workers, not
        stopped then, serve the rest."""
        items: collections.deque = collections.deque()
        self.drained = items
        while True:
            try:
                items.append(next(self.it))
            except StopIteration:
                break
            except Exception as error:
                items.append(Raised(error))
                return
        self.exhausted = True
        self.stop()

    def stop(self) -> None:
        shutdown = getattr(self.it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
            return
        pool = getattr(self.it, "_rloader_pool", None)
        if pool is not None and hasattr(pool, "stop"):
            pool.stop()

    @property
    def stopped(self) -> bool:
        pool = getattr(self.it, "_rloader_pool", None)
        return bool(getattr(pool, "stopped", False))
