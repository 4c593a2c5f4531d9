"""What ``num_workers="auto"`` decides from a window of measurements, and the numbers it
decides by (NOTE [Auto workers] in _auto/__init__.py): pure functions of a ``Window``, no I/O, so that
tests state a window and check the decision."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

PREFETCH = 2  # prefetch_factor="auto": where it starts (torch's default) and its least
PREFETCH_MAX = 8  # ... its most (a process pool's region has slots for as many)
PREFETCH_MEMORY_SHARE = 0.5  # batches in flight may take at most this share of the budget
# left after the workers' own memory
MIN_WORK_S = 0.00015  # less work per batch than this stays in the main process (processes;
# a pool no faster than the main process goes back to it: ``NO_GAIN``)
MIN_THREAD_WORK_S = 0.0001  # ... (threads: no start-up, no copy)
MIN_WAIT_SHARE = 0.05  # ... or less than this share of the consumer's loop
GROW_WAIT_SHARE = 0.05  # a pool grows when the consumer waits more than this share
SHRINK_WAIT_SHARE = 0.01  # ... and may shrink when it waits less than this share
SHRINK_RATIO = 0.75  # ... to at most this share of its workers
HEADROOM = 1.25  # workers asked for beyond work / user
GIL_SHARE = 0.75  # threads whose work per batch takes more than this × their number longer
# than in the main process alone take turns on the GIL: processes from the next epoch
CONSUMER_GIL = 1.25  # threads beside which the consumer's median step takes more than this ×
# its median beside the main process's loading take the GIL from it: processes next epoch
# (medians: a consumer's uneven long steps would move means)
GIL_CORES = 1.4  # threads that used more than this many cores over a window (``pool_cores``)
# ran side by side, not taking turns on the GIL: they make way only if no faster than the main
# process
GIL_HELD = 0.8  # worker_type="auto": main-process loading during which a second thread could
# not take the GIL for more than this share of the time (``GilProbe``) starts processes:
# threads would only take turns
GIL_PROBE_S = 0.02  # ... a verdict needs this much loading probed (4 switch intervals)
GIL_PROBE_WAIT_S = 0.2  # ... for which the main process's window that would start the first pool
# goes on, up to this long
GIL_PROBE_PERIOD_S = 0.0002  # the probe asks for the GIL this long after it last had it
THREADS_PER_CORE = 16  # threads that mostly wait: at most this many per usable core
PROCESSES_PER_CORE = 4  # ... processes
WAITING_SHARE = 0.25  # work whose CPU time is below this share of its wall time mostly waits
MIN_WINDOW = 4  # batches a decision looks at, at least
MIN_WINDOW_S = 0.05  # ... and seconds
STEADY_GROWTH = 16  # a window that decides nothing makes the next twice as long, up to this
# many times the shortest (each window's /proc reads cost the consumer); a switch starts short
# windows again
LONG_STEPS = 5  # ... and this many of the consumer's longest step in the last window (with a
# long step every few batches, a shorter window reads as idle or waiting by phase)
THREAD_COST = 8 << 20  # a worker thread's memory, counted against the budget
PROCESS_START_S = 0.015  # what starting one worker process costs the consumer, before it
PROCESS_START_PER_GIB = 0.06  # is measured: this, plus this per GiB of this process's RSS
# (fork copies the page tables; the workers then copy the pages they touch)
THREAD_START_S = 0.002  # ... one worker thread
NO_GAIN = 0.95  # a pool whose consumer loop per batch is above this share of the main
# process's is not worth it: back to the main process
RETRY_SHARE = 0.8  # ... and not tried again until its loop is below this share of the main
# process's (the work grew), or ``no_gain_epochs`` epochs have passed (a busy machine may have
# made it look slow): 2, then twice as many after each retry that finds it no faster again
THREAD_EFFICIENCY = 0.75  # threads that reach less than this share of the speedup their number
# (up to the cores) promises over the main process may be taking turns on the GIL: processes
# may do better (``worker_type="auto"``)
PAYBACK_EPOCHS = 10  # a persistent pool is worth starting if this many epochs win it back
TRIAL_EFFICIENCY = 1.0  # a busy thread pool short of this share of the speedup its number
# promises, for work that holds its CPU, is followed by one epoch of as many processes (a
# trial), kept only if their epoch's loop per batch is below ``TRIAL_MARGIN`` × the threads'
# (their start and first touches counted)
TRIAL_MARGIN = 0.97
FLOOR_EPOCHS = 4  # a pool grown back after an idle shrink is the least the workers idling
# may shrink it to, for this many epochs (uneven steps: windows in the long steps read as
# idle) or ``FLOOR_S`` seconds, whichever ends first (a long epoch, a loop that breaks)
FLOOR_S = 300.0
WARM_POOL_BATCHES = 1000  # a process pool is not judged no faster before it has made an
# epoch's batches, or this many per worker (its workers fault in what they first read)
WARM_WORK = 1.5  # processes whose work per batch is above this × the main process's are not
# judged no faster (they are still copying the pages they touch after the fork)
MAIN_WARM_BATCHES = 2  # the main process's first batches (fresh batch memory) are not measured
OTHERS_MAX = 0.3  # cores other processes used during a window above which it does not judge
# a pool no faster (the machine's load, not the pool, may be what slowed it), nor read the GIL
# probe or a thread pool's GIL figures
NO_GAIN_WINDOW_S = 0.2  # a window judging a pool no faster goes on at least this long (the
# load is counted in 10 ms ticks); an epoch's last window judges if shorter only when it is
# the pool's first (its whole life)
NO_GAIN_THREADS_S = 0.05  # ... a thread pool's, which costs nothing to leave: threads slower
# than the main process go back to it at once


class Window(NamedTuple):
    """What a decision looks at: measurements over ``batches`` handed out by one engine."""

    batches: int
    wait_s: float  # the consumer inside next()
    user_s: float  # the consumer between next() calls
    work_s: float  # fetch + collate + pin, summed over workers
    cpu_s: Optional[float]  # the CPU time of work_s: the loading's CPU share (its thread's CPU
    # time over its wall time less its waits for a core: ``Tally.cpu_share``) × work_s
    workers: int  # 0: in the main process
    kind: str  # "process" or "thread"
    cores: int
    budget: int  # bytes
    per_worker: int  # bytes, measured or estimated
    remaining: Optional[int]  # batches left in the epoch (None: unknown)
    prefetch: int
    inflation: Optional[float] = None  # a thread pool's work per batch over the main process's
    first_epoch: bool = True  # the loader's first: a pool started now pays for itself in it
    epoch_batches: Optional[int] = None  # batches in an epoch (None: unknown)
    persistent: bool = False  # a pool, once started, serves the later epochs too
    main_loop: Optional[float] = None  # the consumer's loop per batch in the main process
    main_work: Optional[float] = None  # the work per batch in the main process
    no_gain: Optional[float] = None  # a pool of this kind's loop per batch, found no faster
    start_s: Optional[float] = None  # starting one worker of this kind (None: the estimate)
    others: Optional[float] = None  # cores other processes used meanwhile (None: unknown)
    batch_bytes: Optional[int] = None  # a batch's tensor and array bytes (None: not measured)
    pool_batches: Optional[int] = None  # batches the pool has handed out since it started
    process_cores: Optional[float] = None  # this process's CPU time over the window's wall time
    # (all its threads: the consumer's, the training step's and any pool's)
    step: Optional[float] = None  # the consumer's median step between next() calls
    waited: Optional[tuple] = None  # (workers, work / user) where a pool of this kind grew
    memory_measured: bool = True  # per_worker is a worker's measured PSS, not an estimate
    pool_cores: Optional[float] = None  # a thread pool's worker threads' own CPU time making
    # batches over the window's wall time (None: not a thread pool, or not measured)


class Decision(NamedTuple):
    workers: int
    reason: str
    deferred: bool = False  # worth it, but from the next epoch's start on
    no_gain: bool = False  # back to the main process: the pool was no faster
    idle: bool = False  # a shrink because the workers idled (``floor_of`` bounds it)


def is_quiet(others: Optional[float]) -> bool:
    """Whether other processes left the machine quiet enough for figures that the scheduler
    moves as much as the loading does (``OTHERS_MAX``: a pool's speed against the main
    process's, the GIL's)."""
    return others is None or others < OTHERS_MAX


def thread_pool_cores(w: Window) -> Optional[float]:
    """The cores ``w``'s thread pool used: its worker threads' own CPU time (``pool_cores``),
    else, where that was not measured, the process's (``process_cores``, which counts the
    consumer's and the training step's threads as the pool's); None: neither."""
    return w.pool_cores if w.pool_cores is not None else w.process_cores


def worker_cap(w: Window) -> int:
    """The most workers of ``w.kind`` the cores and the budget allow."""
    cores = w.cores
    share = w.cpu_s / w.work_s if w.cpu_s is not None and w.work_s > 0 else None
    if share is not None and share < WAITING_SHARE:
        # work that mostly waits (its share leaves out its waits for a core: other processes
        # that load the machine do not make it read as waiting, ``Tally.cpu_share``)
        per_core = THREADS_PER_CORE if w.kind == "thread" else PROCESSES_PER_CORE
        cores = max(cores, int(cores / max(share, 1.0 / per_core)))
        used = thread_pool_cores(w)
        if w.kind == "thread" and w.workers and used is not None:
            # a thread pool's own CPU use, measured, over the main process's share: waiting
            # threads may use less than that share says
            per_thread = used / w.workers
            cores = max(cores, int(w.cores / max(per_thread, 1.0 / per_core)))
    elif w.kind == "thread":
        cores = max(cores, w.workers)
    by_memory = w.budget // max(w.per_worker, 1)
    return max(0, min(cores, by_memory))


def start_cost(kind: str, rss: Optional[int] = None) -> float:
    """Seconds the consumer loses per worker started, before a start is measured: a thread's
    is small; a process's grows with this process's resident size ``rss`` (fork copies its
    page tables, and the child's first touches copy pages)."""
    if kind == "thread":
        return THREAD_START_S
    return PROCESS_START_S + PROCESS_START_PER_GIB * (rss or 0) / (1 << 30)


def per_batch(w: Window) -> tuple:
    """``w``'s (wait, user, work) per batch, in seconds, and those numbers in words."""
    wait, user, work = w.wait_s / w.batches, w.user_s / w.batches, w.work_s / w.batches
    numbers = f"work {work * 1e3:.2f} ms, user {user * 1e3:.2f} ms, wait {wait * 1e3:.2f} ms"
    return wait, user, work, numbers


def promised_loop(main_loop: float, main_work: float, workers: int, cores: int) -> float:
    """The consumer's loop per batch that ``workers`` promise, from the main process's loop
    and work per batch: the work spread over them (up to the cores), or the consumer's own
    step, whichever is longer."""
    return max(main_loop - main_work, main_work / max(1, min(workers, cores)))


def saved_per_batch(w: Window, workers: int) -> float:
    """The consumer's wait per batch that a pool of ``workers`` would save over ``w``'s: its
    wait less what ``workers`` would leave, the work spread over them less the consumer's own
    step (a consumer whose step is longer than the work waits for none of it: the main process
    to 1 worker saves all its wait)."""
    wait, user, work, _ = per_batch(w)
    return max(0.0, wait - max(0.0, work / max(workers, 1) - user))


def payback_epochs(persistent: bool) -> int:
    """The epochs a pool's start may take to be won back: its own (each epoch starts a pool
    without persistent workers), or ``PAYBACK_EPOCHS`` (a persistent pool is started once)."""
    return PAYBACK_EPOCHS if persistent else 1


def _measures_memory(w: Window, cost: float) -> bool:
    """Whether a pool that would not pay for itself is started all the same, to measure a
    worker's memory: the budget holds fewer workers than the cores would carry only by the
    estimate (this process's RSS per worker; a worker's PSS is often far less), and the pool
    the cores would carry wins its start back."""
    if w.memory_measured or w.kind != "process" or not w.epoch_batches:
        return False
    by_memory = w.budget // max(w.per_worker, 1)
    cores = worker_cap(w._replace(budget=1 << 62))
    if by_memory >= cores:
        return False
    whole = w.epoch_batches * saved_per_batch(w, cores)
    return whole * payback_epochs(w.persistent) >= cores * cost


def decide(w: Window) -> Optional[Decision]:
    """The pool size ``w`` asks for, and why; None: keep the current one."""
    if w.batches <= 0:
        return None
    wait, user, work, numbers = per_batch(w)
    loop = wait + user
    cap = worker_cap(w)
    if w.workers > cap:
        return Decision(cap, f"memory: {w.workers} workers over the budget ({numbers})")
    quiet = is_quiet(w.others)
    slow = w.main_loop is not None and loop > NO_GAIN * w.main_loop
    if w.kind == "thread" and w.main_loop is not None and w.main_work is not None:
        # (threads short of the speedup their number promises may be taking turns on the GIL:
        # processes may do better; ``KindChoice.no_gain`` keeps threads somewhat faster than
        # the main process otherwise)
        ideal = promised_loop(w.main_loop, w.main_work, w.workers, w.cores)
        slow = loop * THREAD_EFFICIENCY > ideal
        used = thread_pool_cores(w)
        if used is not None and used > GIL_CORES:
            slow = loop > NO_GAIN * w.main_loop  # side by side (``GIL_CORES``)
    # (processes whose work per batch is well above the main process's are still copying the
    # pages they touch after the fork, or are descheduled: not judged yet)
    warming = w.kind == "process" and w.main_work is not None and work > WARM_WORK * w.main_work
    # (nor before they have made an epoch's batches: each worker maps and faults in what it
    # reads anew, so its first epoch is a start's)
    if w.kind == "process" and w.epoch_batches:
        if (w.pool_batches or 0) < min(w.epoch_batches, WARM_POOL_BATCHES * w.workers):
            warming = True
    if w.workers > 0 and w.main_loop is not None and slow and quiet:
        # The consumer waits on a pool that may not grow and is no faster than the main
        # process was (its transport costs what it saves, its workers take turns on the GIL,
        # or they share the cores with the consumer): back to the main process.
        if wait > GROW_WAIT_SHARE * loop and w.workers >= cap and not warming:
            return Decision(
                0,
                f"no faster than the main process (loop {loop * 1e3:.2f} ms a batch against "
                f"{w.main_loop * 1e3:.2f} ms; {numbers})",
                no_gain=True,
            )
    wanted = w.workers
    idle = False
    if user > 0:
        wanted = math.ceil(work / user * HEADROOM)
    else:
        wanted = cap
    if w.workers == 0:
        min_work = MIN_THREAD_WORK_S if w.kind == "thread" else MIN_WORK_S
        if work < min_work or loop <= 0 or wait < MIN_WAIT_SHARE * loop or cap < 1:
            return None
        if w.no_gain is not None and w.no_gain > RETRY_SHARE * loop:
            return None  # a pool of this kind was no faster, and the work has not grown since
        target, why = max(1, min(wanted, cap)), "the consumer waits on the main process"
    elif wait > GROW_WAIT_SHARE * loop and work > 0:
        target = min(max(wanted, w.workers + 1), 2 * w.workers, cap)
        why = "the consumer waits"
    elif wait < SHRINK_WAIT_SHARE * loop and wanted <= SHRINK_RATIO * w.workers:
        idle = True
        target, why = max(1, wanted), "the workers idle"
        if w.waited is not None and user > 0:
            # A pool of ``grown`` made the consumer wait at this ratio of work to its step: it
            # is not tried again until the ratio falls clearly (``SHRINK_RATIO``): the work got
            # cheaper or the step longer, not only a window's phase of uneven steps
            grown, ratio = w.waited
            if target <= grown and work / user > SHRINK_RATIO * ratio:
                target = grown + 1
                if target >= w.workers:
                    return None
        if w.main_work is not None and w.main_work < MIN_WAIT_SHARE * (user + w.main_work):
            # the main process would cost the consumer less than it takes to start a pool
            target, why = 0, "the workers idle; the main process's work is a small share"
    else:
        return None
    reason = f"{why} ({numbers}, cap {cap})"
    if target == w.workers or (target <= 0 and w.workers == 0):
        return None
    if w.remaining is not None and target > w.workers:
        wanted_later = target  # what a whole epoch asks for
        # a new pool that would not fill twice its prefetch window is not worth starting
        target = min(target, w.remaining // (2 * w.prefetch))
        # In the first epoch the time its rest would save must pay for starting the pool
        # (later epochs start on it at once, as a fixed loader starts its own).
        gain = w.remaining * saved_per_batch(w, target)
        cost = start_cost(w.kind) if w.start_s is None else w.start_s
        # From the next epoch on, if a whole epoch wins its start back (or the pool is started
        # once: persistent workers, over PAYBACK_EPOCHS).
        whole = (w.epoch_batches or 0) * saved_per_batch(w, wanted_later)
        pays = whole * payback_epochs(w.persistent) >= wanted_later * cost
        if w.first_epoch and (target <= w.workers or gain < target * cost):
            if pays:
                return Decision(wanted_later, f"{reason}; from the next epoch on", deferred=True)
            return None
        if target <= w.workers:
            return None
        if not w.first_epoch and w.epoch_batches and not pays and not _measures_memory(w, cost):
            # a pool started in a later epoch pays its start as well
            return None
    return Decision(target, reason, idle=idle)


def trial_keeps_processes(thread_loop: float, process_loop: float) -> bool:
    """Whether processes on trial (``KindChoice.trial``) are kept: their epoch's loop per
    batch below ``TRIAL_MARGIN`` × the threads'."""
    return process_loop < TRIAL_MARGIN * thread_loop


def prefetch_room(w: Window) -> int:
    """The most batches per worker in flight that the memory budget holds: at most
    ``PREFETCH_MEMORY_SHARE`` of what the workers' own memory leaves (never below torch's
    default, never above ``PREFETCH_MAX``)."""
    if not w.batch_bytes or w.workers <= 0:
        return PREFETCH_MAX
    left = (w.budget - w.workers * w.per_worker) * PREFETCH_MEMORY_SHARE
    return max(PREFETCH, min(PREFETCH_MAX, int(left // (w.workers * w.batch_bytes))))


def decide_prefetch(w: Window) -> Optional[tuple]:
    """``(prefetch_factor, reason)`` that ``w`` asks for under ``prefetch_factor="auto"``;
    None: keep it. Deeper when the consumer waits though the pool keeps up on average
    (``work / user × HEADROOM`` asks for no more workers than it has): its batches or the
    consumer's steps are uneven, and the workers idled with their batches ready while the
    consumer was slow, then could not catch up. More batches ahead absorb that for a
    batch's memory each, where another worker costs a process. Shallower only for the budget."""
    if w.workers <= 0 or w.batches <= 0:
        return None
    wait, user, work, numbers = per_batch(w)
    loop = wait + user
    room = prefetch_room(w)
    if w.prefetch > room:
        return room, f"memory: {w.prefetch} batches in flight per worker over the budget"
    if (
        w.prefetch < room
        and user > 0
        and wait > GROW_WAIT_SHARE * loop
        and math.ceil(work / user * HEADROOM) <= w.workers
    ):
        return (
            min(2 * w.prefetch, room),
            f"the consumer waits though {w.workers} workers keep up on average ({numbers})",
        )
    return None


def trial_worth(
    loop: float, ideal: float, epoch_batches: Optional[int], persistent: bool, start_s: float
) -> bool:
    """Whether a thread pool short of its promise (its ``loop`` per batch against ``ideal``)
    is worth a trial of as many processes (``KindChoice.trial``): the most they could win
    over the threads is the threads' shortfall (not all the main process's work, which the
    threads already spread), over an epoch or ``PAYBACK_EPOCHS`` with persistent workers,
    against starting them (``start_s``, all of them)."""
    shortfall = (loop - ideal / TRIAL_EFFICIENCY) * (epoch_batches or 0)
    return shortfall * payback_epochs(persistent) >= start_s


def holds_cpu(cpu_share: Optional[float]) -> bool:
    """Whether the main process's loading, taking ``cpu_share`` of its time on a core, holds
    its CPU (``WAITING_SHARE``): then processes before threads (``worker_type="auto"``).
    Loading that lets the GIL go in many short stretches makes threads hand it over at each,
    which the GIL probe cannot see; threads are for loading that waits."""
    return cpu_share is not None and cpu_share >= WAITING_SHARE


def probed_kind(blocked_s: float, observed_s: float, loading_s: float) -> Optional[str]:
    """The first pool's kind from the GIL probe (``GIL_HELD``): "process" where a second thread
    could not have run Python through the loading (the probe blocked for that share of its own
    time, ``observed_s``, over ``GIL_PROBE_S`` of loading), else None (no verdict: processes
    still where the loading holds its CPU, ``holds_cpu``; threads first otherwise)."""
    if loading_s < GIL_PROBE_S or blocked_s < GIL_HELD * observed_s:
        return None
    return "process"
