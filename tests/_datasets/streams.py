"""IterableDatasets: streams, shards, stateful streams."""

from __future__ import annotations

import math
import os

import torch
import torch.utils.data as tud

import rloader

from .timing import PurePython


class PlainRange(tud.IterableDataset):
    """range(start, end), from every worker (the duplicated data the documentation warns of)."""

    def __init__(self, start, end):
        super().__init__()
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


class MyIterableDataset(tud.IterableDataset):
    """The documentation's IterableDataset example: each worker yields its share."""

    def __init__(self, start, end):
        super().__init__()
        self.start, self.end = start, end

    def __iter__(self):
        worker_info = tud.get_worker_info()
        if worker_info is None:
            iter_start, iter_end = self.start, self.end
        else:
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
            iter_start = self.start + worker_info.id * per_worker
            iter_end = min(iter_start + per_worker, self.end)
        return iter(range(iter_start, iter_end))


def split_init_fn(worker_id):
    """The documentation's worker_init_fn that splits a PlainRange between the workers."""
    info = tud.get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


class ReportedFive(tud.IterableDataset):
    """Says 5, and every worker yields all 5: the mistake torch's warning is there for."""

    def __iter__(self):
        return iter(range(5))

    def __len__(self):
        return 5

    def __repr__(self):
        return "ReportedFive()"


class ShardedStream(tud.IterableDataset):
    """A stateful stream each worker reads its own shard of, of uneven lengths (the workers end
    at different times), with an epoch counter: a fresh pass (not a resumed one) starts the next
    epoch, whose items differ, so persistent workers' epochs differ from fresh workers'."""

    def __init__(self, n):
        self.n, self.epoch, self.next = n, 0, 0

    def __iter__(self):
        info = tud.get_worker_info()
        w, nw = (0, 1) if info is None else (info.id, info.num_workers)
        items = list(range(w, self.n + 12 * w, nw))
        if self.next == 0:
            self.epoch += 1
        while self.next < len(items):
            self.next += 1
            yield 1000 * self.epoch + items[self.next - 1]
        self.next = 0

    def state_dict(self):
        return {"epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state):
        self.epoch, self.next = state["epoch"], state["next"]


class Stream(tud.IterableDataset):
    """range(n), from every worker."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class SizedStream(Stream):
    """A Stream that says its length is 3."""

    def __len__(self):
        return 3


class ItemStream(tud.IterableDataset):
    """``items`` as a stream; with ``sized=False``, ``len()`` raises TypeError."""

    def __init__(self, items, sized=True):
        self.items = list(items)
        self.sized = sized

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        if not self.sized:
            raise TypeError("Stream has no length")
        return len(self.items)


class ShardedDicts(tud.IterableDataset):
    """{"x", "i"} dicts for i in 0..36, each worker its share."""

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter([{"x": torch.full((2,), float(i)), "i": i} for i in range(start, 37, step)])


class Shards(tud.IterableDataset):
    """Yields (sample, the num_workers of the worker yielding it), sharded by worker."""

    def __init__(self, clock=None, cost=0.0):
        self.clock, self.cost = clock, cost

    def __iter__(self):
        info = tud.get_worker_info()
        n, w = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(w, 40, n):
            if info is None and self.clock is not None:
                self.clock.now += self.cost
            yield torch.tensor([i, 0 if info is None else info.num_workers])


class PurePythonStream(tud.IterableDataset):
    """PurePython's samples as a stream, sharded by worker."""

    def __init__(self, n):
        self.items = PurePython(n)

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, len(self.items), step):
            yield self.items[i]


class StridedLayouts(tud.IterableDataset):
    """Yields whole batches (``batch_size=None``) of tensors that are not their storage's
    whole, in order: what a pre-batched pipeline or a custom collate_fn hands over."""

    def __iter__(self):
        x = torch.arange(8 * 3 * 4 * 5, dtype=torch.float32).view(8, 3, 4, 5)
        channels_last = x.contiguous(memory_format=torch.channels_last)
        base = torch.arange(40, dtype=torch.int64)
        yield {
            "channels_last": channels_last,
            "view": channels_last[:, 0],  # shares channels_last's storage
            "expanded": torch.ones(1, 16).expand(8, 16),
            "transposed": base.view(5, 8).t(),
            "offset": base[3:9],  # a contiguous view, not at its storage's start
            "strided": base[::3],
            "empty_view": base[5:5],
            "bfloat16": torch.ones(4, 6, dtype=torch.bfloat16).t(),
            "scalar_view": base[7],
        }


class RStream(rloader.IterableDataset):
    """ItemStream on rloader.IterableDataset rather than torch's."""

    def __init__(self, items):
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


class CountedStream(tud.IterableDataset):
    """tensor([0]), tensor([1]), ... counting in shared memory how many the workers produced."""

    def __init__(self, produced) -> None:
        self.produced = produced

    def __iter__(self):
        for i in range(1000):
            with self.produced.get_lock():
                self.produced.value += 1
            yield torch.tensor([i])


class UnevenStream(tud.IterableDataset):
    """Worker 0 yields 3 items, worker 1 yields 7 (a shard each)."""

    def __iter__(self):
        info = tud.get_worker_info()
        wid = info.id if info is not None else 0
        yield from (torch.tensor([100 * wid + i]) for i in range(3 + 4 * wid))


class DiesOnResume(tud.IterableDataset):
    """A worker's second iterator (a persistent worker's new epoch) kills the worker."""

    calls = 0

    def __iter__(self):
        DiesOnResume.calls += 1
        if DiesOnResume.calls >= 2:
            os._exit(3)
        info = tud.get_worker_info()
        return (torch.tensor([i]) for i in range(info.id, 8, info.num_workers))


class ThreeWorkerStream(tud.IterableDataset):
    """Worker 0 has no data; workers 1 and 2 yield 6 items each, counting them."""

    def __init__(self, produced) -> None:
        self.produced = produced

    def __iter__(self):
        info = tud.get_worker_info()
        if info.id == 0:
            return iter(())
        return self.items(info.id)

    def items(self, wid):
        for i in range(6):
            with self.produced.get_lock():
                self.produced.value += 1
            yield torch.tensor([wid * 100 + i])


class StatefulStream(rloader.IterableDataset):
    """An IterableDataset that says where it is, as torchdata's stateful datasets do."""

    def __init__(self, n):
        self.n, self.next = n, 0

    def __iter__(self):
        while self.next < self.n:
            self.next += 1
            yield self.next - 1
        self.next = 0

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


class PlainStream(rloader.IterableDataset):
    """range(n), each worker its strided share; no state of its own."""

    def __init__(self, n=37):
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class TorchdataStyleStream(tud.IterableDataset):
    """A stateful stream sharded by worker (its state: the next index), torchdata-style: a
    fresh iter() starts over unless load_state_dict was called just before."""

    def __init__(self, n=31):
        self.n, self.pos, self.loaded = n, None, False

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos, self.loaded = state["pos"], True

    def __iter__(self):
        info = tud.get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        i = self.pos if (self.loaded and self.pos is not None) else w
        self.loaded = False
        while i < self.n:
            self.pos = i + nw
            yield i
            i += nw


class UnpicklableStateStream(TorchdataStyleStream):
    """A TorchdataStyleStream whose state holds a generator object, which does not pickle."""

    def state_dict(self):
        return {"pos": self.pos, "cursor": (i for i in ())}
