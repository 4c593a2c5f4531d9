"""rloader vs torch.utils.data on the same workloads, in one run.

Each workload runs with torch.utils.data and with rloader, interleaved (torch, rloader, torch,
rloader, ...) so both see the same machine state; each figure is the median of --repeats runs.
The ratio is rloader's throughput over torch's (above 1: rloader is faster).

Sampler workloads are measured end to end, as users consume them from Python (``list(...)``),
so creating the Python ints is part of both times. The "floor" column shows the best ratio any
implementation could reach: torch's time over the time it takes just to create the same ints
and lists (``list(range(n))``-style), which no sampler can avoid. For the num_workers=0 row of
(tensor, int) pairs it is the collation both libraries end in: ``torch.stack`` of each batch's
images and ``torch.tensor`` of its labels, for the same number of shuffled batches. For the uint8
row it is a plain memcpy of the same bytes; for the first-batch row, the time to fork two bare children of this
process (both libraries fork their workers, and a fork's cost grows with the process's memory).

The "threads:" rows run rloader with ``worker_type="thread"`` against torch's worker processes
(2 unless the row says otherwise); the memory row measures the proportional set size (PSS) of
the loader's processes, the main one and its workers, with every sample read once, and its
ratio is torch's PSS over rloader's.

Each workload builds its data, and one DataLoader per library, before its runs and frees them
after, handing the freed memory back to the OS, so no row pays for another row's memory (forks
copy page tables). A run is one epoch of
that same loader, as in a training loop that builds its DataLoader once and iterates it every
epoch.

    python benches/side_by_side.py            # everything, 3 repeats
    python benches/side_by_side.py --quick    # smaller sizes, for a smoke test (not scored)

Each run is written to benches/results/ as a dated JSON file (bench_results.py; a --quick
run's to benches/results/smoke/).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import bench_results
import numpy as np
import torch
import torch.utils.data as tud
import torch.utils.data.distributed as tud_distributed

import rloader


@dataclass
class Workload:
    name: str
    unit: str  # what the throughput counts
    count: int  # how many units one run produces
    run: Callable[[object, object], object]  # run(lib, data), lib = torch namespace or rloader
    target: float  # the ratio this row should reach (rloader/torch throughput)
    floor: Optional[Callable[[object], object]] = None  # floor(data)
    self_timed: bool = False  # run(lib) returns the seconds to count (it leaves out its cleanup)
    # run(lib) returns bytes of memory, not seconds: the ratio is torch's over rloader's.
    memory: bool = False
    # Builds the workload's data before its runs; it is freed after them, so a row's forks do not
    # copy the page tables of other rows' datasets.
    data: Callable[[], object] = lambda: None


class TorchNS:
    """torch.utils.data's names, looked up like rloader's."""

    def __getattr__(self, name):
        if name == "DistributedSampler":
            return tud_distributed.DistributedSampler
        return getattr(tud, name)


class IntDataset(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class ImageLabelDataset(tud.Dataset):
    """(float32[3,32,32], int) pairs of a small-image classification set cached in memory.

    ``__getitem__`` returns the stored pair, so the time measured is the loader's own (fetch
    loop, collation), not the cost of building a sample, which is the same with either library.
    """

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        images = torch.rand(n, 3, 32, 32, generator=g)
        labels = torch.randint(0, 10, (n,), generator=g).tolist()
        self.samples = [(images[i].clone(), labels[i]) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


class ImageArrayDataset(tud.Dataset):
    """uint8 numpy images [3, 224, 224], as an image set decoded into memory."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 255, (3, 224, 224), dtype=np.uint8) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i]


class PoolViewDataset(tud.Dataset):
    """(uint8[3,224,224] numpy view into a 512-row pool, index) pairs: decoded images kept in
    one preallocated array, each sample a view of its row (no copy in ``__getitem__``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        rng = np.random.default_rng(0)
        self.pool = rng.integers(0, 255, (512, 3, 224, 224), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.pool[i % 512], i


class BusyDataset(tud.Dataset):
    """A pure-Python ``__getitem__`` of about 50 us: the work is the user's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        total = 0
        for k in range(800):
            total += k * i
        return total % 1000


class SleepyDataset(tud.Dataset):
    """Sleeps 1 ms per sample: I/O-bound loading."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.001)
        return i


class AsyncSleepyDataset(tud.Dataset):
    """Waits 1 ms per sample without blocking its thread: an async I/O-bound dataset (an HTTP
    or object-store client). torch calls it as any dataset and gets coroutines, so its side of
    the row is ``SleepyDataset`` with processes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(0.001)
        return i


class StringDataset(tud.Dataset):
    """Python strings held in a list, as a tokenized text corpus or a file list is: each
    worker process that reads one touches its reference count, which copies the page it is
    on into that worker (pytorch/pytorch#13246)."""

    def __init__(self, n: int) -> None:
        self.strings = [f"sample-{i:09d}-{'x' * (i % 23)}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.strings)

    def __getitem__(self, i: int) -> str:
        return self.strings[i]


class IntStream(tud.IterableDataset):
    """Small ints, split between workers as the documentation shows."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class Epochs:
    """A dataset and one DataLoader per library over it, built once and iterated once per run:
    a training loop's pattern (one loader, an epoch per iteration)."""

    def __init__(self, dataset, ours: Optional[dict] = None, theirs=None, **kwargs) -> None:
        """``ours``: rloader's arguments where they differ (``worker_type="thread"``);
        ``theirs``: torch's dataset where it differs (an async dataset's sync twin)."""
        self.dataset, self.kwargs = dataset, kwargs
        self.ours, self.theirs = ours or {}, theirs
        self.loaders: dict = {}

    def loader(self, lib):
        if id(lib) not in self.loaders:
            if lib is rloader:
                loader = lib.DataLoader(self.dataset, **{**self.kwargs, **self.ours})
            else:
                loader = lib.DataLoader(self.theirs or self.dataset, **self.kwargs)
            self.loaders[id(lib)] = loader
        return self.loaders[id(lib)]

    def __call__(self, lib) -> int:
        n = 0
        for _batch in self.loader(lib):
            n += 1
        return n


def batched_ints(n: int, size: int) -> list:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def workloads(quick: bool) -> list[Workload]:
    scale = 10 if quick else 1
    n_batch = 10_000_000 // scale
    n_weights = 1_000_000 // scale
    n_dist = 10_000_000 // scale
    n_ints, n_images = 200_000 // scale, 50_000 // scale
    n_strings = 2_000_000 // scale
    n_views = 40_000 // scale
    n_pairs, n_arrays, n_busy, n_sleepy, n_stream = (
        20_000 // scale,
        1_024 // scale,
        4_000 // scale,
        2_000 // scale,
        200_000 // scale,
    )

    def weights():
        return torch.rand(n_weights, generator=torch.Generator().manual_seed(1)).double()

    def epoch(lib, epochs: Epochs) -> int:
        return epochs(lib)

    def workers(dataset, batch_size: int, **kwargs) -> Callable[[], Epochs]:
        return lambda: Epochs(dataset(), batch_size=batch_size, num_workers=2, **kwargs)

    def image_epochs() -> Epochs:
        epochs = Epochs(ImageLabelDataset(n_images), batch_size=256, shuffle=True, num_workers=0)
        order = torch.randperm(n_images, generator=torch.Generator().manual_seed(2)).tolist()
        samples = epochs.dataset.samples
        batches = [order[i : i + 256] for i in range(0, n_images, 256)]
        epochs.columns = [([samples[j][0] for j in b], [samples[j][1] for j in b]) for b in batches]
        return epochs

    def stack_only(epochs: Epochs) -> None:
        for images, labels in epochs.columns:
            torch.stack(images)
            torch.tensor(labels)

    def touch_pages(lib, epochs: Epochs) -> int:
        # The consumer reads one byte per 4 KiB page of each batch, as a model's first layer
        # would read all of it: a batch whose memory is fresh pays its page faults here.
        n = 0
        for images, labels in epochs.loader(lib):
            images.view(-1)[::4096].sum()
            n += len(labels)
        return n

    def two_forks(_data) -> float:
        start = time.perf_counter()
        children = [os.fork() for _ in range(2)]
        if 0 in children:
            os._exit(0)
        elapsed = time.perf_counter() - start
        for pid in children:
            os.waitpid(pid, 0)
        return elapsed

    def first_batch(lib, epochs: Epochs) -> float:
        # Timed from iter() to the first batch; stopping the workers after it is not counted.
        loader = epochs.loader(lib)
        start = time.perf_counter()
        it = iter(loader)
        next(it)
        elapsed = time.perf_counter() - start
        del it
        return elapsed

    def threads(
        dataset, batch_size: int, workers: int = 2, theirs=None, shuffle=False
    ) -> Callable[[], Epochs]:
        """rloader with ``workers`` threads against torch with 2 processes."""
        return lambda: Epochs(
            dataset(),
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=2,
            ours=dict(worker_type="thread", num_workers=workers),
            theirs=theirs() if theirs else None,
        )

    def loader_pss(lib, epochs: Epochs) -> float:
        """PSS of this process and its worker processes, bytes, with the epoch's last batch
        still to come (every worker alive, every sample read once)."""
        loader = epochs.loader(lib)
        it = iter(loader)
        for _ in range(len(loader) - 1):
            next(it)
        total = pss(os.getpid()) + sum(pss(pid) for pid in child_pids())
        for _ in it:
            pass
        return float(total)

    thread_loads = [
        Workload(
            f"threads: sleeps 1 ms per sample x {n_sleepy:,}, 32 threads vs 2 processes",
            "samples",
            n_sleepy,
            epoch,
            10,
            data=threads(lambda: SleepyDataset(n_sleepy), 16, workers=32),
        ),
        Workload(
            f"threads: async, awaits 1 ms per sample x {n_sleepy:,}, 2 threads vs 2 processes",
            "samples",
            n_sleepy,
            epoch,
            10,
            data=threads(
                lambda: AsyncSleepyDataset(n_sleepy), 16, theirs=lambda: SleepyDataset(n_sleepy)
            ),
        ),
        Workload(
            f"threads: (float32[3,32,32], int) x {n_pairs:,}, batch 256",
            "samples",
            n_pairs,
            epoch,
            3,
            data=threads(lambda: ImageLabelDataset(n_pairs), 256),
        ),
        Workload(
            f"threads: pure-Python __getitem__ of ~50 us x {n_busy:,}",
            "samples",
            n_busy,
            epoch,
            1,
            data=threads(lambda: BusyDataset(n_busy), 32),
        ),
        Workload(
            "threads: time from iter() to the first batch",
            "first batches",
            1,
            first_batch,
            5,
            self_timed=True,
            data=threads(lambda: ImageLabelDataset(n_pairs), 256),
        ),
        Workload(
            f"threads: memory (PSS) of the loader's processes, {n_strings:,} strings",
            "bytes of PSS",
            1,
            loader_pss,
            1.43,  # rloader at most 0.7x torch's
            memory=True,
            data=threads(lambda: StringDataset(n_strings), 1024, shuffle=True),
        ),
    ]

    worker_loads = [
        Workload(
            f"2 workers: (float32[3,32,32], int) x {n_pairs:,}, batch 256",
            "samples",
            n_pairs,
            epoch,
            2,
            data=workers(lambda: ImageLabelDataset(n_pairs), 256),
        ),
        Workload(
            f"2 workers: uint8[3,224,224] numpy x {n_arrays:,}, batch 64",
            "bytes",
            n_arrays * 3 * 224 * 224,
            epoch,
            2,
            lambda e: [a.copy() for a in e.dataset.images],
            data=workers(lambda: ImageArrayDataset(n_arrays), 64),
        ),
        # The same batches from persistent workers: the data path alone, without starting and
        # stopping two processes each epoch (which the row above spends most of its time on).
        Workload(
            f"2 persistent workers: uint8[3,224,224] numpy x {4 * n_arrays:,}, batch 64",
            "bytes",
            4 * n_arrays * 3 * 224 * 224,
            epoch,
            5,
            lambda e: [a.copy() for a in e.dataset.images],
            data=workers(lambda: ImageArrayDataset(4 * n_arrays), 64, persistent_workers=True),
        ),
        Workload(
            "2 workers: time from iter() to the first batch",
            "first batches",
            1,
            first_batch,
            2,
            two_forks,
            self_timed=True,
            data=workers(lambda: ImageLabelDataset(n_pairs), 256),
        ),
        Workload(
            f"2 workers: pure-Python __getitem__ of ~50 us x {n_busy:,}",
            "samples",
            n_busy,
            epoch,
            0.95,
            data=workers(lambda: BusyDataset(n_busy), 32),
        ),
        Workload(
            f"2 workers: IterableDataset of {n_stream:,} small ints, batch 256",
            "samples",
            n_stream,
            epoch,
            1.5,
            data=workers(lambda: IntStream(n_stream), 256),
        ),
        Workload(
            f"2 workers: sleeps 1 ms per sample x {n_sleepy:,}",
            "samples",
            n_sleepy,
            epoch,
            1,
            data=workers(lambda: SleepyDataset(n_sleepy), 16),
        ),
    ]

    return [
        Workload(
            f"list(BatchSampler(RandomSampler({n_batch:,}), 1024, False))",
            "indices",
            n_batch,
            lambda lib, _d: list(lib.BatchSampler(lib.RandomSampler(range(n_batch)), 1024, False)),
            4,
            lambda _d: batched_ints(n_batch, 1024),
        ),
        Workload(
            f"list(WeightedRandomSampler({n_weights:,} weights, replacement=True))",
            "indices",
            n_weights,
            lambda lib, w: list(lib.WeightedRandomSampler(w, n_weights, replacement=True)),
            4,
            lambda _d: list(range(n_weights)),
            data=weights,
        ),
        Workload(
            f"list(WeightedRandomSampler({n_weights:,} weights, replacement=False))",
            "indices",
            n_weights,
            lambda lib, w: list(lib.WeightedRandomSampler(w, n_weights, replacement=False)),
            2.5,
            lambda _d: list(range(n_weights)),
            data=weights,
        ),
        Workload(
            f"list(DistributedSampler({n_dist:,}, num_replicas=8, rank=3))",
            "indices",
            n_dist // 8,
            lambda lib, _d: list(lib.DistributedSampler(range(n_dist), num_replicas=8, rank=3)),
            5,
            lambda _d: list(range(n_dist // 8)),
        ),
        Workload(
            f"DataLoader(int dataset of {n_ints:,}, batch_size=256, shuffle=True)",
            "samples",
            n_ints,
            epoch,
            3,
            data=lambda: Epochs(IntDataset(n_ints), batch_size=256, shuffle=True, num_workers=0),
        ),
        Workload(
            f"DataLoader((float32[3,32,32], int) x {n_images:,}, batch_size=256, shuffle=True)",
            "samples",
            n_images,
            epoch,
            1.5,
            stack_only,
            data=image_epochs,
        ),
        Workload(
            f"DataLoader((uint8[3,224,224] view of a 512-row pool, int) x {n_views:,}, "
            "batch_size=64, shuffle=True), one byte read per 4 KiB page",
            "samples",
            n_views,
            touch_pages,
            1,
            data=lambda: Epochs(
                PoolViewDataset(n_views), batch_size=64, shuffle=True, num_workers=0
            ),
        ),
        *worker_loads,
        *thread_loads,
    ]


def pss(pid: int) -> int:
    """A process's proportional set size in bytes (its own pages, plus its share of those it
    shares with others): the sum over processes counts each page once."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_pids() -> list:
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


def release_freed_memory() -> None:
    """Gives freed heap memory back to the OS: glibc keeps it mapped otherwise (a 614 MB dataset
    freed left fork at 20 ms instead of 9.6 ms), and every later fork would copy its page tables."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def timed(fn: Callable[[], object], self_timed: bool = False) -> float:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    if self_timed:  # (or a memory row's bytes)
        assert isinstance(result, float)
        elapsed = result
    del result
    return elapsed


class Progress:
    """A progress bar on a terminal; one plain line per step otherwise (a log, CI)."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.tty:
            sys.stderr.write(f"[{self.done}/{self.total}] {label}\n")
            sys.stderr.flush()
            return
        width = 30
        filled = width * self.done // self.total
        bar = "#" * filled + "-" * (width - filled)
        room = 60
        if len(label) > room:  # cut at a word, and say so
            label = label[: room - 3].rsplit(" ", 1)[0] + "..."
        sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {label:<{room}}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


def human(rate: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.2f}{unit}"
    return f"{rate:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--only", default="", help="run workloads whose name contains this")
    args = parser.parse_args()
    started = bench_results.now()
    libs = {"torch": TorchNS(), "rloader": rloader}
    chosen = [w for w in workloads(args.quick) if args.only in w.name]
    steps = sum(args.repeats * (2 + (w.floor is not None)) + 1 for w in chosen)
    progress = Progress(steps)
    rows, comparisons = [], []
    stage_rows: list = []  # (workload, rloader's DataLoader.stats() of its last run)
    for w in chosen:
        data = w.data()
        # One untimed warm-up each: first-touch costs (imports, page faults) are not the subject.
        for lib in libs.values():
            w.run(lib, data)
        progress.step(f"warm-up: {w.name}")
        times: dict[str, list[float]] = {"torch": [], "rloader": [], "floor": []}
        for _ in range(args.repeats):
            for name, lib in libs.items():
                measure = w.self_timed or w.memory
                times[name].append(timed(lambda: w.run(lib, data), measure))  # noqa: B023 - called at once
                progress.step(f"{name}: {w.name}")
            if w.floor is not None:
                times["floor"].append(timed(lambda: w.floor(data), w.self_timed))  # noqa: B023
                progress.step(f"floor: {w.name}")
        if isinstance(data, Epochs) and id(rloader) in data.loaders:
            stage_rows.append((w.name, data.loaders[id(rloader)].stats()))
        data = None  # frees this workload's data (and loaders) before the next one's
        release_freed_memory()
        med = {k: statistics.median(v) for k, v in times.items() if v}
        # (a --quick run's rows are a smoke test: too short to score)
        row = bench_results.comparison(
            w.name, times["torch"], times["rloader"], target=w.target, smoke=args.quick
        )
        ratio, (lo, hi) = row["ratio"], row["spread"]
        # Each run of rloader against the torch run beside it: how far one run can stray.
        spread = f"{lo:.2f}-{hi:.2f}x"
        verdict = "smoke" if args.quick else "met" if row["met"] else "MISSED"
        floor = f"{med['torch'] / med['floor']:.2f}x" if "floor" in med else "-"
        if w.unit == "bytes":  # the floor here is a plain memcpy of the same bytes
            floor = f"memcpy {w.count / med['floor'] / 1e9:.1f} GB/s"
        if w.self_timed and "floor" in med:  # the first-batch row: two bare forks
            floor = f"2 forks {med['floor'] * 1e3:.0f} ms"
        if w.memory:  # bytes, not seconds: less is better, and the ratio is torch's over ours
            shown = {k: f"{med[k] / 1e9:.2f} GB" for k in ("torch", "rloader")}
        else:
            shown = {k: f"{human(w.count / med[k])}/s" for k in ("torch", "rloader")}
        row.update(unit=w.unit, count=w.count, floor=None if floor == "-" else floor)
        comparisons.append(row)
        rows.append(
            (
                w.name,
                shown["torch"],
                shown["rloader"],
                f"{ratio:.2f}x",
                spread,
                "-" if args.quick else f">= {w.target:g}x",
                verdict,
                floor,
                w.unit,
            )
        )

    headers = ("workload", "torch", "rloader", "ratio", "runs", "target", "", "floor", "unit")
    print(
        f"\nrloader {rloader.__version__} vs torch {torch.__version__}, {os.cpu_count()} cores, "
        f"median of {args.repeats} interleaved runs.\n"
        "ratio: rloader's throughput over torch's (medians); runs: the lowest and highest ratio "
        "of one rloader run to the torch run beside it;\n"
        "floor: torch's time over the part no implementation can avoid (see --help).\n"
    )
    print_table(headers, rows)
    if args.quick:
        print("\nA smoke run (--quick): its rows are too short to score against the targets.")
    else:
        missed = [r[0] for r in rows if r[6] != "met"]
        summary = f"{len(rows) - len(missed)} of {len(rows)} targets met"
        print(f"\n{summary}" + (f"; missed: {'; '.join(missed)}" if missed else ""))
    print_stages(stage_rows)
    stages = {name: stats for name, stats in stage_rows if stats is not None}
    figures = {"repeats": args.repeats, "comparisons": comparisons, "rloader_stats": stages}
    path = bench_results.save("side_by_side", figures, smoke=args.quick, started=started)
    print(f"\nThis run's figures: {path}")


def print_table(headers: tuple, rows: list) -> None:
    """Left-aligned columns as wide as their widest cell, with a rule under the headers."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def print_stages(stage_rows: list) -> None:
    """Where rloader's last run of each DataLoader workload spent its time
    (``DataLoader.stats()``); workers' stages are summed over the workers."""
    if not stage_rows:
        return
    stages = ("waiting_for_data", "waiting_for_user", "fetch", "collate", "transport", "pin")
    headers = ("workload", "batches", *(f"{s} (s)" for s in stages))
    rows = []
    for name, stats in stage_rows:
        if stats is None:
            continue
        cells = [f"{stats[f'{s}_s']:.3f}" if stats[f"{s}_s"] is not None else "-" for s in stages]
        rows.append((name, str(stats["batches"]), *cells))
    print(
        "\nWhere rloader's last run of each DataLoader workload spent its time "
        "(loader.stats(); workers' stages summed over the workers):\n"
    )
    print_table(headers, rows)


if __name__ == "__main__":
    main()
