"""``loader.stats()`` of an auto iterator."""

from __future__ import annotations

from typing import Optional

from .. import _rloader
from .engines import STAGES, stages
from .learned import Learned


class AutoStats:
    """The consumer's times, measured by the auto iterator; the stages, summed over the
    epoch's engines; and ``auto``: the choices, when and why."""

    def __init__(self) -> None:
        self.own = _rloader.Stats()
        self.done = dict.fromkeys(STAGES, 0.0)  # of engines that have ended
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
            now = stages(engine.it._stats.as_dict())
            for k in STAGES:
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
        self.done = dict.fromkeys(STAGES, 0.0)
        for engine in self.live:
            engine.stages = stages(engine.it._stats.as_dict())
        self.decisions = []
        self.next_kind = self.next_workers = None
