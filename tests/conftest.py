"""Shared pytest configuration, and the `engine` fixture (tests/_engines.py)."""

import os

import pytest
from _engines import Engine
from hypothesis import settings

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
