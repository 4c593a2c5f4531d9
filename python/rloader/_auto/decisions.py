"""When the auto iterator decides, and what: a window's end (``_decide``), the epoch's last
window (``_last_window``), and the measurements a decision reads (``_window``). A mixin of
``AutoIter`` that owns no state of its own: it reads the iterator's window accounting
(``Tally``), what the loader learned, and the kind choice, and asks ``policy`` (pure) for
the decision."""

from __future__ import annotations

from typing import Optional

from . import measure, policy
from .engines import POOL_CPU, Engine, stages
from .learned import idle_floor, per_worker, start_cost


class Decisions:
    """``AutoIter``'s decisions (see the module's docstring)."""

    def _decide(self) -> None:
        engine = self._engines[-1] if self._engines else None
        if engine is None or self._closed:
            return
        tally = self._tally
        if not engine.warm:
            # A new pool's start (and the old one's last batches) would read as waiting: its
            # windows begin once it has handed out its first round of prefetched batches. The
            # main process's first batches fill new batch memory: its windows begin after them.
            if len(self._engines) > 1 or engine.it._progress[0] < self._warm_batches(engine):
                return
            engine.warm = True
            self._window_reset()
            return
        minimum = max(policy.MIN_WINDOW, 2 * engine.workers * engine.prefetch) * tally.scale
        now = measure.clock()
        if not tally.ended(minimum, now):
            return
        window = self._window(engine)
        why = self._prefetch.tune(engine, window)
        if why is not None:
            self._record(engine.workers, engine.kind, why, window)
            tally.scale = 1
            self._window_reset()  # a new window measures it
            return
        decision = policy.decide(window)
        if decision is not None and decision.workers and policy.is_quiet(window.others):
            # (a busy window's kind is its loading's CPU share's, which needs no probe)
            hold = self._gil.hold(engine, now, tally.started)
            if hold is not None:
                tally.hold_s = hold  # the window goes on: the pool's kind is the probe's
                return
        hold = self._no_gain_hold(engine)
        if decision is not None and decision.no_gain and now - tally.started < hold:
            tally.hold_s = hold  # the window goes on: a pool judged no faster
            return  # wants more evidence
        if decision is not None and not decision.deferred and not self._iterable:
            direction = 1 if decision.workers > engine.workers else -1
            if direction == -self._learned.direction and tally.batches < 2 * minimum:
                tally.hold_batches = 2 * minimum  # turning back needs twice the evidence
                return  # (hysteresis): the window goes on
            decision = self._above_floor(decision, engine)
            if decision is None:
                self._window_reset()  # (grown back after such a shrink before)
                return
        if decision is not None and decision.no_gain and self._choice.no_gain(engine, window):
            decision = None  # the pool is kept to the epoch's end; processes follow
        engine.first_window = False  # (a new window begins, or a new engine)
        if decision is None:
            tally.grow()  # steady: longer windows
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

    def _above_floor(self, decision: policy.Decision, engine: Engine) -> Optional[policy.Decision]:
        """``decision``, an idle shrink stopped at the floor (``idle_floor``); None where the
        pool is at it already."""
        floor = idle_floor(self._learned)
        if not decision.idle or decision.workers >= floor:
            return decision
        return decision._replace(workers=floor) if engine.workers > floor else None

    @staticmethod
    def _no_gain_hold(engine: Engine) -> float:
        """How long a window judging ``engine``'s pool no faster goes on, at least."""
        return policy.NO_GAIN_WINDOW_S if engine.kind == "process" else policy.NO_GAIN_THREADS_S

    def _last_window(self) -> None:
        """The epoch's last window, even if short (an epoch shorter than a window would never
        decide): what it asks for is the next epoch's start (map-style datasets)."""
        engine = self._engines[-1] if self._engines else None
        if self._iterable or engine is None or not engine.warm:
            return
        whole = self._whole_epoch(engine)
        if whole is None and self._tally.batches < policy.MIN_WINDOW:
            return
        window = whole or self._window(engine)._replace(remaining=None)
        decision = policy.decide(window)
        if decision is None or decision.workers == engine.workers:
            return
        decision = self._above_floor(decision, engine)
        if decision is None:
            return
        if decision.no_gain:
            short = measure.clock() - self._tally.started < self._no_gain_hold(engine)
            if whole is None and not engine.first_window and short:
                return  # a short tail after earlier windows: too little evidence
            if self._choice.no_gain(engine, window) or self._stats.next_kind == "process":
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

    def _whole_epoch(self, engine: Engine) -> Optional[policy.Window]:
        """The epoch's measurements as one window, where a fresh pool of processes served all of
        it without persistent workers (each epoch's pool is fresh): its first epoch is a
        start's (``decide`` does not judge it window by window), and here it is judged whole,
        as each epoch will cost (None otherwise: a persistent pool's start is paid once, and its
        later epochs are judged)."""
        tally = self._tally
        if (
            self._persistent
            or engine.kind != "process"
            or not engine.workers
            or engine.lived
            or self._taken_done
            or len(self._engines) != 1
            or not tally.e_batches
        ):
            return None
        now = stages(engine.it._stats.as_dict())
        work = sum(now[k] - engine.stages[k] for k in ("fetch_s", "collate_s", "pin_s"))
        window = self._window(engine)
        return window._replace(
            remaining=None,
            batches=tally.e_batches,
            wait_s=tally.e_wait,
            user_s=tally.e_user,
            work_s=work,
            cpu_s=None if self._learned.cpu_share is None else self._learned.cpu_share * work,
            pool_batches=window.epoch_batches,
        )

    def _window(self, engine: Engine) -> policy.Window:
        """The current window's measurements."""
        learned, tally = self._learned, self._tally
        step = tally.step()
        pool_cpu = None  # a thread pool's worker threads' CPU seconds in the window
        if engine.workers == 0:
            work, share = tally.work, tally.cpu_share()
            cpu = None if share is None else share * work
            if share is not None and learned.kind is None:
                learned.cpu_share = share
            if tally.batches:
                learned.base_work = work / tally.batches
                learned.main_loop = (tally.wait + tally.user) / tally.batches
                learned.main_step = step if step is not None else learned.main_step
        else:
            now_stages = stages(engine.it._stats.as_dict())
            work = sum(
                now_stages[k] - engine.window_start[k] for k in ("fetch_s", "collate_s", "pin_s")
            )
            cpu = None if learned.cpu_share is None else learned.cpu_share * work
            if now_stages[POOL_CPU] is not None and engine.window_start[POOL_CPU] is not None:
                pool_cpu = now_stages[POOL_CPU] - engine.window_start[POOL_CPU]
        now = measure.clock()
        if engine.kind == "process":
            pids = measure.worker_pids(engine.it)
            if now >= engine.memory_due:
                engine.memory_due = now + measure.MEMORY_EVERY_S
                measure.probe.request(pids)  # read on the probe's thread
            measured = measure.probe.latest(pids)
            if measured is not None:
                learned.per_worker = max(learned.per_worker or 0, measured)
        wall = max(now - tally.started, 1e-9)
        others = tally.others(engine)
        # (the GIL measures read only windows the machine's load left alone: other processes'
        # work slows threads as taking turns on the GIL would, and deschedules the main
        # process holding the GIL, which the probe reads as held; the loading's CPU share is
        # its own, read in any window)
        quiet = policy.is_quiet(others)
        if engine.workers == 0:
            self._choice.probe_gil(quiet)
        kind = engine.kind if engine.workers else self._choice.next_kind()
        inflation = None
        busy = tally.wait > policy.GROW_WAIT_SHARE * (tally.wait + tally.user)
        threads = kind == "thread" and engine.workers and quiet
        if threads and learned.base_work and tally.batches and busy:
            inflation = work / tally.batches / learned.base_work
            self._choice.inflation = inflation
        if threads and step is not None:
            self._choice.thread_step = step
        return policy.Window(
            batches=tally.batches,
            wait_s=tally.wait,
            user_s=tally.user,
            work_s=work,
            cpu_s=cpu,
            workers=engine.workers,
            kind=kind,
            cores=self._cores,
            budget=self._budget,
            per_worker=per_worker(learned, kind),
            remaining=self._remaining(),
            prefetch=engine.prefetch if engine.workers else self._prefetch.factor,
            inflation=inflation,
            first_epoch=learned.epochs == 0,
            epoch_batches=self._epoch_batches(),
            persistent=self._persistent,
            main_loop=learned.main_loop,
            main_work=learned.base_work,
            no_gain=self._choice.no_gain_loop(kind),
            start_s=start_cost(learned, kind),
            others=others,
            batch_bytes=self._prefetch.batch_bytes,
            pool_batches=engine.lived + engine.handed if engine.workers else None,
            waited=learned.waited.get(kind),
            memory_measured=kind != "process" or learned.per_worker is not None,
            process_cores=(measure.process_clock() - tally.process_cpu) / wall,
            pool_cores=None if pool_cpu is None else pool_cpu / wall,
            step=step,
        )
