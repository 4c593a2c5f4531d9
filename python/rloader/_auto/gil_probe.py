"""The GIL probe's session (``worker_type="auto"``): while the kind is undecided, a thread
asks for the GIL while the main process loads and times its waits (``GilProbe``,
rloader-workers' gil_probe.rs). Loading in which a second thread could not take the GIL
starts processes (``KindChoice.probe_gil``). The probe stops before any pool starts (its
thread is not forked into workers) and at the epoch's end."""

from __future__ import annotations

from typing import Any, Optional

from .. import _rloader
from . import measure, policy
from .engines import Engine
from .learned import Learned


class GilProbeSession:
    """The probe of one auto iterator, while it runs; its figures add up across epochs in
    ``Learned.gil``."""

    def __init__(self, learned: Learned, kind_fixed: Optional[str]) -> None:
        self.learned = learned
        self.kind_fixed = kind_fixed
        self.probe: Optional[Any] = None
        self.start_from: tuple = (0.0, 0.0, 0.0)  # Learned.gil when this probe started
        # (the last window was busy: the probe does not ask, ``start``)
        self.paused = False

    def start(self) -> Optional[Any]:
        """The probe, started at the main process's first batch while the kind is undecided,
        to load under (None: no probe, or ``paused``: while other processes load the machine
        its verdict is not read, and a probe descheduled with the GIL in hand would stall
        the loading, whose CPU share decides then)."""
        if self.probe is None and self.kind_fixed is None and self.learned.kind is None:
            self.start_from = self.learned.gil or (0.0, 0.0, 0.0)
            self.probe = _rloader.GilProbe(policy.GIL_PROBE_PERIOD_S)
        return None if self.paused else self.probe

    def read(self) -> Optional[tuple]:
        """The probe's (seconds blocked, its seconds observed, seconds of loading), with those
        of earlier epochs' probes (``Learned.gil``)."""
        if self.probe is None:
            return None
        now = self.probe.share()
        if now[1] <= 0:
            return None
        gil = tuple(a + b for a, b in zip(self.start_from, now))
        self.learned.gil = gil
        return gil

    def stop(self) -> None:
        if self.probe is not None:
            self.read()
            self.probe.stop()
            self.probe = None

    def had_its_say(self, gil: Optional[tuple], window_started: float) -> bool:
        """Whether the probe had its say: ``GIL_PROBE_S`` of loading probed, or the window
        (begun at ``window_started``) waited ``GIL_PROBE_WAIT_S`` for it, or it has stopped."""
        if self.probe is None or (gil is not None and gil[2] >= policy.GIL_PROBE_S):
            return True
        return measure.clock() - window_started >= policy.GIL_PROBE_WAIT_S

    def hold(self, engine: Engine, now: float, window_started: float) -> Optional[float]:
        """How long the main process's window that would start a pool goes on, so that the
        probe reads ``GIL_PROBE_S`` of loading, for at most ``GIL_PROBE_WAIT_S`` (a busy
        machine stretches a window's loading thin); None: it need not."""
        if engine.workers or self.probe is None or self.learned.kind is not None:
            return None
        gil = self.learned.gil
        if gil is not None and gil[2] >= policy.GIL_PROBE_S:
            return None
        if now - window_started >= policy.GIL_PROBE_WAIT_S:
            return None
        return now - window_started + policy.GIL_PROBE_S

    @staticmethod
    def loading(engine: Engine, probe: Optional[Any]):
        """``engine``'s next batch, loaded under ``probe`` (if one runs)."""
        if probe is None:
            return engine.next()
        probe.loading(True)
        try:
            return engine.next()
        finally:
            probe.loading(False)
