"""``num_workers="auto"``: the loader chooses its workers' number (and, with
``worker_type="auto"``, their kind) from what it measures, and keeps choosing.

NOTE [Auto workers]: what the user sees is a fixed loader's stream; only the engines behind it
change.

- One stream. ``iter()`` makes the epoch's draws as a fixed loader does (the index sampler's
  iterator, then the workers' base seed, then a resume's skip: ``start``), once. The epoch's
  keys are one ``_Source``; each engine (the single-process ``LoaderIter``, a process pool's
  ``PoolIter``/``PinnedBatches`` or a ``ThreadIter``) draws from it through a share of its own
  (a ``KeySegment``, taken in Rust as the stream itself is, or a ``_Segment`` of a Python
  sampler's keys: 2 processes over tensor pairs ran 0.87x a fixed pool when each batch's keys
  went through Python, 0.95x since). To change the pool, ``AutoIter`` closes the current
  engine's share (it draws nothing more: to it the sampler has ended) and starts the next
  engine on a new share of the same source. Engines are handed out from in start order, each
  to its end: the old one's in-flight batches come first, then the new one's, which were
  drawn after them. So the batches,
  their order and contents are those of any fixed loader over the same sampler stream, with
  every engine's batches handed out in order (``in_order=False`` is not used under auto).
  Where the old pool and the new one together would exceed the memory budget, the old one is
  drained first (``_drain``: its in-flight batches are taken into ``_Engine.drained`` and
  its workers stopped before the new pool starts), so the budget holds during the switch
  too; the batches are handed out from there in order, and an error among them is raised
  in its place (then the old pool's workers, not stopped, serve the rest). ``_progress``
  counts what the consumer was handed, not what was drained (``state_dict()``).
- Seeds. The base seed is drawn once per iterator (a fixed loader's draw) and every pool of the
  iterator starts its workers with it: worker ``i`` of any pool gets torch's seed
  ``base_seed + i``, runs ``worker_init_fn(i)``, and ``get_worker_info()`` says that pool's
  ``num_workers``. A worker's dataset copy lives as long as its pool.
- Decisions (``decide``, a pure function of a ``Window`` of measurements, in _auto_policy.py
  with the numbers it decides by; what is read from /proc and the clocks is in
  _auto_measure.py): the consumer's time
  per batch outside ``next()`` (``user``, with this iterator's own bookkeeping: ``_decide``
  reads /proc, and with busy thread workers each read gives the GIL away for up to the switch
  interval: uncounted, 2 pure-Python threads measured 0.42 ms a batch and ran at 0.67) and
  inside it (``wait``), the loader's work per batch
  (fetch + collate + pin, summed over workers: ``work``), and in the main process the CPU time
  of that work (``cpu``). In process: workers once the work per batch is worth moving (at least
  ``MIN_WORK_S`` and ``MIN_WAIT_SHARE`` of the consumer's loop), as many as ``work / user``
  asks (× ``HEADROOM``). In a pool: grow when the consumer waits more than ``GROW_WAIT_SHARE`` of
  its loop and the workers are busy; shrink when it (nearly) never waits and ``work / user`` asks
  for at most ``SHRINK_RATIO`` of the pool, and not back to a count that grew because the
  consumer waited on it while ``work / user`` is what it was then (``Window.waited``: uneven
  steps read as idle in a window of long ones) (hysteresis: the gap between the two thresholds, a
  window of at least ``2 × workers × prefetch_factor`` batches and ``LONG_STEPS`` of the
  consumer's longest step, which starts only once a new
  pool has handed out its first round of batches and the old one has drained, so start-up
  does not read as waiting; turning back (a shrink after a growth, or the other
  way) needs a window twice as long, and a pool grown back after its workers idled is the
  least they may shrink it to (``_floor``, after an idle shrink only; a shrink below it
  stops at it); growth at most ×2 per step so the memory of each
  step is measured before the next). The main process's windows start after its first
  ``MAIN_WARM_BATCHES`` batches (they fill new batch memory: 2-3 ms against 0.3 ms for uint8
  [3, 224, 224] × 64), unless the epoch is too short to leave a window after them.
  Back to the main process: a pool at its cap whose consumer still waits and whose loop per
  batch is above ``NO_GAIN`` × the main process's (its transport costs what it moves off,
  its threads take turns on the GIL, or it shares the cores with the consumer); not a pool
  of processes whose work per batch is above ``WARM_WORK`` × the main process's (they are
  still copying the pages they touch after the fork, or are descheduled), nor one that has
  not made an epoch's batches yet (``Window.pool_batches``: its first epoch is a start's);
  a fresh pool that served a whole epoch is judged on it at its end (``_whole_epoch``). Not while
  other processes used more than ``OTHERS_MAX`` cores during the window (``machine_cpu``
  less ``loader_cpu``, from /proc's 10 ms ticks, so such a window goes on for
  ``NO_GAIN_WINDOW_S``): the machine's load, not the pool, may have slowed it (2 processes
  of pure Python measured no faster than the main process while another program kept a core
  busy). Remembered for its kind (``_no_gain``): the main process starts none again until
  it would be clearly faster (``RETRY_SHARE``) or for 2 epochs, then 4, 8 (a busy machine
  may have made it look slow). An epoch's last window judges so only if it covers the pool's
  whole epoch or ``NO_GAIN_WINDOW_S`` (not a short tail after earlier windows). A pool whose
  consumer never waits shrinks to none when the main process's work per batch is under
  ``MIN_WAIT_SHARE`` of the loop.
  Bounds: the usable cores
  (``os.sched_getaffinity``; threads that mostly wait may outnumber them, unless other
  processes used ``BUSY_OTHERS`` cores during the window: then a low CPU share may be this
  process's descheduling: 10 threads for token windows from a memmap, 0.2 ms of work a
  batch, while another program ran), the memory budget
  (``RLOADER_AUTO_MAX_MEMORY``, else half of MemAvailable, against each worker's measured
  PSS, read on a thread of its own: ``_MemoryProbe``; before a measurement, this process's RSS
  per worker), and the work left in the epoch
  (no more workers than the batches left fill twice over their prefetch window, and no new
  pool whose start the rest of the epoch would not win back (``saved_per_batch``: the wait
  it would leave is the work spread over its workers less the consumer's step); from the
  next epoch on, if a whole epoch would, or ``PAYBACK_EPOCHS`` epochs for persistent
  workers). A start per
  worker is measured (``_measure_start``: the pool's creation, which the consumer waits for,
  and the consumer's waits for its first round), per kind; before a measurement it is
  estimated (``start_cost``: ``PROCESS_START_S`` plus ``PROCESS_START_PER_GIB`` per GiB of
  this process's RSS, which fork's page tables grow with; ``THREAD_START_S``).
- Kind (``worker_type="auto"``): the main process's loading is probed first (``GilProbe``,
  rloader-workers' gil_probe.rs: a thread that asks for the GIL while the main process loads
  and times its waits; ``_probe_gil``): loading in which a second thread could not take the
  GIL (``GIL_HELD`` of the probe's time, over ``GIL_PROBE_S`` of loading, read at a quiet
  window) starts processes; the window that would start the first pool goes on up to
  ``GIL_PROBE_WAIT_S`` for that much loading. The probe stops before any pool starts (its
  thread is not forked into workers) and at the epoch's end. Loading that holds its CPU
  (``holds_cpu``, read once the probe had its say: ``_probed``) starts processes too, where 2
  would win their start back (over the epoch's batches; an iterable dataset's, once its first
  epoch ended) (the probe does not see the cost of the GIL's hand-overs, which such loading
  pays on threads). Else threads first (loading that waits; they start at once). The CPU share
  is this process's (``process_time``): a busy thread of the user's beside the loading counts
  as the loading's. A busy thread pool's work
  per batch is compared with the main process's alone (``inflation``): threads that take turns
  on the GIL each take about their number times longer. Above ``GIL_SHARE`` × their number, the
  next epoch's pools are processes (``_gil_check``, at the epoch's end). A thread pool short of
  ``THREAD_EFFICIENCY`` of the speedup its number (up to the cores) promises over the main
  process's loop, whose work holds its CPU (share at least ``WAITING_SHARE``) and whose process
  used at most ``GIL_CORES`` cores (more: the threads ran side by side, and are judged as
  processes are, against ``NO_GAIN``), serves to the epoch's end and the next epoch's pool is
  one of processes (``_processes_next``); else it is kept if below ``NO_GAIN`` × the main
  process's loop, or back to the main process (``_no_gain``). Either way to processes only if
  they could win their start back (``_processes_affordable``: an epoch, or ``PAYBACK_EPOCHS`` if
  persistent). A busy thread pool that served a whole epoch, not its first, short of the speedup
  its number promises is followed by one epoch of as many processes, and the kind whose epoch
  had the shorter loop per batch is kept (``_kind_trial``: once per loader; no GIL verdict after
  it). Threads beside which the consumer's median step grew by ``CONSUMER_GIL`` took the GIL
  from it: processes next (``_slows_the_consumer``). (A batch shorter than the interpreter's
  switch interval runs on one thread's turn at the GIL: its work per batch is not inflated, only
  the throughput is not higher.) The kind changes only between epochs. The main process's CPU
  share of the work bounds how many threads the cores carry (threads that mostly wait may
  outnumber them).
- Between epochs the loader's record keeps what was learned (``Learned``): the next epoch starts
  on the last chosen pool at once, without the in-process start, or on what the epoch's last
  window asked for (``_last_window``) or a first-epoch decision deferred. With
  ``persistent_workers`` the last pool itself is kept (``_reset``). ``state_dict()`` saves
  what was learned of the choice (``learned_state``): a resumed loader starts there.
- An ``IterableDataset`` shards by worker id and count, so its epoch keeps one engine: the first
  epoch runs in the main process (torch's default, ``num_workers=0``) and measures; each later
  epoch starts with the count the previous one asked for.
- ``prefetch_factor="auto"`` (``_tune_prefetch``, ``decide_prefetch``): a pool whose consumer
  waits though its workers keep up on average (uneven batches or steps) takes more batches
  ahead, doubling up to ``PREFETCH_MAX``, before it grows; within the budget (batches in
  flight × a batch's measured bytes). In place: the engine's scheduler changes its bound
  (``Scheduler::set_prefetch_factor``, rloader-workers), and a process pool's region has
  slots for ``PREFETCH_MAX`` from its start; pinned process pools keep theirs (the next pool
  takes the new one).
"""

from __future__ import annotations

import collections
import logging
import statistics
import warnings
import weakref
from typing import Any, NamedTuple, Optional

from torch.utils.data.dataloader import _DatasetKind

from . import _auto_measure as measure
from . import _auto_policy as policy
from . import _resume, _rloader
from ._loader_record import record_of
from ._seed import draw_seed
from .sampler import iter_keys

__all__ = ["AutoPrefetch", "AutoWorkers", "is_auto", "start"]

log = logging.getLogger("rloader")

AUTO = "auto"


class _AutoInt(int):
    """An ``int`` attribute of an auto loader: code that compares or formats it (torch's
    checks, Lightning's) sees a number, and a loader rebuilt from its attributes is auto
    again."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    __str__ = __repr__


class AutoWorkers(_AutoInt):
    """``loader.num_workers`` of a loader built with ``num_workers="auto"``: the usable cores,
    what auto starts for work that keeps them busy."""

    def __new__(cls, cap: Optional[int] = None) -> "AutoWorkers":
        return super().__new__(cls, measure.usable_cores() if cap is None else cap)


class AutoPrefetch(_AutoInt):
    """``loader.prefetch_factor`` of a loader built with ``prefetch_factor="auto"`` and
    ``num_workers="auto"``: where the tuning starts, torch's default 2."""

    def __new__(cls) -> "AutoPrefetch":
        return super().__new__(cls, policy.PREFETCH)


def is_auto(value: Any) -> bool:
    return isinstance(value, _AutoInt) or (isinstance(value, str) and value == AUTO)


# -- the iterator ---------------------------------------------------------------------------


class Learned:
    """What a loader's auto iterators learned, kept between epochs in its record."""

    def __init__(self) -> None:
        self.workers = 0
        self.kind: Optional[str] = None
        self.cpu_share: Optional[float] = None
        self.base_work: Optional[float] = None  # seconds of work per batch in the main process
        self.main_loop: Optional[float] = None  # the consumer's loop per batch there
        self.main_step: Optional[float] = None  # ... and its median step (``CONSUMER_GIL``)
        self.no_gain: dict = {}  # kind: (a pool's loop per batch, found no faster; epochs)
        self.no_gain_epochs: dict = {}  # kind: epochs a no_gain entry holds
        self.start_s: dict = {}  # kind: measured seconds to start one worker of that kind
        self.per_worker: Optional[int] = None
        self.wanted: Optional[int] = None  # what the last window asked for (iterable datasets)
        self.deferred: Optional[int] = None  # a pool asked for from the next epoch on
        self.prefetch: Optional[int] = None  # prefetch_factor="auto": the last chosen
        self.floor: Optional[tuple] = None  # (workers, epoch, clock()): ``AutoIter._floor``
        self.waited: dict = {}  # kind: (workers, work / user) where it grew (``Window.waited``)
        self.direction = 0  # of the last switch: 1 grew, -1 shrank
        self.idle_shrink = False  # ... and whether it was a shrink because the workers idled
        self.epochs = 0  # epochs ended
        # worker_type="auto": processes on trial after a thread pool (``AutoIter._kind_trial``):
        # (the threads' number, their epoch's loop per batch); and whether one was made
        self.trial: Optional[tuple] = None
        self.tried = False
        # worker_type="auto": the GIL probe's (seconds blocked, its seconds observed, seconds of
        # loading) in the main process (``AutoIter._probe_gil``), while the kind was undecided
        self.gil: Optional[tuple] = None
        self.kind_why: Optional[str] = None  # why the probe chose processes (for the first pool)


def learned_of(loader) -> Learned:
    record = record_of(loader)
    if record.auto is None:
        record.auto = Learned()
    return record.auto


class _Source:
    """The epoch's keys, drawn once, in order, whichever engine draws them: each engine draws
    through a share of its own (``segment()``), which the next engine's follows. An rloader
    ``BatchStream``'s shares are ``KeySegment``s, which the engines take in Rust (no Python
    list of keys per batch); any other sampler's are ``_Segment``s."""

    def __init__(self, keys) -> None:
        self.stream = keys if isinstance(keys, _rloader.BatchStream) else None
        self.keys = iter(keys) if self.stream is None else None
        self._exhausted = False

    @property
    def exhausted(self) -> bool:
        return self.stream.exhausted if self.stream is not None else self._exhausted

    def segment(self):
        if self.stream is not None:
            return _rloader.KeySegment(self.stream)
        return _Segment(self)

    def __next__(self):
        try:
            return next(self.keys)
        except StopIteration:
            self._exhausted = True
            raise


class _Segment:
    """One engine's share of a Python sampler's keys: ends when the source does or when
    closed (``KeySegment``'s twin)."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __iter__(self) -> "_Segment":
        return self

    def __next__(self):
        if self.closed:
            raise StopIteration
        return next(self.source)


class _EngineView:
    """The loader as one engine sees it: its attributes, but the engine's worker count, kind,
    prefetch, persistence and order."""

    def __init__(self, loader, **overrides) -> None:
        self.__dict__["_loader_ref"] = weakref.ref(loader)  # (NOTE in AutoIter.__init__)
        self.__dict__.update(overrides)

    @property
    def _loader(self):
        return self.__dict__["_loader_ref"]()

    # The loader whose record a pool keeps its shared memory in (start_pool): a stopped pool's
    # region serves the loader's next pool.
    _rloader_owner = _loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _Engine:
    def __init__(self, it, workers: int, kind: str, segment: Any) -> None:
        self.it = it
        self.workers = workers
        self.kind = kind
        self.segment = segment
        self.stages = _stages(it._stats.as_dict())  # at the start: subtracted from later reads
        self.window_start = dict(self.stages)
        self.memory_due = 0.0  # when its workers' memory is read next (clock())
        self.warm = False  # has handed out its first round (``AutoIter._decide``)
        self.start_s: Optional[float] = None  # its start, while measured (``AutoIter._next``)
        # Its in-flight batches, taken before its workers were stopped (``AutoIter._drain``),
        # and whether that took all it drew (else an error ended the taking: the rest follows).
        self.drained: Optional[collections.deque] = None
        self.exhausted = False
        self.first_window = True  # its windows this epoch have not ended yet (``_last_window``)
        self.prefetch = 0  # its batches in flight per worker (0: the main process)
        self.prefetch_fixed = False  # its prefetch cannot change in place (``_tune_prefetch``)
        self.lived = 0  # batches it handed out in the epochs before this one
        self.e_from = (0, 0.0, 0.0)  # the epoch's (batches, wait, user) as it began serving
        self.warm_from: Optional[tuple] = None  # ... once its first round was handed out

    def next(self):
        """Its next batch: the drained ones first."""
        if self.drained:
            item = self.drained.popleft()
            if isinstance(item, _Raised):
                raise item.error
            return item
        if self.exhausted:
            raise StopIteration
        return next(self.it)

    @property
    def handed(self) -> int:
        """Batches it has handed out to the consumer."""
        return self.it._progress[0] - len(self.drained or ())

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


class _Raised(NamedTuple):
    error: BaseException


_STAGES = ("fetch_s", "collate_s", "transport_s", "pin_s")


def _stages(d: dict) -> dict:
    return {k: d[k] for k in _STAGES}


class AutoStats:
    """``loader.stats()`` of an auto iterator: the consumer's times, measured here; the stages,
    summed over the epoch's engines; and ``auto``: the choices, when and why."""

    def __init__(self) -> None:
        self.own = _rloader.Stats()
        self.done = dict.fromkeys(_STAGES, 0.0)  # of engines that have ended
        self.live: list = []
        self.decisions: list = []
        self.workers = 0
        self.kind = "process"
        self.prefetch: Optional[int] = None  # the pools' prefetch_factor
        self.next_kind: Optional[str] = None  # set when the next epoch changes the kind
        self.next_workers: Optional[int] = None  # a pool the next epoch starts on (deferred)
        self.learned: Optional[Learned] = None  # its loader's (the GIL probe's figures)

    def as_dict(self) -> dict:
        out = self.own.as_dict()
        totals = dict(self.done)
        for engine in self.live:
            now = _stages(engine.it._stats.as_dict())
            for k in _STAGES:
                totals[k] += now[k] - engine.stages[k]
        out.update(totals)
        gil = self.learned.gil if self.learned is not None else None
        out["auto"] = dict(
            num_workers=self.workers,
            worker_type=self.kind,
            prefetch_factor=self.prefetch,
            next_worker_type=self.next_kind,
            next_num_workers=self.next_workers,
            # (the share of the main process's loading in which a second thread could not take
            # the GIL, and the seconds probed; None: not probed)
            gil_blocked=None if gil is None else round(gil[0] / gil[1], 4),
            gil_probed_s=None if gil is None else round(gil[2], 6),
            decisions=[dict(d) for d in self.decisions],
        )
        return out

    def clear(self) -> None:
        self.own.clear()
        self.done = dict.fromkeys(_STAGES, 0.0)
        for engine in self.live:
            engine.stages = _stages(engine.it._stats.as_dict())
        self.decisions = []
        self.next_kind = self.next_workers = None


def next_kind(worker_type: str, learned: Learned) -> str:
    """The kind of a loader's next pool: the user's, the one auto chose (processes where the
    GIL probe found the main process's loading holding the GIL, or where that loading holds
    its CPU: ``AutoIter._probe_gil``), or threads first (they start at once; a thread pool
    measures what the probe cannot: the GIL's hand-overs, ``AutoIter._gil_check``)."""
    if worker_type != AUTO:
        return worker_type
    return learned.kind if learned.kind is not None else "thread"


def stream_readers(loader, pending: Optional[dict] = None) -> tuple:
    """Who reads an auto loader's IterableDataset in the epoch that starts: ``(num_workers,
    kind)``, kind "main", "process" or "thread" (its epoch keeps one engine: NOTE [Auto
    workers]). A resume's (``pending``) saved epoch is read by those that read it (its stream
    depends on their number; per-worker states need processes); else what the last epoch
    asked for (``Learned.wanted``)."""
    if pending is not None:
        workers, saved = pending.get("workers"), pending.get("readers")
        if saved is not None:
            n = int(saved[0])
            if n == 0:
                return 0, "main"
            kind = worker_type_of(loader)
            return n, (str(saved[1]) if kind == AUTO else kind)
        # (a state saved before readers were)
        if workers is not None:
            return int(workers["num_workers"]), "process"  # their datasets' places
        if pending.get("position") is not None and "dataset" in pending:
            return 0, "main"  # num_workers=0's
    learned = learned_of(loader)
    n = learned.wanted if learned.wanted is not None else learned.workers
    return n, (next_kind(worker_type_of(loader), learned) if n else "main")


def learned_state(loader) -> dict:
    """What an auto loader has chosen, for its ``state_dict()``: a resumed loader starts from
    it (``seed_learned``) instead of the main process."""
    learned = learned_of(loader)
    return dict(
        workers=int(learned.workers),
        kind=learned.kind,
        wanted=learned.wanted,
        prefetch=learned.prefetch,
        # processes on trial (``AutoIter._kind_trial``): the threads' (number, loop per batch)
        trial=None if learned.trial is None else [int(learned.trial[0]), float(learned.trial[1])],
        tried=bool(learned.tried),
    )


def seed_learned(loader, saved: Optional[dict]) -> None:
    """``load_state_dict()`` of an auto loader that has not run yet: it starts on the saved
    loader's choices (the next epoch of an IterableDataset is read as the saved loader asked;
    a map-style one's pool starts at once), and goes on measuring."""
    record = record_of(loader)
    if saved is None or record.auto is not None:
        return  # (a loader that has run keeps what it learned)
    learned = learned_of(loader)
    learned.kind = saved["kind"]
    # (within what this machine's cores carry: the saving one may have had more)
    most = measure.usable_cores() * (
        policy.THREADS_PER_CORE if saved["kind"] == "thread" else policy.PROCESSES_PER_CORE
    )
    learned.workers = min(int(saved["workers"]), most)
    learned.wanted = None if saved["wanted"] is None else min(int(saved["wanted"]), most)
    if is_auto(loader.prefetch_factor) and saved["prefetch"] is not None:
        learned.prefetch = max(policy.PREFETCH, min(int(saved["prefetch"]), policy.PREFETCH_MAX))
    trial = saved.get("trial")
    learned.trial = None if trial is None else (min(int(trial[0]), most), float(trial[1]))
    learned.tried = bool(saved.get("tried", False))


def worker_type_of(loader) -> str:
    return getattr(loader, "worker_type", "process")


def start(loader) -> "AutoIter":
    """``iter()`` of an auto loader: the epoch's draws, in a fixed loader's order (the index
    sampler's iterator, the base seed, a resume's skip), then the iterator."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    base_seed = draw_seed(loader.generator)
    keys = _resume.epoch_of(loader).keys(keys)
    return AutoIter(loader, keys, base_seed)


class AutoIter:
    """The iterator of a ``num_workers="auto"`` loader (NOTE [Auto workers])."""

    def __init__(self, loader, keys, base_seed: int) -> None:
        # Weakly: a persistent loader holds its iterator, and a cycle would keep a dropped
        # loader's workers alive until the garbage collector runs.
        self._loader_ref = weakref.ref(loader)
        self._iterable = loader._dataset_kind == _DatasetKind.Iterable
        self._base_seed = base_seed
        self._learned = learned_of(loader)
        self._persistent = bool(loader.persistent_workers)
        self._kind_fixed = loader.worker_type if loader.worker_type != AUTO else None
        self._prefetch_auto = is_auto(loader.prefetch_factor)
        if self._prefetch_auto:
            self._prefetch = self._learned.prefetch or policy.PREFETCH
        else:
            self._prefetch = loader.prefetch_factor or policy.PREFETCH
        self._batch_bytes: Optional[int] = None  # measured at each window's first batch
        self._cores = measure.usable_cores()
        self._budget = measure.memory_budget()
        self._stats = AutoStats()
        self._stats.learned = self._learned
        self._probe: Optional[Any] = None  # the GIL probe (``_probe_gil``), while it runs
        self._engines: list = []  # in hand-out order; the last draws the keys
        self._taken_done = 0  # batches handed out by engines that have ended
        self._finished = False
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
        self._stop_probe()
        engines, self._engines = self._engines, []
        for engine in engines:
            engine.stop()
        self._stats.live = []

    def _reset(self, keys, reported_len=None) -> None:
        """A new epoch with persistent workers: the last engine is kept."""
        self._begin_epoch(keys, reported_len)

    # -- epochs and engines --------------------------------------------------------------

    def _begin_epoch(self, keys, reported_len) -> None:
        self._started_at = measure.clock()
        self._first_engine = True  # (torch's warnings once per epoch)
        self._stats.clear()
        self._taken_done = 0
        self._handed_at = None  # (a gap between epochs is not the consumer's step)
        self._e_batches, self._e_wait, self._e_user = 0, 0.0, 0.0  # the epoch's (_whole_epoch)
        self._finished = self._finished_before = False
        self._source = None if self._iterable else _Source(keys)
        self._window_reset()
        learned = self._learned
        kept = self._engines[-1] if self._engines else None
        for engine in self._engines[:-1]:
            engine.stop()
        self._engines = []
        self._stats.live = []
        if self._iterable:
            # (chosen as the epoch began, ``stream_readers``: a resume's may be its saved ones)
            workers, kind = _resume.epoch_of(self._loader).readers
            if self._keeps(kept, workers, kind):
                self._keep(kept, None, reported_len)
            else:
                if kept is not None:
                    kept.stop()
                why = "the previous epoch's measurements" if workers else "start"
                self._switch(workers, why, kind=kind)
            return
        workers = learned.workers
        if self._keeps(kept, workers):
            self._keep(kept, self._source.segment(), reported_len)
        else:
            if kept is not None:
                kept.stop()
            self._switch(workers, "the previous epoch's choice" if workers else "start")

    def _keeps(self, kept: Optional[_Engine], workers: int, kind: Optional[str] = None) -> bool:
        """Whether the last epoch's pool (persistent workers) is the one this epoch starts on."""
        kind = kind or self._kind()
        return (
            kept is not None
            and workers > 0
            and (kept.workers, kept.kind, kept.prefetch) == (workers, kind, self._prefetch)
        )

    def _keeps_pool(self, workers: int, kind: str) -> bool:
        """Whether the next epoch, read by ``workers`` of ``kind``, goes on with this
        iterator's persistent pool (``state_dict()`` between epochs saves its workers' places
        then)."""
        kept = self._engines[-1] if self._engines and not self.stopped else None
        return self._keeps(kept, workers, kind)

    def _keep(self, engine: _Engine, segment: Any, reported_len) -> None:
        engine.lived += engine.handed
        engine.it._reset(segment, reported_len)
        engine.segment = segment
        engine.warm = True  # its workers run, and _reset sent the first tasks
        engine.start_s = None  # (no start to measure)
        engine.drained, engine.exhausted = None, False  # (the last engine is never drained)
        engine.first_window = True
        engine.stages = _stages(engine.it._stats.as_dict())
        engine.window_start = dict(engine.stages)
        engine.e_from = (self._e_batches, self._e_wait, self._e_user)
        engine.warm_from = None  # (no start this epoch)
        self._engines.append(engine)
        self._stats.live.append(engine)
        self._stats.prefetch = engine.prefetch or None
        self._record(engine.workers, engine.kind, "kept (persistent workers)")

    def _kind(self) -> str:
        """The kind of the next pool (``next_kind``)."""
        return next_kind(self._kind_fixed or AUTO, self._learned)

    def _switch(
        self,
        workers: int,
        why: str,
        window: Optional[policy.Window] = None,
        kind: Optional[str] = None,
    ) -> None:
        """Starts the engine of ``workers`` workers (of ``kind``, else ``_kind()``) on the rest
        of the stream; the current one draws nothing more and hands out what it has (NOTE
        [Auto workers])."""
        loader = self._loader
        if workers > 0:
            self._stop_probe()  # (its thread is not forked into the workers)
        if self._engines and self._engines[-1].segment is not None:
            self._engines[-1].segment.close()
        segment = None if self._iterable else self._source.segment()
        kind = (kind or self._kind()) if workers > 0 else "main"  # (the main process)
        old = self._engines[-1] if self._engines else None
        if old is not None and old.workers and workers and old.drained is None:
            if (old.workers + workers) * self._per_worker(kind) > self._budget:
                self._drain(old)  # the two pools together would exceed the memory budget
        view = _EngineView(
            loader,
            num_workers=workers,
            prefetch_factor=self._prefetch if workers > 0 else None,
            # (a tuned pool's region has slots for the deepest prefetch: it changes in place)
            _rloader_layout_prefetch=policy.PREFETCH_MAX if self._prefetch_auto else self._prefetch,
            persistent_workers=self._persistent and workers > 0,
            in_order=True,
            worker_type=kind,
            timeout=loader.timeout,
        )
        from . import dataloader  # (imports this module)

        created = measure.clock()
        with warnings.catch_warnings():
            if not self._first_engine:  # torch's warnings (pin_memory's) once per epoch
                warnings.simplefilter("ignore")
            it = dataloader._engine(view, segment, self._base_seed, kind)
        self._first_engine = False
        engine = _Engine(it, workers, kind, segment)
        engine.prefetch = self._prefetch if workers else 0
        engine.e_from = (self._e_batches, self._e_wait, self._e_user)
        if workers > 0:
            # its start, measured: this (the consumer waits for the pool's creation), then
            # the consumer's waits for its first round of batches (``_next``)
            engine.start_s = measure.clock() - created
        self._engines.append(engine)
        self._stats.live.append(engine)
        self._learned.workers = workers
        if workers > 0:
            self._learned.kind = kind  # chosen once: it never changes within an epoch
        self._stats.workers, self._stats.kind = workers, kind
        self._stats.prefetch = engine.prefetch or None
        if kind == "process" and self._learned.kind_why is not None:
            why, self._learned.kind_why = f"{why}; processes: {self._learned.kind_why}", None
        self._record(workers, kind, why, window)
        self._w_scale = 1
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
            prefetch_factor=self._prefetch if workers else None,
            reason=why,
        )
        if window is not None:
            entry["window"] = window._asdict()
        self._stats.decisions.append(entry)
        log.debug("rloader auto: %d %s workers from batch %d: %s", workers, kind, taken, why)

    # -- measuring ------------------------------------------------------------------------

    _w_longest = 0.0  # the consumer's longest step in the window
    _w_steps: list  # the consumer's steps in the window (their median: Window.step)
    _longest = 0.0  # ... in the last window (``LONG_STEPS``)
    _w_batches = 0
    _w_scale = 1  # windows are this many times the shortest (``STEADY_GROWTH``)

    def _window_reset(self) -> None:
        if self._w_batches:
            self._longest = self._w_longest
        self._w_longest = 0.0
        self._w_batches = 0
        self._w_wait = self._w_user = self._w_work = self._w_cpu = 0.0
        self._w_steps = []
        self._w_started = measure.clock()
        self._w_process_cpu = measure.cpu_clock()
        self._w_load = None
        self._w_hold_s = 0.0  # a window that goes on is looked at again after this long
        self._w_hold_batches = 0  # ... and this many batches
        if self._engines:
            engine = self._engines[-1]
            engine.window_start = _stages(engine.it._stats.as_dict())
            self._w_load = self._load(engine)

    def _load(self, engine: _Engine) -> tuple:
        """(wall, the machine's CPU, this loader's CPU) now (``Window.others``)."""
        return (
            measure.clock(),
            measure.machine_cpu(),
            measure.loader_cpu(measure.worker_pids(engine.it)),
        )

    def _others(self, engine: _Engine) -> Optional[float]:
        """Cores other processes used since the window began (None: unknown)."""
        if self._w_load is None:
            return None
        wall0, machine0, own0 = self._w_load
        wall, machine, own = self._load(engine)
        if machine is None or machine0 is None or wall - wall0 < 0.8 * policy.MIN_WINDOW_S:
            return None  # (too few ticks to tell)
        return max(0.0, (machine - machine0) - (own - own0)) / (wall - wall0)

    def _warm_batches(self, engine: _Engine) -> int:
        if engine.workers:
            return engine.workers * engine.prefetch
        epoch = self._epoch_batches()
        if epoch is not None and epoch < policy.MIN_WINDOW + policy.MAIN_WARM_BATCHES:
            return 0  # an epoch too short for both: its window counts every batch
        return policy.MAIN_WARM_BATCHES

    def _start_cost(self, kind: str) -> float:
        """Seconds to start one worker of ``kind``: the loader's last measured start, else the
        estimate (``start_cost``). For processes the larger of the two: the measured start
        (the pool's creation and its first round) leaves out the pages the workers copy after
        it, which the estimate stands for."""
        measured = self._learned.start_s.get(kind)
        if measured is None:
            return policy.start_cost(kind, measure.own_memory())
        if kind == "process":
            return max(measured, policy.start_cost(kind, measure.own_memory()))
        return measured

    def _no_gain(self, engine: _Engine, window: policy.Window) -> bool:
        """``engine``'s pool was no faster than the main process: remembered for its kind (the
        main process starts none again for a while: ``RETRY_SHARE``).
        Under ``worker_type="auto"``, threads whose work holds its CPU make way for processes
        from the next epoch, if a whole epoch could win their start back; then the threads
        serve to the epoch's end if as fast as the main process (True), else the main
        process does (False)."""
        learned = self._learned
        if self._stats.next_kind == "process" and engine.kind == "thread":
            return True  # (decided at an earlier window)
        loop = (window.wait_s + window.user_s) / max(window.batches, 1)
        if not self._processes_next(engine, window):
            if window.main_loop is not None and loop <= policy.NO_GAIN * window.main_loop:
                return True  # threads somewhat faster than the main process: kept
            retried = engine.kind in learned.no_gain
            learned.no_gain[engine.kind] = (loop, learned.epochs)
            held = learned.no_gain_epochs.get(engine.kind)
            learned.no_gain_epochs[engine.kind] = 2 * held if retried and held else 2
            return False
        learned.no_gain["thread"] = (loop, learned.epochs)
        self._stats.next_kind = "process"  # (``_end_epoch`` makes it the loader's kind)
        log.debug(
            "rloader auto: processes from the next epoch: %d threads were no faster than the "
            "main process (%.2f ms a batch)",
            engine.workers,
            (window.main_loop or 0) * 1e3,
        )
        if window.main_loop is not None and loop * policy.NO_GAIN > window.main_loop:
            # clearly slower than it: the main process serves the rest of the epoch, as many
            # processes start the next
            learned.deferred = engine.workers
            self._stats.next_workers = engine.workers
            return False
        return True

    def _processes_next(self, engine: _Engine, window: policy.Window) -> bool:
        """Whether threads no faster than the main process make way for processes: under
        ``worker_type="auto"``, for work that holds its CPU, if a whole epoch could win their
        start back and processes were not found no faster themselves."""
        learned = self._learned
        if (
            self._kind_fixed is not None
            or engine.kind != "thread"
            or learned.tried  # (measured beside processes: ``_kind_trial``)
            or self._no_gain_loop("process") is not None
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or not learned.base_work
        ):
            return False
        return self._processes_affordable(engine)

    def _processes_affordable(self, engine: Optional[_Engine]) -> bool:
        """Whether as many processes as ``engine`` has threads (at least 2, the least pool that
        spreads the work; None: 2) could win their start back: in an epoch, or
        ``PAYBACK_EPOCHS`` if persistent (the main process's work per batch, spread over them,
        is what they could save)."""
        learned = self._learned
        if not learned.base_work:
            return False
        workers = max(engine.workers if engine is not None else 0, 2)
        batches = self._epoch_batches()
        if batches is None and self._finished:
            batches = self._e_batches  # (an iterable dataset's epoch, once it ended)
        saved = (batches or 0) * learned.base_work * (1 - 1 / workers)
        saved *= policy.payback_epochs(self._persistent)
        return saved >= workers * self._start_cost("process")

    def _no_gain_loop(self, kind: str) -> Optional[float]:
        """The loop per batch of a pool of ``kind`` found no faster, while that holds."""
        learned = self._learned
        entry = learned.no_gain.get(kind)
        if entry is None:
            return None
        loop, epoch = entry
        if learned.epochs - epoch >= learned.no_gain_epochs.get(kind, 1):
            return None
        return loop

    def _window(self, engine: _Engine) -> policy.Window:
        """The current window's measurements (tests replace this)."""
        learned = self._learned
        step = statistics.median(self._w_steps) if self._w_steps else None
        if engine.workers == 0:
            work, cpu = self._w_work, self._w_cpu
            if work > 0 and learned.kind is None:
                learned.cpu_share = cpu / work
            if self._w_batches:
                learned.base_work = work / self._w_batches
                learned.main_loop = (self._w_wait + self._w_user) / self._w_batches
                learned.main_step = step if step is not None else learned.main_step
        else:
            stages = _stages(engine.it._stats.as_dict())
            work = sum(
                stages[k] - engine.window_start[k] for k in ("fetch_s", "collate_s", "pin_s")
            )
            cpu = None if learned.cpu_share is None else learned.cpu_share * work
        now = measure.clock()
        if engine.kind == "process":
            pids = measure.worker_pids(engine.it)
            if now >= engine.memory_due:
                engine.memory_due = now + measure.MEMORY_EVERY_S
                measure.probe.request(pids)  # read on the probe's thread
            measured = measure.probe.latest(pids)
            if measured is not None:
                learned.per_worker = max(learned.per_worker or 0, measured)
        others = self._others(engine)
        # (the GIL measures read only windows the machine's load left alone: other processes'
        # work slows the threads' and the consumer's as taking turns on the GIL would, and
        # deschedules the main process holding the GIL, which the probe reads as held: token
        # windows 0.05 alone, 0.26-0.73 beside 3 busy processes on 2 cores)
        quiet = others is None or others < policy.OTHERS_MAX
        if engine.workers == 0 and quiet:
            self._probe_gil()
        kind = engine.kind if engine.workers else self._kind()
        inflation = None
        busy = self._w_wait > policy.GROW_WAIT_SHARE * (self._w_wait + self._w_user)
        threads = kind == "thread" and engine.workers and quiet
        if threads and learned.base_work and self._w_batches and busy:
            inflation = work / self._w_batches / learned.base_work
            self._inflation = inflation
        if threads and step is not None:
            self._thread_step = step
        return policy.Window(
            batches=self._w_batches,
            wait_s=self._w_wait,
            user_s=self._w_user,
            work_s=work,
            cpu_s=cpu,
            workers=engine.workers,
            kind=kind,
            cores=self._cores,
            budget=self._budget,
            per_worker=self._per_worker(kind),
            remaining=self._remaining(),
            prefetch=engine.prefetch if engine.workers else self._prefetch,
            inflation=inflation,
            first_epoch=learned.epochs == 0,
            epoch_batches=self._epoch_batches(),
            persistent=self._persistent,
            main_loop=learned.main_loop,
            main_work=learned.base_work,
            no_gain=self._no_gain_loop(kind),
            start_s=self._start_cost(kind),
            others=others,
            batch_bytes=self._batch_bytes,
            pool_batches=engine.lived + engine.handed if engine.workers else None,
            waited=learned.waited.get(kind),
            memory_measured=kind != "process" or learned.per_worker is not None,
            process_cores=(measure.cpu_clock() - self._w_process_cpu)
            / max(now - self._w_started, 1e-9),
            step=step,
        )

    _inflation: Optional[float] = None  # the latest busy thread pool's (Window.inflation)
    _thread_step: Optional[float] = None  # the consumer's median step beside threads
    _finished_before = False  # this epoch's end was counted

    def _gil_check(self) -> None:
        """At an epoch's end: thread workers chosen by ``worker_type="auto"`` whose work took
        turns on the GIL make the next epoch's pool one of processes."""
        engine = self._engines[-1] if self._engines else None
        if self._kind_fixed is not None or engine is None or engine.kind != "thread":
            return
        learned = self._learned
        if learned.tried:
            return  # processes were measured beside these threads (``_kind_trial``)
        if (
            engine.workers >= 2
            and (self._inflation or 0) > policy.GIL_SHARE * engine.workers
            and self._processes_affordable(engine)
        ):
            why = f"{engine.workers} threads' work took {self._inflation:.2f}× the main process's"
        elif self._slows_the_consumer() and self._processes_affordable(engine):
            why = (
                "the consumer's median step took %.2f ms beside threads, %.2f ms beside the "
                % ((self._thread_step or 0) * 1e3, (learned.main_step or 0) * 1e3)
                + "main process's loading"
            )
        else:
            return
        learned.kind = "process"
        self._stats.next_kind = "process"
        log.debug("rloader auto: processes from the next epoch: %s (the GIL)", why)

    def _kind_trial(self) -> None:
        """At an epoch's end, under ``worker_type="auto"``: a busy thread pool that served a
        whole epoch, not its first (tensor pairs: a thread pool's first epoch ran at 0.4 of
        its later ones), short of ``TRIAL_EFFICIENCY`` of the speedup its number promises, for
        work that holds its CPU, is followed by an epoch of as many processes (if the budget
        holds them and they could win their start back); at the end of that epoch the kind
        whose epoch had the shorter loop per batch is kept (processes by ``TRIAL_MARGIN``; a
        persistent pool's after its start, which it pays once), and no trial is made again,
        nor a move to processes by ``_gil_check`` or ``_processes_next``: the kinds were
        measured side by side. Threads that reach their promise are kept without one. (Not for
        an IterableDataset, whose epoch's length is unknown: the start of processes cannot be
        weighed.)"""
        engine = self._engines[-1] if self._engines else None
        if self._kind_fixed is not None or engine is None or len(self._engines) != 1:
            return
        if self._learned.trial is not None:
            self._judge_trial(engine)
        else:
            self._start_trial(engine)

    def _part(self, engine: _Engine, after_start: bool = False) -> tuple:
        """(batches, wait, user) of this epoch that ``engine`` served: since it began serving,
        or (``after_start``) since its first round, if it served ``MIN_WINDOW`` batches after."""
        start = engine.e_from
        warm = engine.warm_from
        if after_start and warm is not None and self._e_batches - warm[0] >= policy.MIN_WINDOW:
            start = warm
        return self._e_batches - start[0], self._e_wait - start[1], self._e_user - start[2]

    def _judge_trial(self, engine: _Engine) -> None:
        """The end of an epoch of processes on trial (``_kind_trial``)."""
        learned = self._learned
        batches, wait, user = self._part(engine, after_start=self._persistent)
        if batches <= 0:
            return
        loop = (wait + user) / batches
        threads, thread_loop = learned.trial
        learned.trial, learned.tried = None, True
        kept = policy.trial_keeps_processes(thread_loop, loop)
        log.debug(
            "rloader auto: processes on trial: %.3f ms a batch against %d threads' %.3f ms: %s",
            loop * 1e3,
            threads,
            thread_loop * 1e3,
            "kept" if kept else "back to threads",
        )
        if not kept:
            learned.kind, learned.workers = "thread", threads
            self._stats.next_kind, self._stats.next_workers = "thread", threads

    def _start_trial(self, engine: _Engine) -> None:
        """The end of a thread pool's epoch: processes on trial next if it falls short
        (``_kind_trial``)."""
        learned = self._learned
        batches, wait, user = self._part(engine)
        if (
            learned.tried
            or engine.kind != "thread"
            or self._stats.next_kind is not None
            or engine.e_from[0] > 0  # (a pool switched to in this epoch: its next one is judged)
            or batches < 2 * policy.MIN_WINDOW
            or learned.epochs < 2  # (a loader's first epoch: its thread pools' is slower)
            or (self._persistent and not engine.lived)
            or wait <= policy.GROW_WAIT_SHARE * (wait + user)
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or learned.main_loop is None
            or not learned.base_work
            or engine.workers * self._per_worker("process") > self._budget
            or not self._processes_affordable(engine)
        ):
            return
        loop = (wait + user) / batches
        ideal = policy.promised_loop(
            learned.main_loop, learned.base_work, engine.workers, self._cores
        )
        if loop * policy.TRIAL_EFFICIENCY <= ideal:
            return  # the threads reach their promise
        start = engine.workers * self._start_cost("process")
        if not policy.trial_worth(loop, ideal, self._epoch_batches(), self._persistent, start):
            return  # their shortfall would not pay for the processes' start
        learned.trial = (engine.workers, loop)
        learned.kind, learned.workers = "process", engine.workers  # (as many: side by side)
        self._stats.next_kind, self._stats.next_workers = "process", engine.workers
        log.debug(
            "rloader auto: processes on trial next epoch: %d threads took %.3f ms a batch, "
            "%.3f ms promised",
            engine.workers,
            loop * 1e3,
            ideal * 1e3,
        )

    def _slows_the_consumer(self) -> bool:
        """Whether the thread workers took the GIL from the consumer: its own median step
        (outside ``next()``) took ``CONSUMER_GIL`` × what it took beside the main process's
        loading, for work that holds its CPU (work that mostly waits hands the GIL back), and
        by at least ``MIN_WAIT_SHARE`` of its loop."""
        learned = self._learned
        if (
            self._thread_step is None
            or learned.main_step is None
            or learned.main_loop is None
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or self._no_gain_loop("process") is not None
        ):
            return False
        main_step = learned.main_step
        extra = self._thread_step - main_step
        return (
            main_step > 0
            and self._thread_step > policy.CONSUMER_GIL * main_step
            and extra > policy.MIN_WAIT_SHARE * learned.main_loop
        )

    def _per_worker(self, kind: str) -> int:
        if kind == "thread":
            return policy.THREAD_COST
        if self._learned.per_worker is not None:
            return self._learned.per_worker
        # Before a worker is measured: this process's resident size, which a worker that writes
        # to all it inherits (or imports as much) reaches.
        return measure.own_memory() or (1 << 30)

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

    def _decide(self) -> None:
        engine = self._engines[-1] if self._engines else None
        if engine is None or self._closed:
            return
        if not engine.warm:
            # A new pool's start (and the old one's last batches) would read as waiting: its
            # windows begin once it has handed out its first round of prefetched batches. The
            # main process's first batches fill new batch memory: its windows begin after them.
            if len(self._engines) > 1 or engine.it._progress[0] < self._warm_batches(engine):
                return
            engine.warm = True
            self._window_reset()
            return
        minimum = max(policy.MIN_WINDOW, 2 * engine.workers * engine.prefetch) * self._w_scale
        now = measure.clock()
        if self._w_batches < max(minimum, self._w_hold_batches) or now - self._w_started < max(
            policy.MIN_WINDOW_S * self._w_scale,
            self._w_hold_s,
            policy.LONG_STEPS * max(self._longest, self._w_longest),
        ):
            return
        window = self._window(engine)
        if self._prefetch_auto and self._tune_prefetch(engine, window):
            return
        decision = policy.decide(window)
        if decision is not None and decision.workers and self._probe_short(engine, now):
            return  # the window goes on: the pool's kind is chosen by the GIL probe
        hold = self._no_gain_hold(engine)
        if decision is not None and decision.no_gain and now - self._w_started < hold:
            self._w_hold_s = hold  # the window goes on: a pool judged no faster
            return  # wants more evidence
        if decision is not None and not decision.deferred and not self._iterable:
            direction = 1 if decision.workers > engine.workers else -1
            if direction == -self._learned.direction and self._w_batches < 2 * minimum:
                self._w_hold_batches = 2 * minimum  # turning back needs twice the evidence
                return  # (hysteresis): the window goes on
            decision = self._above_floor(decision, engine)
            if decision is None:
                self._window_reset()  # (grown back after such a shrink before)
                return
        if decision is not None and decision.no_gain and self._no_gain(engine, window):
            decision = None  # the pool is kept to the epoch's end; processes follow
        engine.first_window = False  # (a new window begins, or a new engine)
        if decision is None:
            self._w_scale = min(2 * self._w_scale, policy.STEADY_GROWTH)  # steady: longer windows
        if self._iterable:  # the count is for the next epoch
            self._learned.wanted = decision.workers if decision else engine.workers
            self._window_reset()
            return
        if decision is not None and decision.deferred:
            self._learned.deferred = decision.workers
            self._stats.next_workers = decision.workers
            decision = None
        if decision is None or (self._source is not None and self._source.exhausted):
            self._window_reset()
            return
        direction = 1 if decision.workers > engine.workers else -1
        learned = self._learned
        if direction == 1 and learned.direction == -1 and learned.idle_shrink:
            # grown back after an idle shrink: the windows that read as idle were the
            # consumer's long steps, not too many workers
            learned.floor = (decision.workers, learned.epochs, measure.clock())
        if direction == 1 and engine.workers and window.user_s > 0:
            learned.waited[engine.kind] = (engine.workers, window.work_s / window.user_s)
        learned.direction, learned.idle_shrink = direction, decision.idle
        self._switch(decision.workers, decision.reason, window)

    # -- the GIL probe (worker_type="auto") -----------------------------------------------

    _probe_from: tuple = (0.0, 0.0, 0.0)  # Learned.gil when this iterator's probe started

    def _start_probe(self) -> Optional[Any]:
        """The GIL probe of the main process's loading (``GilProbe``, rloader-workers), started
        at its first batch: under ``worker_type="auto"`` while the kind is undecided."""
        if self._probe is None and self._kind_fixed is None and self._learned.kind is None:
            self._probe_from = self._learned.gil or (0.0, 0.0, 0.0)
            self._probe = _rloader.GilProbe(policy.GIL_PROBE_PERIOD_S)
        return self._probe

    def _read_probe(self) -> Optional[tuple]:
        """The probe's (seconds blocked, its seconds observed, seconds of loading), with those
        of earlier epochs' probes (``Learned.gil``)."""
        if self._probe is None:
            return None
        now = self._probe.share()
        if now[1] <= 0:
            return None
        gil = tuple(a + b for a, b in zip(self._probe_from, now))
        self._learned.gil = gil
        return gil

    def _probe_gil(self) -> None:
        """At the main process's windows: where a second thread could not have taken the GIL
        through the loading (``probed_kind``), or the loading holds its CPU (``holds_cpu``) and
        processes would win their start back (``_processes_affordable``), the first pool is one
        of processes (if the budget holds one), without a trial of threads."""
        learned = self._learned
        if self._kind_fixed is not None or learned.kind is not None:
            return
        gil = self._read_probe() or learned.gil  # (the epoch's last window: stopped)
        if gil is not None and policy.probed_kind(*gil) is not None:
            why = "a second thread could not take the GIL in %.0f%% of the loading" % (
                100 * gil[0] / gil[1]
            )
        elif (
            policy.holds_cpu(learned.cpu_share)
            and self._probed(gil)
            and self._processes_affordable(None)
        ):
            why = "the loading holds its CPU (%.0f%% of its time)" % (100 * learned.cpu_share)
        else:
            return
        if self._per_worker("process") > self._budget:
            return
        learned.kind, learned.kind_why = "process", why
        log.debug("rloader auto: %s (%.3f s probed)", why, 0.0 if gil is None else gil[2])
        self._stop_probe()

    def _probed(self, gil: Optional[tuple]) -> bool:
        """Whether the GIL probe had its say: ``GIL_PROBE_S`` of loading probed, or the window
        waited ``GIL_PROBE_WAIT_S`` for it (``_probe_short``), or the probe has stopped."""
        if self._probe is None or (gil is not None and gil[2] >= policy.GIL_PROBE_S):
            return True
        return measure.clock() - self._w_started >= policy.GIL_PROBE_WAIT_S

    def _probe_short(self, engine: _Engine, now: float) -> bool:
        """Whether the main process's window that starts a pool goes on until the GIL probe has
        read ``GIL_PROBE_S`` of loading, for at most ``GIL_PROBE_WAIT_S`` (on a busy machine a
        window's 50 ms held 9 ms of pure-Python loading)"""
        if engine.workers or self._probe is None or self._learned.kind is not None:
            return False
        gil = self._learned.gil
        if gil is not None and gil[2] >= policy.GIL_PROBE_S:
            return False
        if now - self._w_started >= policy.GIL_PROBE_WAIT_S:
            return False
        self._w_hold_s = now - self._w_started + policy.GIL_PROBE_S  # (looked at again then)
        return True

    def _stop_probe(self) -> None:
        if self._probe is not None:
            self._read_probe()
            self._probe.stop()
            self._probe = None

    # -- handing out ----------------------------------------------------------------------

    def __next__(self):
        own = self._stats.own
        called = measure.clock()
        if self._handed_at is not None:
            step = called - self._handed_at
            self._w_user += step
            self._e_user += step
            self._w_longest = max(self._w_longest, step)
            self._w_steps.append(step)
            self._handed_at = None
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
                self._handed_at = now
                if self._w_batches == 0 and self._prefetch_auto:
                    self._batch_bytes = measure.batch_nbytes(batch)
                self._w_batches += 1
                self._e_batches += 1

    _handed_at: Optional[float] = None  # when next() last returned a batch

    def _next(self):
        while True:
            if self._closed or not self._engines:
                self._finished = True
                raise StopIteration
            decided = measure.clock()
            self._decide()
            if self._w_started < decided:
                # (the consumer waits for this bookkeeping too, and for the GIL it takes back
                # from busy thread workers after each read of /proc: its own time, a pool's
                # loop is measured with it; not where a window began in it)
                self._w_user += measure.clock() - decided
            engine = self._engines[0]
            in_process = engine.workers == 0
            probe = self._start_probe() if in_process else None
            if in_process:
                cpu0 = measure.cpu_clock()
            wall0 = measure.clock()
            try:
                # (only this is the consumer's wait for data to a decision: this iterator's own
                # bookkeeping, a switch, a retired pool's stop are not what a pool can change)
                batch = self._probed_next(engine, probe)
            except StopIteration:
                if len(self._engines) > 1 or (engine.segment is not None and engine.segment.closed):
                    self._retire(engine)
                    continue
                self._end_epoch()
                raise
            finally:
                waited = measure.clock() - wall0
                self._w_wait += waited
                self._e_wait += waited
                if in_process:
                    self._w_cpu += measure.cpu_clock() - cpu0
                    self._w_work += waited
                elif engine.start_s is not None:
                    self._measure_start(engine, waited)
            return batch

    @staticmethod
    def _probed_next(engine: _Engine, probe: Optional[Any]):
        """``engine``'s next batch, loaded under the GIL probe (if one runs)."""
        if probe is None:
            return engine.next()
        probe.loading(True)
        try:
            return engine.next()
        finally:
            probe.loading(False)

    def _tune_prefetch(self, engine: _Engine, window: policy.Window) -> bool:
        """``prefetch_factor="auto"``: changes the pool's batches in flight per worker where
        ``window`` asks (``decide_prefetch``), in place (the pool's scheduler draws more, or
        fewer as batches are handed out); a pool that cannot (pinned worker processes, whose
        pin thread owns the pool) keeps its own, and the next pool starts with the new one.
        True: changed, and a new window measures it."""
        if engine.workers == 0 or engine.prefetch_fixed:
            return False
        asked = policy.decide_prefetch(window)
        if asked is None:
            return False
        prefetch, why = asked
        self._prefetch = self._learned.prefetch = prefetch  # the next pools'
        setter = getattr(engine.it, "_set_prefetch_factor", None)
        if setter is None:
            engine.prefetch_fixed = True
            why += "; from the next pool on"
        else:
            setter(prefetch)
            engine.prefetch = self._stats.prefetch = prefetch
        self._record(engine.workers, engine.kind, f"prefetch_factor {prefetch}: {why}", window)
        self._w_scale = 1
        self._window_reset()
        return True

    def _floor(self) -> int:
        """The least the workers idling may shrink the pool to: a pool grown back after such a
        shrink (its windows in the consumer's long steps read as idle, those in its short ones
        as waiting), for ``FLOOR_EPOCHS`` epochs."""
        floor = self._learned.floor
        if floor is None:
            return 0
        workers, epoch, since = floor
        if (
            self._learned.epochs - epoch >= policy.FLOOR_EPOCHS
            or measure.clock() - since >= policy.FLOOR_S
        ):
            return 0
        return workers

    def _above_floor(self, decision: policy.Decision, engine: _Engine) -> Optional[policy.Decision]:
        """``decision``, an idle shrink stopped at the floor (``_floor``); None where the pool
        is at it already."""
        floor = self._floor()
        if not decision.idle or decision.workers >= floor:
            return decision
        return decision._replace(workers=floor) if engine.workers > floor else None

    @staticmethod
    def _no_gain_hold(engine: _Engine) -> float:
        """How long a window judging ``engine``'s pool no faster goes on, at least."""
        return policy.NO_GAIN_WINDOW_S if engine.kind == "process" else policy.NO_GAIN_THREADS_S

    def _measure_start(self, engine: _Engine, waited: float) -> None:
        """A new pool's start: its creation and the consumer's waits for its first round."""
        engine.start_s += waited
        if engine.it._progress[0] >= self._warm_batches(engine):
            self._learned.start_s[engine.kind] = engine.start_s / engine.workers
            engine.start_s = None
            # (this batch is counted in the epoch's after this returns)
            engine.warm_from = (self._e_batches + 1, self._e_wait, self._e_user)

    def _last_window(self) -> None:
        """The epoch's last window, even if short (an epoch shorter than a window would never
        decide): what it asks for is the next epoch's start (map-style datasets)."""
        engine = self._engines[-1] if self._engines else None
        if self._iterable or engine is None or not engine.warm:
            return
        whole = self._whole_epoch(engine)
        if whole is None and self._w_batches < policy.MIN_WINDOW:
            return
        window = whole or self._window(engine)._replace(remaining=None)
        decision = policy.decide(window)
        if decision is None or decision.workers == engine.workers:
            return
        decision = self._above_floor(decision, engine)
        if decision is None:
            return
        if decision.no_gain:
            short = measure.clock() - self._w_started < self._no_gain_hold(engine)
            if whole is None and not engine.first_window and short:
                return  # a short tail after earlier windows: too little evidence
            if self._no_gain(engine, window) or self._stats.next_kind == "process":
                return  # the next epoch: as many processes
        if decision.workers > engine.workers:
            # every epoch starts its pool: worth it only if a whole epoch wins the start back
            # (a persistent one: ``PAYBACK_EPOCHS``)
            whole = (window.epoch_batches or 0) * policy.saved_per_batch(window, decision.workers)
            if whole * policy.payback_epochs(self._persistent) < decision.workers * (
                window.start_s or 0.0
            ):
                return
        self._learned.deferred = None
        self._learned.workers = decision.workers
        self._stats.next_workers = decision.workers

    def _whole_epoch(self, engine: _Engine) -> Optional[policy.Window]:
        """The epoch's measurements as one window, where a fresh pool of processes served all of
        it without persistent workers (each epoch's pool is fresh): its first epoch is a
        start's (``decide`` does not judge it window by window), and here it is judged whole,
        as each epoch will cost (None otherwise: a persistent pool's start is paid once, and its
        later epochs are judged)."""
        if (
            self._persistent
            or engine.kind != "process"
            or not engine.workers
            or engine.lived
            or self._taken_done
            or len(self._engines) != 1
            or not self._e_batches
        ):
            return None
        now = _stages(engine.it._stats.as_dict())
        work = sum(now[k] - engine.stages[k] for k in ("fetch_s", "collate_s", "pin_s"))
        window = self._window(engine)
        return window._replace(
            remaining=None,
            batches=self._e_batches,
            wait_s=self._e_wait,
            user_s=self._e_user,
            work_s=work,
            cpu_s=None if self._learned.cpu_share is None else self._learned.cpu_share * work,
            pool_batches=window.epoch_batches,
        )

    def _drain(self, engine: _Engine) -> None:
        """Takes the in-flight batches of ``engine`` (its segment closed: it draws nothing more)
        and stops its workers, so that they are gone before the next pool starts; the batches
        are handed out from ``engine.drained`` in order. An error while taking them is kept in
        its place, raised when the consumer reaches it, and the engine's workers serve the
        rest, as before (they are not stopped)."""
        items: collections.deque = collections.deque()
        engine.drained = items
        while True:
            try:
                items.append(next(engine.it))
            except StopIteration:
                break
            except Exception as error:
                items.append(_Raised(error))
                return
        engine.exhausted = True
        engine.stop()

    def _retire(self, engine: _Engine) -> None:
        """An engine whose segment was closed has handed out all it drew."""
        self._engines.remove(engine)
        self._stats.live.remove(engine)
        now = _stages(engine.it._stats.as_dict())
        for k in _STAGES:
            self._stats.done[k] += now[k] - engine.stages[k]
        self._taken_done += engine.handed
        engine.stop()

    def _end_epoch(self) -> None:
        self._finished = True
        self._stop_probe()
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
        self._gil_check()
        if first_end:
            self._kind_trial()
        if self._iterable and self._engines and self._w_batches:
            engine = self._engines[-1]
            window = self._window(engine)._replace(remaining=None)
            decision = policy.decide(window)
            if decision is not None and decision.no_gain and self._no_gain(engine, window):
                decision = None  # as many processes
            self._learned.wanted = decision.workers if decision else engine.workers
        if self._stats.next_kind is not None:
            learned.kind = self._stats.next_kind
        if not self._persistent:
            for engine in self._engines:
                engine.stop()
