"""What the num_workers="auto" tests share: scripted decisions, fake clocks, stand-in
engines and the loaders they read (the datasets are tests/_datasets/'s)."""

import time

import torch
from _children import thread_names
from _datasets import (
    SquarePairs,
)

import rloader
from rloader import _rloader
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy
from rloader._engines import dispatch

N = 96


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def scripted(monkeypatch, plan):
    """``decide`` answers ``plan[k]`` at its k-th call (None: keep), then None."""
    calls = []

    def decide(window):
        calls.append(window)
        k = len(calls) - 1
        target = plan[k] if k < len(plan) else None
        if target is None or target == window.workers:
            return None
        return auto_policy.Decision(target, f"scripted {k}")

    monkeypatch.setattr(auto_policy, "decide", decide)
    return calls


def loader_of(num_workers, seed, batch_size=2, shuffle=True, n=N, **kw):
    return rloader.DataLoader(
        SquarePairs(n),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        **kw,
    )


def batches(loader, epochs=1):
    out = []
    for _ in range(epochs):
        out.append([b.tolist() for b in loader])
    return out


def chosen(loader):
    return [d["num_workers"] for d in loader.stats()["auto"]["decisions"]]


def fake_clock(monkeypatch):
    """Times in the main process are the test's: wall and CPU time both (so the work holds its
    CPU: no more workers than cores), the process's too; no wait for a core."""
    clock = FakeClock()
    monkeypatch.setattr(auto_measure, "clock", clock)
    monkeypatch.setattr(auto_measure, "loading_clock", lambda: (clock.now, 0.0))
    monkeypatch.setattr(auto_measure, "process_clock", clock)
    return clock


def ticking_clock(monkeypatch):
    """The loader's clock, each reading 1 s more than the last."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(auto_measure, "clock", lambda: float(next(ticks)))


def outcomes(loader):
    """Each batch of an epoch, or the last line of the error raised in its place."""
    out, it = [], iter(loader)
    for _ in range(len(loader)):
        try:
            out.append(next(it).tolist())
        except ValueError as e:
            out.append(str(e).splitlines()[-1])
    return out


def window(**kw):
    base = dict(
        batches=10,
        wait_s=0.0,
        user_s=0.1,
        work_s=0.01,
        cpu_s=None,
        workers=0,
        kind="process",
        cores=8,
        budget=1 << 40,
        per_worker=1 << 20,
        remaining=None,
        prefetch=2,
    )
    base.update(kw)
    return auto_policy.Window(**base)


class _Any:
    def __eq__(self, other):
        return isinstance(other, str)


ANY_REASON = _Any()


class SlowEngine:
    """An engine whose batches from workers each take ``cost`` of the fake clock to arrive
    (the clock stands still while the consumer really waits)."""

    def __init__(self, it, clock, cost):
        self.it, self.clock, self.cost = it, clock, cost

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.it)
        self.clock.now += self.cost() if callable(self.cost) else self.cost
        return batch

    def __getattr__(self, name):
        return getattr(self.it, name)


def slow_pools(monkeypatch, clock, cost, creation=0.0):
    """Pools whose batches each keep the consumer waiting ``cost`` (or ``cost()``); starting
    one takes ``creation`` per worker (of the fake clock)."""

    real = dispatch.engine

    def engine(view, keys, base_seed, kind):
        it = real(view, keys, base_seed, kind)
        if view.num_workers == 0:
            return it
        clock.now += creation * view.num_workers
        return SlowEngine(it, clock, cost)

    monkeypatch.setattr(dispatch, "engine", engine)


def recorded_windows(monkeypatch):
    windows = []
    real = auto_policy.decide

    def decide(window):
        windows.append(window)
        return real(window)

    monkeypatch.setattr(auto_policy, "decide", decide)
    return windows


def stepped(loader, clock, step=0.001):
    out = []
    for b in loader:
        out.append(b.tolist())
        clock.now += step
    return out


def tight_budget(monkeypatch):
    """A budget of 300 MiB, each worker process 100 MiB: pools of 2 and 3 do not fit together."""
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "300M")
    monkeypatch.setattr(auto_measure, "process_memory", lambda pid: 100 << 20)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 100 << 20)


def probed(load, seconds=0.05):
    """The real GIL probe's ``share()`` over ``seconds`` of ``load()`` calls."""
    probe = _rloader.GilProbe(auto_policy.GIL_PROBE_PERIOD_S)
    try:
        while probe.share()[2] < seconds:
            probe.loading(True)
            try:
                load()
            finally:
                probe.loading(False)
        return probe.share()
    finally:
        probe.stop()


def probe_threads():
    """This process's threads named as the GIL probe's."""
    return thread_names("rloader-gil")


class ScriptedProbe:
    """A GIL probe that reads ``blocked`` of its time blocked, over 1 ms of loading a batch."""

    def __init__(self, blocked):
        self.blocked, self.loading_s, self.stopped = blocked, 0.0, False

    def loading(self, loading):
        assert not self.stopped
        self.loading_s += 0.001 if loading else 0.0

    def share(self):
        return self.blocked * self.loading_s, self.loading_s, self.loading_s

    def stop(self):
        self.stopped = True


def until(condition, seconds=30.0):
    """Whether ``condition()`` held within ``seconds`` (checked every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
