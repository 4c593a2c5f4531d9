"""The iterator of a ``num_workers="auto"`` loader (NOTE [Auto workers] in __init__.py): the
epoch's engines over one key stream, switched between as windows of measurements decide."""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any, Callable, Optional

from torch.utils.data.dataloader import _DatasetKind

from .._seed import draw_seed
from ..sampler import iter_keys
from . import measure, policy
from .decisions import Decisions
from .engines import STAGES, Engine, EngineView, stages
from .gil_probe import GilProbeSession
from .keys import Source
from .kind import KindChoice, loads_without_gil
from .learned import learned_of, per_worker
from .options import AUTO, is_auto
from .prefetch import PrefetchTuning
from .stats import AutoStats
from .window import Tally

log = logging.getLogger("rloader")


def start(loader, make_engine: Callable, epoch_of: Callable) -> "AutoIter":
    """``iter()`` of an auto loader: the epoch's draws, in a fixed loader's order (the index
    sampler's iterator, the base seed, a resume's skip), then the iterator. ``make_engine(view,
    keys, base_seed, kind)`` starts one engine; ``epoch_of(loader)`` is the epoch's resume
    record (NOTE [Resume])."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    base_seed = draw_seed(loader.generator)
    keys = epoch_of(loader).keys(keys)
    return AutoIter(loader, keys, base_seed, make_engine, epoch_of)


class AutoIter(Decisions):
    """The iterator of a ``num_workers="auto"`` loader: its engines, in hand-out order, and the
    decisions that switch between them (NOTE [Auto workers])."""

    def __init__(self, loader, keys, base_seed: int, make_engine, epoch_of) -> None:
        # Weakly, and strongly only while it must: a persistent loader holds its iterator, and
        # a cycle would keep a dropped loader's workers alive until the garbage collector runs;
        # but `for b in DataLoader(...)` holds its loader through the iterator alone. So the
        # iterator holds its loader through its epochs (`_hold`), a persistent one's until the
        # epoch ends (the loader's next iter() resets it).
        self._loader_ref = weakref.ref(loader)
        self._hold = loader
        self._make_engine = make_engine
        self._epoch_of = epoch_of
        self._iterable = loader._dataset_kind == _DatasetKind.Iterable
        self._base_seed = base_seed
        self._learned = learned = learned_of(loader)
        self._persistent = bool(loader.persistent_workers)
        self._kind_fixed = loader.worker_type if loader.worker_type != AUTO else None
        self._stats = AutoStats()
        self._stats.learned = learned
        self._prefetch = PrefetchTuning(
            learned, self._stats, is_auto(loader.prefetch_factor), loader.prefetch_factor
        )
        self._cores = measure.usable_cores()
        self._budget = measure.memory_budget()
        self._tally = Tally()
        self._gil = GilProbeSession(learned, self._kind_fixed)
        me = weakref.ref(self)
        self._choice = KindChoice(
            learned,
            self._stats,
            self._tally,
            self._gil,
            kind_fixed=self._kind_fixed,
            persistent=self._persistent,
            cores=self._cores,
            budget=self._budget,
            # (through a weak reference: a cycle would keep a dropped loader's workers alive
            # until the garbage collector runs)
            epoch_batches=lambda: me()._epoch_batches(),
            epoch_ended=lambda: me()._finished,
            gil_free=loads_without_gil(loader.dataset),
        )
        self._engines: list = []  # in hand-out order; the last draws the keys
        self._taken_done = 0  # batches handed out by engines that have ended
        self._finished = False
        self._finished_before = False  # this epoch's end was counted
        self._closed = False
        self._begin_epoch(keys, reported_len=None)

    # -- what DataLoader and _resume use --------------------------------------------------

    @property
    def _rloader_pool(self) -> "AutoIter":
        return self

    @property
    def stopped(self) -> bool:
        """Whether a persistent loader must start a new iterator for its next epoch."""
        return self._closed or any(e.stopped for e in self._engines)

    @property
    def _progress(self) -> tuple:
        taken = self._taken_done + sum(e.handed for e in self._engines)
        return taken, self._finished

    @property
    def _handouts(self):
        """An IterableDataset's epoch's engine's record of its hand-outs (its workers' states:
        ``_resume``); None for a map-style dataset, whose engines' batches are counted here."""
        if not self._iterable or not self._engines:
            return None
        return getattr(self._engines[-1].it, "_handouts", None)

    @property
    def _exhausted(self) -> bool:
        """Whether an IterableDataset's epoch read in the main process ended its stream."""
        if not self._iterable or not self._engines:
            return False
        return bool(getattr(self._engines[-1].it, "_exhausted", False))

    def __iter__(self) -> "AutoIter":
        return self

    def __len__(self) -> int:
        return len(self._loader._index_sampler)

    @property
    def _loader(self):
        loader = self._loader_ref()
        if loader is None:
            raise ReferenceError("the DataLoader of this iterator is gone")
        return loader

    def __reduce__(self):
        raise TypeError("cannot pickle 'AutoIter' object")

    def _shutdown_workers(self) -> None:
        self._closed = True
        self._hold = None
        self._gil.stop()
        engines, self._engines = self._engines, []
        for engine in engines:
            engine.stop()
        self._stats.live = []

    def _reset(self, keys, reported_len=None) -> None:
        """A new epoch with persistent workers: the last engine is kept."""
        self._begin_epoch(keys, reported_len)

    # -- epochs and engines --------------------------------------------------------------

    def _begin_epoch(self, keys, reported_len) -> None:
        self._hold = self._loader
        self._started_at = measure.clock()
        self._first_engine = True  # (torch's warnings once per epoch)
        self._stats.clear()
        self._taken_done = 0
        self._tally.new_epoch()
        self._finished = self._finished_before = False
        self._source = None if self._iterable else Source(keys)
        self._window_reset()
        kept = self._engines[-1] if self._engines else None
        for engine in self._engines[:-1]:
            engine.stop()
        self._engines = []
        self._stats.live = []
        if self._iterable:
            # (chosen as the epoch began, ``stream_readers``: a resume's may be its saved ones)
            workers, kind = self._epoch_of(self._loader).readers
            if self._keeps(kept, workers, kind):
                self._keep(kept, None, reported_len)
            else:
                if kept is not None:
                    kept.stop()
                why = "the previous epoch's measurements" if workers else "start"
                self._switch(workers, why, kind=kind)
            return
        workers = self._learned.workers
        if self._keeps(kept, workers):
            self._keep(kept, self._source.segment(), reported_len)
        else:
            if kept is not None:
                kept.stop()
            self._switch(workers, "the previous epoch's choice" if workers else "start")

    def _keeps(self, kept: Optional[Engine], workers: int, kind: Optional[str] = None) -> bool:
        """Whether the last epoch's pool (persistent workers) is the one this epoch starts on."""
        kind = kind or self._choice.next_kind()
        return (
            kept is not None
            and workers > 0
            and (kept.workers, kept.kind, kept.prefetch) == (workers, kind, self._prefetch.factor)
        )

    def _keeps_pool(self, workers: int, kind: str) -> bool:
        """Whether the next epoch, read by ``workers`` of ``kind``, goes on with this
        iterator's persistent pool (``state_dict()`` between epochs saves its workers' places
        then)."""
        kept = self._engines[-1] if self._engines and not self.stopped else None
        return self._keeps(kept, workers, kind)

    def _keep(self, engine: Engine, segment: Any, reported_len) -> None:
        engine.lived += engine.handed
        engine.it._reset(segment, reported_len)
        engine.segment = segment
        engine.warm = True  # its workers run, and _reset sent the first tasks
        engine.start_s = None  # (no start to measure)
        engine.drained, engine.exhausted = None, False  # (the last engine is never drained)
        engine.first_window = True
        engine.stages = stages(engine.it._stats.as_dict())
        engine.window_start = dict(engine.stages)
        engine.e_from = self._tally.mark()
        engine.warm_from = None  # (no start this epoch)
        self._engines.append(engine)
        self._stats.live.append(engine)
        self._stats.prefetch = engine.prefetch or None
        self._record(engine.workers, engine.kind, "kept (persistent workers)")

    def _switch(
        self,
        workers: int,
        why: str,
        window: Optional[policy.Window] = None,
        kind: Optional[str] = None,
    ) -> None:
        """Starts the engine of ``workers`` workers (of ``kind``, else the next kind) on the
        rest of the stream; the current one draws nothing more and hands out what it has (NOTE
        [Auto workers])."""
        loader = self._loader
        if workers > 0:
            self._gil.stop()  # (its thread is not forked into the workers)
        if self._engines and self._engines[-1].segment is not None:
            self._engines[-1].segment.close()
        segment = None if self._iterable else self._source.segment()
        kind = (kind or self._choice.next_kind()) if workers > 0 else "main"
        old = self._engines[-1] if self._engines else None
        if old is not None and old.workers and workers and old.drained is None:
            if (old.workers + workers) * per_worker(self._learned, kind) > self._budget:
                old.drain()  # the two pools together would exceed the memory budget
        prefetch = self._prefetch.factor
        view = EngineView(
            loader,
            num_workers=workers,
            prefetch_factor=prefetch if workers > 0 else None,
            # (a tuned pool's region has slots for the deepest prefetch: it changes in place)
            _rloader_layout_prefetch=policy.PREFETCH_MAX if self._prefetch.auto else prefetch,
            persistent_workers=self._persistent and workers > 0,
            in_order=True,
            worker_type=kind,
            timeout=loader.timeout,
        )
        created = measure.clock()
        with warnings.catch_warnings():
            if not self._first_engine:  # torch's warnings (pin_memory's) once per epoch
                warnings.simplefilter("ignore")
            it = self._make_engine(view, segment, self._base_seed, kind)
        self._first_engine = False
        engine = Engine(it, workers, kind, segment)
        engine.prefetch = prefetch if workers else 0
        engine.e_from = self._tally.mark()
        if workers > 0:
            # its start, measured: this (the consumer waits for the pool's creation), then
            # the consumer's waits for its first round of batches (``_next``)
            engine.start_s = measure.clock() - created
        self._engines.append(engine)
        self._stats.live.append(engine)
        learned = self._learned
        learned.workers = workers
        if workers > 0:
            learned.kind = kind  # chosen once: it never changes within an epoch
        self._stats.workers, self._stats.kind = workers, kind
        self._stats.prefetch = engine.prefetch or None
        if kind == "process" and learned.kind_why is not None:
            why, learned.kind_why = f"{why}; processes: {learned.kind_why}", None
        self._record(workers, kind, why, window)
        self._tally.scale = 1
        self._window_reset()

    def _record(
        self, workers: int, kind: str, why: str, window: Optional[policy.Window] = None
    ) -> None:
        taken = self._progress[0]
        entry = dict(
            at_s=round(measure.clock() - self._started_at, 6),
            batch=taken,
            num_workers=workers,
            worker_type=kind,
            prefetch_factor=self._prefetch.factor if workers else None,
            reason=why,
        )
        if window is not None:
            entry["window"] = window._asdict()
        self._stats.decisions.append(entry)
        log.debug("rloader auto: %d %s workers from batch %d: %s", workers, kind, taken, why)

    def _retire(self, engine: Engine) -> None:
        """An engine whose segment was closed has handed out all it drew."""
        self._engines.remove(engine)
        self._stats.live.remove(engine)
        now = stages(engine.it._stats.as_dict())
        for k in STAGES:
            self._stats.done[k] += now[k] - engine.stages[k]
        self._taken_done += engine.handed
        engine.stop()

    # -- measuring ------------------------------------------------------------------------

    def _window_reset(self) -> None:
        self._tally.reset(self._engines[-1] if self._engines else None)

    def _warm_batches(self, engine: Engine) -> int:
        if engine.workers:
            return engine.workers * engine.prefetch
        epoch = self._epoch_batches()
        if epoch is not None and epoch < policy.MIN_WINDOW + policy.MAIN_WARM_BATCHES:
            return 0  # an epoch too short for both: its window counts every batch
        return policy.MAIN_WARM_BATCHES

    def _epoch_batches(self) -> Optional[int]:
        if self._iterable:
            return None
        try:
            return len(self._loader._index_sampler)
        except TypeError:
            return None

    def _remaining(self) -> Optional[int]:
        if self._iterable:
            return None
        try:
            return len(self._loader._index_sampler) - self._progress[0]
        except TypeError:
            return None

    # -- handing out ----------------------------------------------------------------------

    def __next__(self):
        own = self._stats.own
        self._tally.stepped(measure.clock())
        own.next_called()
        handed = False
        try:
            batch = self._next()
            handed = True
            return batch
        finally:
            own.next_returned(handed)
            now = measure.clock()
            if handed:
                if self._tally.batches == 0:
                    self._prefetch.measure(batch)
                self._tally.handed(now)

    def _next(self):
        tally = self._tally
        while True:
            if self._closed or not self._engines:
                self._finished = True
                raise StopIteration
            decided = measure.clock()
            self._decide()
            if tally.started < decided:
                # (the consumer waits for this bookkeeping too, and for the GIL it takes back
                # from busy thread workers after each read of /proc: its own time, a pool's
                # loop is measured with it; not where a window began in it)
                tally.user += measure.clock() - decided
            engine = self._engines[0]
            in_process = engine.workers == 0
            probe = self._gil.start() if in_process else None
            if in_process:
                cpu0, core_wait0 = measure.loading_clock()
            wall0 = measure.clock()
            try:
                # (only this is the consumer's wait for data to a decision: this iterator's own
                # bookkeeping, a switch, a retired pool's stop are not what a pool can change)
                batch = GilProbeSession.loading(engine, probe)
            except StopIteration:
                if len(self._engines) > 1 or (engine.segment is not None and engine.segment.closed):
                    self._retire(engine)
                    continue
                self._end_epoch()
                raise
            finally:
                waited = measure.clock() - wall0
                tally.waited(waited)
                if in_process:
                    cpu, core_wait = measure.loading_clock()
                    tally.loaded(waited, cpu - cpu0, core_wait - core_wait0)
                elif engine.start_s is not None:
                    self._measure_start(engine, waited)
            return batch

    def _measure_start(self, engine: Engine, waited: float) -> None:
        """A new pool's start: its creation and the consumer's waits for its first round."""
        engine.start_s += waited
        if engine.it._progress[0] >= self._warm_batches(engine):
            self._learned.start_s[engine.kind] = engine.start_s / engine.workers
            engine.start_s = None
            # (this batch is counted in the epoch's after this returns)
            tally = self._tally
            engine.warm_from = (tally.e_batches + 1, tally.e_wait, tally.e_user)

    def _end_epoch(self) -> None:
        self._finished = True
        self._gil.stop()
        learned = self._learned
        first_end = not self._finished_before
        if not self._finished_before:
            self._finished_before = True
            self._last_window()
            learned.epochs += 1
            if learned.deferred is not None and learned.deferred > learned.workers:
                learned.workers = learned.deferred  # the next epoch starts on that pool
                self._stats.next_workers = learned.deferred
            learned.deferred = None
        self._choice.gil_check(self._engines[-1] if self._engines else None)
        if first_end:
            self._choice.trial(self._engines)
        if self._iterable and self._engines and self._tally.batches:
            engine = self._engines[-1]
            window = self._window(engine)._replace(remaining=None)
            decision = policy.decide(window)
            if decision is not None and decision.no_gain and self._choice.no_gain(engine, window):
                decision = None  # as many processes
            learned.wanted = decision.workers if decision else engine.workers
        if self._stats.next_kind is not None:
            learned.kind = self._stats.next_kind
        if not self._persistent:
            for engine in self._engines:
                engine.stop()
        elif self._hold is not None:
            self._hold = None  # (the loader, if anyone holds it, holds this iterator)
