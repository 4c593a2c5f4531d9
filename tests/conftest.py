"""Shared pytest configuration, and the `engine` fixture."""

import os

import pytest
from hypothesis import settings

# In CI, hypothesis explores the same examples every run: a red build is reproducible, and a
# green one does not depend on luck.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


# Arguments that torch refuses without worker processes (ValueError): an engine without
# workers leaves them out.
_WORKERS_ONLY = ("prefetch_factor", "persistent_workers", "timeout")


class Engine:
    """Where a loader's samples are fetched: "main" (num_workers=0, in the iterating thread),
    "process" (worker processes) or "thread" (worker threads, worker_type="thread")."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Engine({self.name!r})"

    @property
    def has_workers(self) -> bool:
        return self.name != "main"

    @property
    def worker_words(self) -> str:
        """How a worker's error names it: "worker process" or "worker thread"."""
        return f"worker {self.name}"

    def kwargs(self, num_workers: int = 2, **loader_kwargs) -> dict:
        """rloader.DataLoader's arguments on this engine: `num_workers` workers (none for
        "main"; arguments torch refuses without workers are left out there)."""
        if not self.has_workers:
            return {"num_workers": 0, **{k: v for k, v in loader_kwargs.items()
                                         if k not in _WORKERS_ONLY}}  # fmt: skip
        kwargs = {"num_workers": num_workers, **loader_kwargs}
        if self.name == "thread":
            kwargs["worker_type"] = "thread"
        return kwargs

    def torch_kwargs(self, num_workers: int = 2, **loader_kwargs) -> dict:
        """torch.utils.data.DataLoader's arguments for the same loader: torch's own engine,
        worker processes standing in for threads (torch has none)."""
        kwargs = self.kwargs(num_workers, **loader_kwargs)
        kwargs.pop("worker_type", None)
        return kwargs


ENGINES = ["main", "process", "thread"]


@pytest.fixture(params=ENGINES)
def engine(request) -> Engine:
    """Each engine in turn. A test of worker behaviour narrows it with
    ``@pytest.mark.parametrize("engine", ["process", "thread"], indirect=True)``."""
    return Engine(request.param)
