"""Samplers and a reader that tell how a loader advances its sampler and passes on errors."""

from __future__ import annotations

import threading

import torch.utils.data as tud

import rloader


def read_past_errors(loader):
    """Every batch and the type of every error, going on after each error as a user may."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except Exception as exc:
            out.append(type(exc).__name__)


class ThreadRecordingSampler(tud.Sampler):
    """Yields 0..n-1 and records the thread that advanced it each time."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.threads: list = []

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.threads.append(threading.current_thread().name)
            yield i


class CountingSampler(tud.Sampler):
    """Yields 0..n-1, counting how many it has yielded."""

    def __init__(self, n: int) -> None:
        self.n, self.drawn = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.drawn += 1
            yield i


class FailingSampler(tud.Sampler):
    """Yields 0..good-1, then raises IndexError."""

    def __init__(self, good: int) -> None:
        self.good = good

    def __len__(self) -> int:
        return 10

    def __iter__(self):
        yield from range(self.good)
        raise IndexError("sampler ran out of luck")


class CountedDraws(tud.Sampler):
    """Counts the keys drawn from ``sampler``."""

    def __init__(self, sampler):
        self.sampler, self.drawn = sampler, 0

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        for key in self.sampler:
            self.drawn += 1
            yield key


class StridingSampler(rloader.Sampler):
    """A user's sampler with its own state: it walks the data with a stride that changes each
    epoch, and says where it is through state_dict()/load_state_dict()."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __iter__(self):
        self.epoch += 1
        stride = [1, 3, 5, 7][self.epoch % 4]
        return iter([(i * stride) % self.n for i in range(self.n)])

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


class FailsToLoadOnce(StridingSampler):
    """A StridingSampler whose load_state_dict raises once (``failures`` times), then loads."""

    failures = 1

    def load_state_dict(self, state):
        if FailsToLoadOnce.failures:
            FailsToLoadOnce.failures -= 1
            raise RuntimeError("not yet")
        super().load_state_dict(state)


class SlowEpochThenQuick(tud.Sampler):
    """Samples 0-15 in the first epoch, 16-31 (no work at all) in each later one."""

    def __init__(self):
        self.epochs = 0

    def __len__(self):
        return 16

    def __iter__(self):
        start = 0 if self.epochs == 0 else 16
        self.epochs += 1
        return iter(range(start, start + 16))
