"""``prefetch_factor="auto"``: a pool whose consumer waits though its workers keep up on
average (uneven batches or steps) takes more batches ahead, doubling up to ``PREFETCH_MAX``,
before it grows, within the memory budget (``policy.decide_prefetch``). In place: the engine's
scheduler changes its bound (``Scheduler::set_prefetch_factor``), and a process pool's region
has slots for ``PREFETCH_MAX`` from its start; pinned process pools keep theirs (the next pool
takes the new one)."""

from __future__ import annotations

from typing import Optional

from . import measure, policy
from .engines import Engine
from .learned import Learned
from .stats import AutoStats


class PrefetchTuning:
    """The batches in flight per worker of the auto iterator's pools: ``factor``, tuned when
    ``auto``, else the loader's own."""

    def __init__(
        self, learned: Learned, stats: AutoStats, auto: bool, fixed: Optional[int]
    ) -> None:
        self.learned = learned
        self.stats = stats
        self.auto = auto
        if auto:
            self.factor = learned.prefetch or policy.PREFETCH
        else:
            self.factor = fixed or policy.PREFETCH
        self.batch_bytes: Optional[int] = None  # measured at each window's first batch

    def measure(self, batch) -> None:
        """A window's first batch: its bytes bound how many may be in flight."""
        if self.auto:
            self.batch_bytes = measure.batch_nbytes(batch)

    def tune(self, engine: Engine, window: policy.Window) -> Optional[str]:
        """Changes ``engine``'s batches in flight per worker where ``window`` asks, in place (its
        scheduler draws more, or fewer as batches are handed out); a pool that cannot (pinned
        worker processes, whose pin thread owns the pool) keeps its own, and the next pool
        starts with the new one. Returns why it changed (a new window measures it); None: no
        change."""
        if not self.auto or engine.workers == 0 or engine.prefetch_fixed:
            return None
        asked = policy.decide_prefetch(window)
        if asked is None:
            return None
        prefetch, why = asked
        self.factor = self.learned.prefetch = prefetch  # the next pools'
        setter = getattr(engine.it, "_set_prefetch_factor", None)
        if setter is None:
            engine.prefetch_fixed = True
            why += "; from the next pool on"
        else:
            setter(prefetch)
            engine.prefetch = self.stats.prefetch = prefetch
        return f"prefetch_factor {prefetch}: {why}"
