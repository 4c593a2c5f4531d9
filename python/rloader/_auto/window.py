"""Window accounting: what the auto iterator measures of the consumer and the loading, over
the current window (what a decision looks at) and over the epoch (what its end judges)."""

from __future__ import annotations

import statistics
from typing import Optional

from . import measure, policy
from .engines import Engine, stages


class Tally:
    """The current window's and the epoch's measurements. A window begins at ``reset`` (a new
    engine, a decision, or a window that decided nothing); the epoch's at ``new_epoch``."""

    def __init__(self) -> None:
        self.longest = 0.0  # the consumer's longest step in the window
        self.last_longest = 0.0  # ... in the last window (``LONG_STEPS``)
        self.batches = 0
        self.scale = 1  # windows are this many times the shortest (``STEADY_GROWTH``)
        self.handed_at: Optional[float] = None  # when next() last returned a batch
        self.e_batches, self.e_wait, self.e_user = 0, 0.0, 0.0
        self.wait = self.user = self.work = self.cpu = 0.0
        self.core_wait = 0.0  # of ``work``: the loading thread runnable, waiting for a core
        self.steps: list = []  # the consumer's steps in the window (their median: Window.step)
        self.started = self.process_cpu = 0.0  # (set by ``reset``, which reads the clocks)
        self.load: Optional[tuple] = None
        self.hold_s = 0.0  # a window that goes on is looked at again after this long
        self.hold_batches = 0  # ... and this many batches

    def new_epoch(self) -> None:
        self.handed_at = None  # (a gap between epochs is not the consumer's step)
        self.e_batches, self.e_wait, self.e_user = 0, 0.0, 0.0

    def reset(self, engine: Optional[Engine]) -> None:
        """A new window, over ``engine`` (the one handing out now; None: none yet)."""
        if self.batches:
            self.last_longest = self.longest
        self.longest = 0.0
        self.batches = 0
        self.wait = self.user = self.work = self.cpu = self.core_wait = 0.0
        self.steps = []
        self.started = measure.clock()
        self.process_cpu = measure.process_clock()
        self.load = None
        self.hold_s = 0.0
        self.hold_batches = 0
        if engine is not None:
            engine.window_start = stages(engine.it._stats.as_dict())
            self.load = self.load_now(engine)

    # -- the consumer ---------------------------------------------------------------------

    def stepped(self, called: float) -> None:
        """next() was called at ``called``: the consumer's step since the last batch."""
        if self.handed_at is not None:
            step = called - self.handed_at
            self.user += step
            self.e_user += step
            self.longest = max(self.longest, step)
            self.steps.append(step)
            self.handed_at = None

    def handed(self, now: float) -> None:
        """next() returned a batch at ``now``."""
        self.handed_at = now
        self.batches += 1
        self.e_batches += 1

    def waited(self, seconds: float) -> None:
        """The consumer waited ``seconds`` in next() for a batch."""
        self.wait += seconds
        self.e_wait += seconds

    def loaded(self, seconds: float, cpu: float, core_wait: float) -> None:
        """The main process loaded for ``seconds`` of wall time, ``cpu`` of them on a core and
        ``core_wait`` of them waiting for one (its thread's own clocks)."""
        self.work += seconds
        self.cpu += cpu
        self.core_wait += core_wait

    def cpu_share(self) -> Optional[float]:
        """The main process's loading's CPU share in the window (None: none loaded): its
        thread's CPU time over its wall time less its waits for a core. Other processes and
        threads that take the cores deschedule the loading, which is not its waiting (a busy
        machine would make CPU-bound loading read as I/O); the training step's own threads'
        CPU time is not the loading's (a process-wide clock would count it)."""
        if self.work <= 0:
            return None
        ran = self.work - self.core_wait
        return min(1.0, self.cpu / max(ran, self.cpu, 1e-9))

    def step(self) -> Optional[float]:
        """The consumer's median step in the window (None: none yet)."""
        return statistics.median(self.steps) if self.steps else None

    # -- when a window ends ---------------------------------------------------------------

    def ended(self, minimum: int, now: float) -> bool:
        """Whether the window has ``minimum`` batches (or what it holds out for), and its
        time: ``MIN_WINDOW_S`` (× its scale), what it holds out for, and ``LONG_STEPS`` of the
        consumer's longest step."""
        if self.batches < max(minimum, self.hold_batches):
            return False
        return now - self.started >= max(
            policy.MIN_WINDOW_S * self.scale,
            self.hold_s,
            policy.LONG_STEPS * max(self.last_longest, self.longest),
        )

    def grow(self) -> None:
        """A window that decided nothing: the next is twice as long (``STEADY_GROWTH``)."""
        self.scale = min(2 * self.scale, policy.STEADY_GROWTH)

    # -- the machine's load ---------------------------------------------------------------

    @staticmethod
    def load_now(engine: Engine) -> tuple:
        """(wall, the machine's CPU, this loader's CPU) now (``Window.others``)."""
        return (
            measure.clock(),
            measure.machine_cpu(),
            measure.loader_cpu(measure.worker_pids(engine.it)),
        )

    def others(self, engine: Engine) -> Optional[float]:
        """Cores other processes used since the window began (None: unknown)."""
        if self.load is None:
            return None
        wall0, machine0, own0 = self.load
        wall, machine, own = self.load_now(engine)
        if machine is None or machine0 is None or wall - wall0 < 0.8 * policy.MIN_WINDOW_S:
            return None  # (too few ticks to tell)
        return max(0.0, (machine - machine0) - (own - own0)) / (wall - wall0)

    # -- the epoch ------------------------------------------------------------------------

    def mark(self) -> tuple:
        """The epoch's (batches, wait, user) so far."""
        return self.e_batches, self.e_wait, self.e_user

    def served(self, engine: Engine, after_start: bool = False) -> tuple:
        """(batches, wait, user) of this epoch that ``engine`` served: since it began serving,
        or (``after_start``) since its first round, if it served ``MIN_WINDOW`` batches after."""
        start = engine.e_from
        warm = engine.warm_from
        if after_start and warm is not None and self.e_batches - warm[0] >= policy.MIN_WINDOW:
            start = warm
        return self.e_batches - start[0], self.e_wait - start[1], self.e_user - start[2]
