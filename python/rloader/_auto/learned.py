"""What a loader's auto iterators learned, kept between epochs in its record (``Learned``),
what is read from it (the next pool's kind, a worker's memory and start), and its saved form
(``learned_state``, ``seed_learned``): a resumed loader starts on the saved choice."""

from __future__ import annotations

from typing import Optional

from .._loader_record import record_of
from . import measure, policy
from .options import AUTO, is_auto


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
        self.floor: Optional[tuple] = None  # (workers, epoch, clock()): ``idle_floor``
        self.waited: dict = {}  # kind: (workers, work / user) where it grew (``Window.waited``)
        self.direction = 0  # of the last switch: 1 grew, -1 shrank
        self.idle_shrink = False  # ... and whether it was a shrink because the workers idled
        self.epochs = 0  # epochs ended
        # worker_type="auto": processes on trial after a thread pool (``KindChoice.trial``):
        # (the threads' number, their epoch's loop per batch); and whether one was made
        self.trial: Optional[tuple] = None
        self.tried = False
        # worker_type="auto": the GIL probe's (seconds blocked, its seconds observed, seconds of
        # loading) in the main process (``GilProbeSession``), while the kind was undecided
        self.gil: Optional[tuple] = None
        self.kind_why: Optional[str] = None  # why the probe chose processes (for the first pool)


def learned_of(loader) -> Learned:
    record = record_of(loader)
    if record.auto is None:
        record.auto = Learned()
    return record.auto


def worker_type_of(loader) -> str:
    return getattr(loader, "worker_type", "process")


def next_kind(worker_type: str, learned: Learned) -> str:
    """The kind of a loader's next pool: the user's, the one auto chose (processes where the
    GIL probe found the main process's loading holding the GIL, or where that loading holds
    its CPU), or threads first (they start at once; a thread pool measures what the probe
    cannot: the GIL's hand-overs, ``KindChoice.gil_check``)."""
    if worker_type != AUTO:
        return worker_type
    return learned.kind if learned.kind is not None else "thread"


def per_worker(learned: Learned, kind: str) -> int:
    """Bytes one worker of ``kind`` takes, counted against the memory budget."""
    if kind == "thread":
        return policy.THREAD_COST
    if learned.per_worker is not None:
        return learned.per_worker
    # Before a worker is measured: this process's resident size, which a worker that writes
    # to all it inherits (or imports as much) reaches.
    return measure.own_memory() or (1 << 30)


def start_cost(learned: Learned, kind: str) -> float:
    """Seconds to start one worker of ``kind``: the loader's last measured start, else the
    estimate (``policy.start_cost``). For processes the larger of the two: the measured start
    (the pool's creation and its first round) leaves out the pages the workers copy after it,
    which the estimate stands for."""
    measured = learned.start_s.get(kind)
    if measured is None:
        return policy.start_cost(kind, measure.own_memory())
    if kind == "process":
        return max(measured, policy.start_cost(kind, measure.own_memory()))
    return measured


def idle_floor(learned: Learned) -> int:
    """The least the workers idling may shrink the pool to: a pool grown back after such a
    shrink (its windows in the consumer's long steps read as idle, those in its short ones
    as waiting), for ``FLOOR_EPOCHS`` epochs or ``FLOOR_S`` seconds."""
    floor = learned.floor
    if floor is None:
        return 0
    workers, epoch, since = floor
    if learned.epochs - epoch >= policy.FLOOR_EPOCHS or measure.clock() - since >= policy.FLOOR_S:
        return 0
    return workers


def stream_readers(loader, pending: Optional[dict] = None) -> tuple:
    """Who reads an auto loader's IterableDataset in the epoch that starts: ``(num_workers,
    kind)``, kind "main", "process" or "thread" (its epoch keeps one engine: NOTE [Auto
    workers]). A resume's (``pending``) saved epoch is read by those that read it (its stream
    depends on their number; per-worker states need their kind); else what the last epoch
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
        # processes on trial (``KindChoice.trial``): the threads' (number, loop per batch)
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
