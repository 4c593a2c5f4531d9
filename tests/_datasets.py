"""Datasets (and worker_init_fns) that several test files, and the scripts they run in child
processes, load: defined once, importable by name from a worker process under any start
method."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.utils.data as tud

import rloader


class Squares(tud.Dataset):
    """A dict per sample, of every leaf kind collate knows: a tensor, an int, a str, an array."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i * i)), "i": i, "name": f"s{i}", "a": np.arange(2) + i}


class AsyncSquares(tud.Dataset):
    """Squares, with ``async def __getitem__``."""

    def __init__(self, n=37):
        self.sync = Squares(n)

    def __len__(self):
        return len(self.sync)

    async def __getitem__(self, i):
        await asyncio.sleep(0.001 * (i % 3))  # samples finish out of order
        return self.sync[i]


class AsyncBatches(AsyncSquares):
    """AsyncSquares with ``async def __getitems__``, which is used instead when present."""

    async def __getitems__(self, keys):
        return [self.sync[i] for i in keys]

    async def __getitem__(self, i):
        raise AssertionError("__getitems__ is used when present")


class Ints(tud.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


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


class Failing(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i


def failing_init(worker_id):
    raise KeyError("no init")


class Slow(tud.Dataset):
    """4 samples of 3 s each: a loader that is still running when a test interrupts it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(3)
        return i


class Dies(tud.Dataset):
    """Its worker dies at sample 3: `how` is "exitN" (os._exit(N)), "sysexitN" (sys.exit(N),
    as a library may call), "interrupt" (KeyboardInterrupt raised) or a signal's name (the
    worker sends it to itself), having written when (time.monotonic(), one clock for every
    process) to the file `stamp`, if given: how long the loader took to notice is measured
    from there, not from a start that a loaded machine can make slow."""

    def __init__(self, how, stamp=None):
        self.how = how
        self.stamp = stamp

    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 3:
            if self.stamp is not None:
                with open(self.stamp, "w") as f:
                    f.write(repr(time.monotonic()))
            if self.how.startswith("exit"):
                os._exit(int(self.how[4:]))
            if self.how.startswith("sysexit"):
                sys.exit(int(self.how[7:]))
            if self.how == "interrupt":
                raise KeyboardInterrupt
            os.kill(os.getpid(), getattr(signal, self.how))
            time.sleep(5)  # (a handled signal, as torch's workers handle SIGSEGV and SIGBUS)
        return i


class Unpicklable:
    """Pickles in a worker; fails to unpickle in the main process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __reduce__(self):
        return (_rebuild_only_in_a_worker, (self.pid,))


_MAIN_PID = os.getpid()


def _rebuild_only_in_a_worker(pid: int):
    if os.getpid() == _MAIN_PID:
        raise ValueError("cannot rebuild here")
    return Unpicklable(pid)


class BadAtTwo(tud.Dataset):
    """Sample 2 comes back from a worker process as a batch that cannot be unpickled."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return Unpicklable(os.getpid()) if i == 2 else i


class RefersToItsLoader(tud.Sampler):
    """A sampler that a test points back at its loader: a reference cycle through the loader's
    iterator."""

    loader = None

    def __len__(self) -> int:
        return 20

    def __iter__(self):
        return iter(range(20))


class ReportedFive(tud.IterableDataset):
    """Says 5, and every worker yields all 5: the mistake torch's warning is there for."""

    def __iter__(self):
        return iter(range(5))

    def __len__(self):
        return 5

    def __repr__(self):
        return "ReportedFive()"


class PoolViews(tud.Dataset):
    """(uint8 [3, 64, 64] view into a pool, index): 12 KiB samples, 768 KiB batches of 64."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool = np.random.default_rng(0).integers(0, 255, (32, 3, 64, 64), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.pool[i % 32], i


class PoolTensors(PoolViews):
    """PoolViews' samples as tensors over a pool of 32, of `shape` and `dtype`, with batches of
    64 over the 1 MiB from which unpinned tensor batches are stacked into recycled memory: by
    default float32 [3, 100, 100] items, under torch's grain (32768 elements: items the
    single-process loop's stack helpers split); uint8 [3, 160, 160] ones torch copies on its
    own threads."""

    def __init__(self, n: int, shape=(3, 100, 100), dtype=np.float32) -> None:
        self.n = n
        rng = np.random.default_rng(0)
        self.pool = rng.integers(0, 255, (32, *shape)).astype(dtype)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.pool[i % 32]), i


class Labelled(tud.Dataset):
    """Paths, labels and class names, as a typical image dataset holds them: in Python lists
    and a dict, or in rloader.shared's containers (the same samples either way). A sample is
    (path, label, class index of its folder); `__getitems__` reads a batch in one call."""

    def __init__(self, paths, labels, classes):
        self.paths, self.labels, self.classes = paths, labels, classes

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        return path, self.labels[i], self.classes[path.split("/")[1]]


class SeedOfReader(tud.Dataset):
    """Sample i: (i, the seed of the worker that read it, ``get_worker_info().seed``; -1 in the
    main process), so that a test sees each epoch's worker seeds with its order."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return i, -1 if info is None else info.seed


def draws_generator() -> torch.Generator:
    """Where a sample's random draws come from, as rloader.vision draws them: a thread
    worker's own generator (``get_worker_info().rng``), else torch's global one."""
    info = tud.get_worker_info()
    if info is not None and getattr(info, "worker_method", None) == "thread":
        return info.rng.torch_generator
    return torch.default_generator


class Augmenting(tud.Dataset):
    """Sample i: ``[i, a random draw]`` (as an augmentation makes one). Its state (torchdata's
    convention for a map-style dataset) is where its draws are, in a worker (the main
    process's generator is the user's): resumed from it, a worker draws what it would have."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, int(torch.randint(0, 1 << 30, (), generator=draws_generator()))])

    def state_dict(self):
        return {} if tud.get_worker_info() is None else {"rng": draws_generator().get_state()}

    def load_state_dict(self, state):
        if "rng" in state:
            draws_generator().set_state(state["rng"])


class StateFails(SeedOfReader):
    """A map-style dataset whose ``state_dict()`` raises (a method it has for another use)."""

    def state_dict(self):
        raise NotImplementedError("no state here")

    def load_state_dict(self, state):
        raise NotImplementedError("no state here")


class StateUnpicklable(SeedOfReader):
    """A map-style dataset whose state does not pickle."""

    def state_dict(self):
        return {"how": lambda: None}

    def load_state_dict(self, state):
        pass


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


class Whereabouts(tud.Dataset):
    """Where each sample was read: (pid, inode of the container's memfd as the process that
    read it maps it, the item)."""

    def __init__(self, container):
        self.container = container

    def __len__(self):
        return len(self.container)

    def __getitem__(self, i):
        return os.getpid(), self.container._inode, self.container[i]


def labelled_items(n: int):
    """`n` paths in 10 class folders, their labels, and the class index of each folder."""
    paths = [f"data/class{i % 10}/img_{i:07d}.jpg" for i in range(n)]
    labels = [i % 10 for i in range(n)]
    classes = {f"class{c}": c for c in range(10)}
    return paths, labels, classes


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


class IntTensors(tud.Dataset):
    """[i] tensors; sample ``bad`` raises KeyError."""

    def __init__(self, n=20, bad=None):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"sample {i} is missing")
        return torch.tensor([i])


# -- num_workers="auto" (tests/test_auto_*.py) ---------------------------------------------


class SquarePairs(tud.Dataset):
    """[i, i * i] tensors; the main process's fetch of each advances ``clock`` by ``cost``
    (num_workers="auto"'s measured work), and sample ``fail_at`` raises."""

    def __init__(self, n=96, clock=None, cost=0.0, fail_at=None):
        self.n, self.clock, self.cost, self.fail_at = n, clock, cost, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"bad sample {i}")
        if self.clock is not None and tud.get_worker_info() is None:
            self.clock.now += self.cost  # the main process's fetch "takes" cost seconds
        return torch.tensor([i, i * i])


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


def record_init(worker_id):
    info = tud.get_worker_info()
    with open(os.environ["RLOADER_TEST_INIT_LOG"], "a") as f:
        f.write(f"{info.num_workers} {worker_id} {info.id} {info.seed}\n")


class Blocks(SquarePairs):
    """Batches from sample 8 on wait for ``release`` (set by the test once it has its error)."""

    def __init__(self, release):
        super().__init__()
        self.release = release

    def __getitem__(self, i):
        if i >= 8:
            self.release.wait(60)  # (bounded: a wrong engine here fails the test, not hangs it)
        return super().__getitem__(i)


class PurePython(tud.Dataset):
    """About 0.2 ms of pure Python a sample: loading that holds the GIL."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        total = 0
        for k in range(3000):
            total += k * i
        return total % 997


class SaysGilFree(PurePython):
    """PurePython that says its loading runs without the GIL (as rloader.vision's folders do
    where Rust makes whole batches): ``num_workers="auto"`` takes its word for it."""

    _rloader_loads_without_gil = True


class Waiting(PurePython):
    """0.5 ms of waiting a sample: loading that lets its core go."""

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.tensor([i, i * i])


class LongWaits(PurePython):
    """2 ms of waiting a sample: loading that clearly lets its core go, its CPU share a few
    percent even beside busy processes (which make each call's CPU time grow: Waiting's
    0.5 ms read 0.1-0.25 on Python 3.9 there)."""

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i, i * i])


class PurePythonStream(tud.IterableDataset):
    """PurePython's samples as a stream, sharded by worker."""

    def __init__(self, n):
        self.items = PurePython(n)

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, len(self.items), step):
            yield self.items[i]


class SquareInts(tud.Dataset):
    """A plain torch map-style dataset (no __getitems__)."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        if not -self.n <= i < self.n:
            raise IndexError(f"Squares index {i} out of range")
        return (i % self.n) ** 2

    def __len__(self):
        return self.n


class UnpicklableDataset(tud.Dataset):
    """A dataset (and keys) that cannot be pickled: worker processes under spawn could not
    take it; threads need nothing pickled."""

    def __init__(self):
        self.lock = threading.Lock()

    def __len__(self):
        return 6

    def __getitem__(self, key):
        with self.lock:
            return key() if callable(key) else key


class SamplesOfKind(tud.Dataset):
    """Sample i as a ``kind``: "tensor" (a (tensor, int) pair), "numpy" (a uint8 array) or a dict."""

    def __init__(self, n: int, kind: str) -> None:
        self.n = n
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.kind == "tensor":
            return torch.full((3, 8, 8), float(i)), i
        if self.kind == "numpy":
            return np.full((3, 8, 8), i % 256, dtype=np.uint8)
        return {
            "x": torch.full((4,), float(i)),
            "y": np.full((2,), i, dtype=np.int32),
            "name": str(i),
            "n": i,
        }


class MadeSamples(tud.Dataset):
    """Sample i: ``make(i)``; 48 KiB float32 images by default, so a batch of 25 is past the
    1 MiB from which a batch is split."""

    def __init__(self, make=None, n: int = 230) -> None:
        self.make = make or (lambda i: torch.full((3, 64, 64), float(i)))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.make(i)


class ListIndexedRows(tud.Dataset):
    """Indexed by lists of indices: for a BatchSampler given as the sampler."""

    def __len__(self):
        return 37

    def __getitem__(self, rows):
        return torch.tensor(rows) * 10


class FloatRows(tud.Dataset):
    """Each sample a distinct [256] float row (1 KiB): batches of 16 fill 16 KiB of a slot."""

    def __init__(self, n: int = 96, width: int = 256) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((self.width,), float(i))


class FrozenCount(tud.Dataset):
    """Each sample is how many objects the process holds in the permanent generation
    (`gc.freeze()`): a forked worker's share of what it inherited."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import gc

        return torch.tensor([gc.get_freeze_count()])


class TokenRows(tud.Dataset):
    """Token ids of a tiny causal language model, labelled with themselves (what a
    transformers.Trainer trains on): row i counts by i + 1 modulo the vocabulary."""

    VOCAB = 32

    def __init__(self, n=24, length=8):
        self.n, self.length = n, length

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = (torch.arange(self.length) * (i + 1) + i) % self.VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


# Wrappers of a dataset's __getitems__ (tests/test_vision.py: the batch it made, collated).


class ReversedBatch(tud.Dataset):
    """A wrapper that reverses the batch its dataset's __getitems__ made, in place."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitems__(self, indices):
        samples = self.ds.__getitems__(indices)
        samples.reverse()
        return samples


class CachedBatch(ReversedBatch):
    """A wrapper that makes its first batch once and hands it out again."""

    def __getitems__(self, indices):
        if not hasattr(self, "batch"):
            self.batch = self.ds.__getitems__(indices)
        return self.batch


class LoaderInGetitems(tud.Dataset):
    """A dataset whose __getitems__ iterates another loader (collate_fn=list) of ``ds``."""

    def __init__(self, ds, loader_type):
        self.ds, self.loader_type, self.inner = ds, loader_type, []

    def __len__(self):
        return 4

    def __getitems__(self, indices):
        loader = self.loader_type(self.ds, batch_size=2, collate_fn=list)
        self.inner += [type(b) for b in loader]
        return [(torch.zeros(3), i) for i in indices]


# -- moved out of the test files that used them (issue #38) ------------------------------


class Pairs(tud.Dataset):
    """{"x": a [3] tensor of i, "i": i} per sample."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "i": i}


class GetItems(tud.Dataset):
    """Fetches only through __getitems__ (sample k is k * 10), recording each call's keys."""

    def __init__(self):
        self.calls = []

    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise AssertionError("__getitems__ should have been used")

    def __getitems__(self, keys):
        self.calls.append(list(keys))
        return [k * 10 for k in keys]


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


class ViewsOfLarge(tud.Dataset):
    """Items are views into one 8 MB tensor (as TensorDataset's are)."""

    def __init__(self) -> None:
        self.data = torch.arange(1 << 20, dtype=torch.float64).view(-1, 64)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return self.data[i * 3 : i * 3 + 2, ::2]


class Batched(tud.Dataset):
    """A torch dataset that fetches batches itself and records the calls."""

    def __init__(self, n):
        self.n = n
        self.batched_calls = []

    def __getitem__(self, i):
        return ("one", i)

    def __getitems__(self, indices):
        self.batched_calls.append(list(indices))
        return [("many", i) for i in indices]

    def __len__(self):
        return self.n


class ShortBatched(Batched):
    """Batched whose __getitems__ returns one sample fewer than asked for."""

    def __getitems__(self, indices):
        return [("many", i) for i in indices[:-1]]


class RStream(rloader.IterableDataset):
    """ItemStream on rloader.IterableDataset rather than torch's."""

    def __init__(self, items):
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


INITS: dict = {}


def counting_init(worker_id):
    """Records, per worker, the thread each worker_init_fn call ran on."""
    key = (os.getpid(), worker_id)
    INITS.setdefault(key, []).append(threading.get_ident())


class WhoFetches(tud.Dataset):
    """(worker, the thread that fetched the sample, that worker's init calls so far)."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        key = (os.getpid(), tud.get_worker_info().id)
        return key, threading.get_ident(), list(INITS.get(key, []))


class IntraOpThreads(tud.Dataset):
    """What `torch.get_num_threads()` says where each sample is fetched."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.get_num_threads()


class SlowAfterFirst(tud.Dataset):
    """Item 0 at once, every other item after `delay` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i:
            threading.Event().wait(self.delay)
        return torch.tensor([i])


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


class ByteArrays(tud.Dataset):
    """Sample i: 16 KiB of numpy uint8, all i % 251: a batch of 16 is a 256 KiB block."""

    def __init__(self, n: int = 96, size: int = 1 << 14) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full(self.size, i % 251, dtype=np.uint8)


class Vectors(tud.Dataset):
    """Sample i: a float32 tensor of 8192 values (32 KiB), all i; ``dtypes`` cycles per sample,
    ``grad`` makes them require grad."""

    def __init__(self, n: int = 96, dtypes=(torch.float32,), grad: bool = False) -> None:
        self.n, self.dtypes, self.grad = n, dtypes, grad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.full((8192,), float(i), dtype=self.dtypes[i % len(self.dtypes)])
        return x.requires_grad_() if self.grad else x


class ChannelsLast(tud.Dataset):
    """Sample i: a float32 [2, 8, 16, 16] tensor in channels-last memory format (16 KiB), all i:
    torch.stack keeps that format, so its batch is not contiguous."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        return torch.full((2, 8, 16, 16), float(i)).to(memory_format=torch.channels_last)


class VaryingArrays(tud.Dataset):
    """Batch k (of 16) holds samples of 16 KiB + (k % 6) * 512 bytes: six sizes, 256 to 296 KiB
    a batch, in turn."""

    def __len__(self) -> int:
        return 16 * 36

    def __getitem__(self, i: int):
        return np.full((1 << 14) + 512 * (i // 16 % 6), i % 251, dtype=np.uint8)


class Slowed(tud.Dataset):
    """``dataset``'s samples, each 2 ms late: batches that arrive while the last is in use."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return self.dataset[i]


class FilledArrays(tud.Dataset):
    """Sample i: 64 KiB of numpy uint8, all i % 251, so that every batch differs from the next."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int):
        return np.full(1 << 16, i % 251, dtype=np.uint8)


class FilledTensors(FilledArrays):
    """The same samples as tensors (stacked into the block rather than copied into it)."""

    def __getitem__(self, i: int):
        return torch.full((1 << 16,), i % 251, dtype=torch.uint8)


class GrowingRows(tud.Dataset):
    """Sample i is i+1 KiB: later batches need more of their slot."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.full((256 * (1 + i * 40),), float(i))


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


class Gated(tud.Dataset):
    """Index i -> i, after a delay that varies with i; the indices in `gates` wait until their
    gate's file exists, so that a test holds one batch back and others overtake it."""

    def __init__(self, n, gates=None):
        self.n, self.gates = n, dict(gates or {})

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        gate = self.gates.get(i)
        deadline = time.monotonic() + 30
        while gate is not None and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.001 * (i % 4))
        return i


class MiBRows(tud.Dataset):
    """1 MiB tensors: a batch of 4 needs 4 MiB of slot."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        return torch.full((256, 1024), float(i)), i


class Sleepy(tud.Dataset):
    """16 samples of (zeros(2), i), each taking ``seconds`` to fetch."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 16

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.zeros(2), i


class SlowThenQuick(Sleepy):
    """32 samples: each of the first 16 takes ``seconds`` to fetch, the others nothing."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return super().__getitem__(i) if i < 16 else (torch.zeros(2), i)


class AsyncSleepy(Sleepy):
    """Sleepy, with ``async def __getitem__``."""

    async def __getitem__(self, i):
        time.sleep(self.seconds)  # (blocking on purpose: a known least duration)
        return torch.zeros(2), i


class LocalErrorDataset(tud.Dataset):
    """Sample 2 raises an exception of a class defined in __getitem__: pickle cannot find it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        class OddError(Exception):  # a type pickle cannot find by name
            pass

        if i == 2:
            raise OddError("sample 2 is odd")
        return i


class SeedReport(tud.Dataset):
    """Where a worker's seeds went: its info's id, num_workers and seed, torch.initial_seed(),
    and one draw of random, numpy and torch's global generators."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return (
            info.id,
            info.num_workers,
            info.seed,
            torch.initial_seed(),
            random.random(),
            float(np.random.random()),
            float(torch.rand(())),
        )


class ExitsCleanly(tud.Dataset):
    """Its last sample ends the worker with code 0, once the worker was told to stop."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 7:
            os._exit(0)
        return i


class LongStrings(tud.Dataset):
    """200,000 strings of about 200 characters: large tasks, large answers."""

    def __len__(self) -> int:
        return 200_000

    def __getitem__(self, i: int) -> str:
        return "x" * 200 + str(i)


class OneSlowSample(tud.Dataset):
    """Sample 0 takes 5 s, every other 10 ms."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int):
        time.sleep(5 if i == 0 else 0.01)
        return i


class SentFirstBatch(tud.Dataset):
    """Squares whose worker 0 sets ``sent`` on reading its second batch's first index: by then
    it has sent its first batch (a worker answers its tasks one after the other)."""

    def __init__(self, sent, second_batch_start: int) -> None:
        self.sent, self.second_batch_start = sent, second_batch_start

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        info = tud.get_worker_info()
        if info is not None and info.id == 0 and i == self.second_batch_start:
            self.sent.set()
        return i * i


class ZeroWaitsForTheRest(tud.Dataset):
    """Sample 0 waits until every other sample has been fetched: in order, nothing after it
    can be handed out first; out of order, the rest may come while it waits."""

    def __init__(self, n):
        self.n = n
        self.others = threading.Semaphore(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 0:
            for _ in range(self.n - 1):
                assert self.others.acquire(timeout=30)
        else:
            self.others.release()
        return i


class Concurrent(tud.Dataset):
    """Each sample waits until `parties` samples are being fetched at once."""

    def __init__(self, n, parties):
        self.n = n
        self.barrier = threading.Barrier(parties, timeout=30)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.barrier.wait()  # raises BrokenBarrierError if fewer are ever in flight at once
        return i


class InfoReport(tud.Dataset):
    """What get_worker_info() says in a worker thread, and whether the fetch runs off the main
    thread."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        theirs = tud.get_worker_info()
        ours = rloader.get_worker_info()
        return (
            theirs is ours,
            theirs.id,
            theirs.num_workers,
            theirs.seed,
            getattr(theirs, "worker_method", None),  # (torch < 2.15 workers have none)
            theirs.dataset is self,
            threading.current_thread() is not threading.main_thread(),
        )


class RngReport(tud.Dataset):
    """A draw from each of a worker's own generators (info.rng), with the worker's id and seed."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        info = tud.get_worker_info()
        rng = info.rng
        fresh = random.Random(info.seed).random()
        return (
            info.id,
            rng.random_generator.random(),
            float(torch.rand((), generator=rng.torch_generator)),
            float(rng.numpy_generator.random()),
            rng.torch_generator.initial_seed() == info.seed,
            fresh,
        )


class CountsFetches(tud.Dataset):
    """1000 samples of 20 ms each, counting the fetches (in a list each worker thread's shallow
    copy shares)."""

    def __init__(self):
        self.calls = [0]  # a list: each worker thread's shallow copy shares it

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        self.calls[0] += 1
        time.sleep(0.02)
        return i


class AllAtOnce(tud.Dataset):
    """Each sample waits until `expected` samples are awaited at the same time (the count is
    in a list: each worker thread has a shallow copy of the dataset, and the list is shared)."""

    def __init__(self, n, expected):
        self.n, self.expected = n, expected
        self.lock = threading.Lock()
        self.in_flight = [0]

    def __len__(self):
        return self.n

    async def __getitem__(self, i):
        with self.lock:
            self.in_flight[0] += 1
        deadline = time.monotonic() + 30
        while self.in_flight[0] < self.expected:
            assert time.monotonic() < deadline, f"only {self.in_flight[0]} samples in flight"
            await asyncio.sleep(0.001)
        return i


class AsyncFailing(tud.Dataset):
    """Failing, with ``async def __getitem__``."""

    def __len__(self):
        return 8

    async def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i


class AsyncStuck(tud.Dataset):
    """An async dataset whose samples never finish (30 s each)."""

    def __len__(self):
        return 4

    async def __getitem__(self, i):
        await asyncio.sleep(30)


class WhoBegan(tud.Dataset):
    """Squares that note which workers have begun, and which had when worker 0 fetched the last
    sample of its first batch. (Thread workers share these lists: their copies are shallow.)"""

    def __init__(self, n: int, batch_size: int, wait_for_another: bool = False) -> None:
        self.n, self.batch_size = n, batch_size
        self.began: list = []
        self.at_first_batch: list = []
        self.another = threading.Event()
        self.waited: list = []
        self.wait_for_another = wait_for_another

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        wid = tud.get_worker_info().id
        if wid not in self.began:
            self.began.append(wid)
        if wid != 0:
            self.another.set()
        elif i == 0 and self.wait_for_another:  # bounded: a failure fails, it does not hang
            self.waited.append(self.another.wait(timeout=60))
        if wid == 0 and i == self.batch_size - 1 and not self.at_first_batch:
            self.at_first_batch.append(sorted(self.began))
        return i * i


class ColdSquarePairs(SquarePairs):
    """SquarePairs whose first 4 fetches advance ``clock`` by a second more: batch memory
    filled for the first time (num_workers="auto" leaves its first batches unmeasured)."""

    def __getitem__(self, i):
        if i < 4:  # the first two batches of two
            self.clock.now += 1.0
        return super().__getitem__(i)
