"""What fetches a loader's samples, as the `engine` fixture (tests/conftest.py) gives it to
a test."""

from __future__ import annotations

# Arguments that torch refuses without workers (prefetch_factor, persistent_workers: ValueError;
# a timeout: AssertionError at iter()): an engine without workers leaves them out.
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
