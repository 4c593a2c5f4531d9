"""Shared pytest configuration, the `engine` fixture (tests/_engines.py), and `quick`
(num_workers="auto" deciding at once)."""

import os

import pytest
from _engines import Engine
from hypothesis import settings

from rloader import _auto

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
    the first), on 4 cores."""
    monkeypatch.setattr(_auto, "MIN_WINDOW_S", 0.0)
    monkeypatch.setattr(_auto, "LONG_STEPS", 0)
    monkeypatch.setattr(_auto, "STEADY_GROWTH", 1)
    monkeypatch.setattr(_auto, "MAIN_WARM_BATCHES", 0)
    monkeypatch.setattr(_auto, "machine_cpu", lambda: None)  # the machine's load: unknown
    monkeypatch.setattr(_auto, "usable_cores", lambda: 4)
