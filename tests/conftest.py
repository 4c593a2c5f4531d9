"""Shared pytest configuration, the `engine` fixture (tests/_engines.py), `quick`
(num_workers="auto" deciding at once) and `busy_thread` (another thread of the process keeps
a core busy)."""

import hashlib
import os
import threading
import time

import pytest
from _engines import Engine
from hypothesis import settings

from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy

# In CI, hypothesis explores the same examples every run: a red build is reproducible, and a
# green one does not depend on luck.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


ENGINES = ["main", "process", "thread"]


@pytest.fixture(params=ENGINES)
def engine(request) -> Engine:
    """Each engine in turn. A test of worker behaviour narrows it with
    ``@pytest.mark.parametrize("engine", ["process", "thread"], indirect=True)``."""
    return Engine(request.param)


@pytest.fixture
def quick(monkeypatch):
    """num_workers="auto" decides after every MIN_WINDOW batches, whatever the wall time (from
    the first), on 4 cores; under worker_type="auto" the GIL probe, which reads the wall time,
    gives no verdict (the tests that check it use the real one): threads first, unless the
    loading reads as holding its CPU (``holds_cpu``: a fake clock that is the CPU clock too)."""
    monkeypatch.setattr(auto_policy, "MIN_WINDOW_S", 0.0)
    monkeypatch.setattr(auto_policy, "GIL_PROBE_S", float("inf"))
    monkeypatch.setattr(auto_policy, "GIL_PROBE_WAIT_S", 0.0)  # (no window waits for it)
    monkeypatch.setattr(auto_policy, "LONG_STEPS", 0)
    monkeypatch.setattr(auto_policy, "STEADY_GROWTH", 1)
    monkeypatch.setattr(auto_policy, "MAIN_WARM_BATCHES", 0)
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: None)  # the machine's load: unknown
    # (nor the loading's waits for a core)
    monkeypatch.setattr(auto_measure, "loading_clock", lambda: (time.thread_time(), 0.0))
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 4)


@pytest.fixture
def busy_thread():
    """Another thread of this process keeps a core busy without the GIL (hashlib releases it
    over large buffers), as a training step's intra-op threads do, from before the test body
    until its end (stopped and joined there, whatever happens)."""
    stop, started = threading.Event(), threading.Event()
    chunk = bytes(8 << 20)

    def spin():
        started.set()
        while not stop.is_set():
            hashlib.sha256(chunk).digest()

    thread = threading.Thread(target=spin, name="test-busy-thread", daemon=True)
    thread.start()
    assert started.wait(30)
    yield thread
    stop.set()
    thread.join(30)
