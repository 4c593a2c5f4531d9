"""Map-style datasets by the samples they make: shapes, dtypes, layouts, batches."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import torch
import torch.utils.data as tud


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


def labelled_items(n: int):
    """`n` paths in 10 class folders, their labels, and the class index of each folder."""
    paths = [f"data/class{i % 10}/img_{i:07d}.jpg" for i in range(n)]
    labels = [i % 10 for i in range(n)]
    classes = {f"class{c}": c for c in range(10)}
    return paths, labels, classes


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


class Blocks(SquarePairs):
    """Batches from sample 8 on wait for ``release`` (set by the test once it has its error)."""

    def __init__(self, release):
        super().__init__()
        self.release = release

    def __getitem__(self, i):
        if i >= 8:
            self.release.wait(60)  # (bounded: a wrong engine here fails the test, not hangs it)
        return super().__getitem__(i)


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


INITS: dict = {}


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


class MiBRows(tud.Dataset):
    """1 MiB tensors: a batch of 4 needs 4 MiB of slot."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        return torch.full((256, 1024), float(i)), i


class LongStrings(tud.Dataset):
    """200,000 strings of about 200 characters: large tasks, large answers."""

    def __len__(self) -> int:
        return 200_000

    def __getitem__(self, i: int) -> str:
        return "x" * 200 + str(i)


class ColdSquarePairs(SquarePairs):
    """SquarePairs whose first 4 fetches advance ``clock`` by a second more: batch memory
    filled for the first time (num_workers="auto" leaves its first batches unmeasured)."""

    def __getitem__(self, i):
        if i < 4:  # the first two batches of two
            self.clock.now += 1.0
        return super().__getitem__(i)
