"""Kind choice and trials (``worker_type="auto"``): processes or threads, and when a pool of
either was no faster than the main process.

- The main process's loading is probed first (``probe_gil``): loading in which a second
  thread could not take the GIL, or that holds its CPU (where processes would win their start
  back), starts processes; else threads first (loading that waits; they start at once).
- A busy thread pool's work per batch against the main process's alone (``inflation``):
  threads that take turns on the GIL each take about their number times longer; above
  ``GIL_SHARE`` × their number the next epoch's pools are processes (``gil_check``), as when
  the consumer's median step grew beside them (``slows_the_consumer``).
- A pool no faster than the main process is remembered for its kind (``no_gain``); threads
  whose work holds its CPU make way for processes instead (``processes_next``).
- A thread pool short of the speedup its number promises is followed by one epoch of as many
  processes, and the kind with the shorter loop per batch is kept (``trial``: once per loader).
The kind changes only between epochs."""

from __future__ import annotations

import logging
from typing import Callable, Optional

from torch.utils.data import Subset

from . import policy
from .engines import Engine
from .gil_probe import GilProbeSession
from .learned import Learned, next_kind, per_worker, start_cost
from .options import AUTO
from .stats import AutoStats
from .window import Tally

log = logging.getLogger("rloader")


def loads_without_gil(dataset) -> bool:
    """Whether ``dataset`` says (``_rloader_loads_without_gil``, rloader.vision's folders where
    Rust makes whole batches) that its loading runs mostly without the GIL, in long stretches:
    threads then suit it even where it holds its CPU (``KindChoice.probe_gil``). A ``Subset``
    says what its dataset says."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    try:
        return bool(getattr(dataset, "_rloader_loads_without_gil", False))
    except Exception:  # (a proxy's __getattr__ that raises something else: no word said)
        return False


class KindChoice:
    """What the auto iterator decides of its pools' kind; its figures of thread pools
    (``inflation``, ``thread_step``) are set as windows are measured."""

    def __init__(
        self,
        learned: Learned,
        stats: AutoStats,
        tally: Tally,
        gil: GilProbeSession,
        *,
        kind_fixed: Optional[str],
        persistent: bool,
        cores: int,
        budget: int,
        epoch_batches: Callable[[], Optional[int]],
        epoch_ended: Callable[[], bool],
        gil_free: bool = False,
    ) -> None:
        self.learned = learned
        self.gil_free = gil_free  # the dataset's loading runs mostly without the GIL
        self.stats = stats
        self.tally = tally
        self.gil = gil
        self.kind_fixed = kind_fixed
        self.persistent = persistent
        self.cores = cores
        self.budget = budget
        self.epoch_batches = epoch_batches
        self.epoch_ended = epoch_ended
        self.inflation: Optional[float] = None  # the latest busy thread pool's (Window.inflation)
        self.thread_step: Optional[float] = None  # the consumer's median step beside threads

    def next_kind(self) -> str:
        """The kind of the next pool (``learned.next_kind``)."""
        return next_kind(self.kind_fixed or AUTO, self.learned)

    # -- the first pool: the GIL probe's verdict ------------------------------------------

    def probe_gil(self, quiet: bool = True) -> None:
        """At the main process's windows: where a second thread could not have taken the GIL
        through the loading (``probed_kind``; read only in a ``quiet`` window: other processes
        deschedule the thread that holds the GIL, and the probe, which the probe reads as
        held), or the loading holds its CPU (``holds_cpu``, its own share, which the machine's
        load does not lower; not where the dataset says it loads without the GIL,
        ``gil_free``) and processes would win their start back, the first pool is one of
        processes (if the budget holds one), without a trial of threads."""
        learned = self.learned
        self.gil.paused = not quiet  # (the next window's)
        if self.kind_fixed is not None or learned.kind is not None:
            return
        gil = self.gil.read() or learned.gil  # (the epoch's last window: stopped)
        if not quiet:
            gil = None  # (the probe's figures are kept for stats() all the same)
        if gil is not None and policy.probed_kind(*gil) is not None:
            why = "a second thread could not take the GIL in %.0f%% of the loading" % (
                100 * gil[0] / gil[1]
            )
        elif (
            policy.holds_cpu(learned.cpu_share)
            and not self.gil_free
            and (not quiet or self.gil.had_its_say(gil, self.tally.started))
            and self.processes_affordable(None)
        ):
            why = "the loading holds its CPU (%.0f%% of its time)" % (100 * learned.cpu_share)
        else:
            return
        if per_worker(learned, "process") > self.budget:
            return
        learned.kind, learned.kind_why = "process", why
        log.debug("rloader auto: %s (%.3f s probed)", why, 0.0 if gil is None else gil[2])
        self.gil.stop()

    # -- a pool no faster than the main process -------------------------------------------

    def no_gain(self, engine: Engine, window: policy.Window) -> bool:
        """``engine``'s pool was no faster than the main process: remembered for its kind (the
        main process starts none again for a while: ``RETRY_SHARE``). Under
        ``worker_type="auto"``, threads whose work holds its CPU make way for processes from
        the next epoch, if a whole epoch could win their start back; then the threads serve to
        the epoch's end if as fast as the main process (True), else the main process does
        (False)."""
        learned = self.learned
        if self.stats.next_kind == "process" and engine.kind == "thread":
            return True  # (decided at an earlier window)
        loop = (window.wait_s + window.user_s) / max(window.batches, 1)
        if not self.processes_next(engine):
            if window.main_loop is not None and loop <= policy.NO_GAIN * window.main_loop:
                return True  # threads somewhat faster than the main process: kept
            retried = engine.kind in learned.no_gain
            learned.no_gain[engine.kind] = (loop, learned.epochs)
            held = learned.no_gain_epochs.get(engine.kind)
            learned.no_gain_epochs[engine.kind] = 2 * held if retried and held else 2
            return False
        learned.no_gain["thread"] = (loop, learned.epochs)
        self.stats.next_kind = "process"  # (``AutoIter._end_epoch`` makes it the loader's kind)
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
            self.stats.next_workers = engine.workers
            return False
        return True

    def processes_next(self, engine: Engine) -> bool:
        """Whether threads no faster than the main process make way for processes: under
        ``worker_type="auto"``, for work that holds its CPU, if a whole epoch could win their
        start back and processes were not found no faster themselves."""
        learned = self.learned
        if (
            self.kind_fixed is not None
            or engine.kind != "thread"
            or learned.tried  # (measured beside processes: ``trial``)
            or self.no_gain_loop("process") is not None
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or not learned.base_work
        ):
            return False
        return self.processes_affordable(engine)

    def processes_affordable(self, engine: Optional[Engine]) -> bool:
        """Whether as many processes as ``engine`` has threads (at least 2, the least pool that
        spreads the work; None: 2) could win their start back: in an epoch, or
        ``PAYBACK_EPOCHS`` if persistent (the main process's work per batch, spread over them,
        is what they could save)."""
        learned = self.learned
        if not learned.base_work:
            return False
        workers = max(engine.workers if engine is not None else 0, 2)
        batches = self.epoch_batches()
        if batches is None and self.epoch_ended():
            batches = self.tally.e_batches  # (an iterable dataset's epoch, once it ended)
        saved = (batches or 0) * learned.base_work * (1 - 1 / workers)
        saved *= policy.payback_epochs(self.persistent)
        return saved >= workers * start_cost(learned, "process")

    def no_gain_loop(self, kind: str) -> Optional[float]:
        """The loop per batch of a pool of ``kind`` found no faster, while that holds."""
        learned = self.learned
        entry = learned.no_gain.get(kind)
        if entry is None:
            return None
        loop, epoch = entry
        if learned.epochs - epoch >= learned.no_gain_epochs.get(kind, 1):
            return None
        return loop

    # -- at an epoch's end ----------------------------------------------------------------

    def gil_check(self, engine: Optional[Engine]) -> None:
        """At an epoch's end: thread workers chosen by ``worker_type="auto"`` whose work took
        turns on the GIL, or took the GIL from the consumer, make the next epoch's pool one of
        processes."""
        if self.kind_fixed is not None or engine is None or engine.kind != "thread":
            return
        learned = self.learned
        if learned.tried:
            return  # processes were measured beside these threads (``trial``)
        if (
            engine.workers >= 2
            and (self.inflation or 0) > policy.GIL_SHARE * engine.workers
            and self.processes_affordable(engine)
        ):
            why = f"{engine.workers} threads' work took {self.inflation:.2f}× the main process's"
        elif self.slows_the_consumer() and self.processes_affordable(engine):
            why = (
                "the consumer's median step took %.2f ms beside threads, %.2f ms beside the "
                % ((self.thread_step or 0) * 1e3, (learned.main_step or 0) * 1e3)
                + "main process's loading"
            )
        else:
            return
        learned.kind = "process"
        self.stats.next_kind = "process"
        log.debug("rloader auto: processes from the next epoch: %s (the GIL)", why)

    def slows_the_consumer(self) -> bool:
        """Whether the thread workers took the GIL from the consumer: its own median step
        (outside ``next()``) took ``CONSUMER_GIL`` × what it took beside the main process's
        loading, for work that holds its CPU (work that mostly waits hands the GIL back), and
        by at least ``MIN_WAIT_SHARE`` of its loop."""
        learned = self.learned
        if (
            self.thread_step is None
            or learned.main_step is None
            or learned.main_loop is None
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or self.no_gain_loop("process") is not None
        ):
            return False
        main_step = learned.main_step
        extra = self.thread_step - main_step
        return (
            main_step > 0
            and self.thread_step > policy.CONSUMER_GIL * main_step
            and extra > policy.MIN_WAIT_SHARE * learned.main_loop
        )

    def trial(self, engines: list) -> None:
        """At an epoch's end: a busy thread pool that served a whole epoch, not its first (a
        thread pool's first epoch is slower), short of ``TRIAL_EFFICIENCY`` of the speedup its
        number promises, for work that holds its CPU, is followed by an epoch of as many
        processes (if the budget holds them and they could win their start back); at the end
        of that epoch the kind whose epoch had the shorter loop per batch is kept (processes by
        ``TRIAL_MARGIN``; a persistent pool's after its start, which it pays once), and no
        trial is made again, nor a move to processes by ``gil_check`` or ``processes_next``.
        (Not for an IterableDataset, whose epoch's length is unknown.)"""
        engine = engines[-1] if engines else None
        if self.kind_fixed is not None or engine is None or len(engines) != 1:
            return
        if self.learned.trial is not None:
            self._judge_trial(engine)
        else:
            self._start_trial(engine)

    def _judge_trial(self, engine: Engine) -> None:
        """The end of an epoch of processes on trial."""
        learned = self.learned
        batches, wait, user = self.tally.served(engine, after_start=self.persistent)
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
            self.stats.next_kind, self.stats.next_workers = "thread", threads

    def _start_trial(self, engine: Engine) -> None:
        """The end of a thread pool's epoch: processes on trial next if it falls short."""
        learned = self.learned
        batches, wait, user = self.tally.served(engine)
        if (
            learned.tried
            or engine.kind != "thread"
            or self.stats.next_kind is not None
            or engine.e_from[0] > 0  # (a pool switched to in this epoch: its next one is judged)
            or batches < 2 * policy.MIN_WINDOW
            or learned.epochs < 2  # (a loader's first epoch: its thread pools' is slower)
            or (self.persistent and not engine.lived)
            or wait <= policy.GROW_WAIT_SHARE * (wait + user)
            or learned.cpu_share is None
            or learned.cpu_share < policy.WAITING_SHARE
            or learned.main_loop is None
            or not learned.base_work
            or engine.workers * per_worker(learned, "process") > self.budget
            or not self.processes_affordable(engine)
        ):
            return
        loop = (wait + user) / batches
        ideal = policy.promised_loop(
            learned.main_loop, learned.base_work, engine.workers, self.cores
        )
        if loop * policy.TRIAL_EFFICIENCY <= ideal:
            return  # the threads reach their promise
        start = engine.workers * start_cost(learned, "process")
        if not policy.trial_worth(loop, ideal, self.epoch_batches(), self.persistent, start):
            return  # their shortfall would not pay for the processes' start
        learned.trial = (engine.workers, loop)
        learned.kind, learned.workers = "process", engine.workers  # (as many: side by side)
        self.stats.next_kind, self.stats.next_workers = "process", engine.workers
        log.debug(
            "rloader auto: processes on trial next epoch: %d threads took %.3f ms a batch, "
            "%.3f ms promised",
            engine.workers,
            loop * 1e3,
            ideal * 1e3,
        )
