"""Feeding a GPU: rloader vs torch.utils.data, batches pinned and moved to the device.

Three sections (``--sections``, all by default):

- ``throughput``: the workload of issue #15 (below).
- ``first``: the time from ``iter()`` to the first batch on the device, with 8 fresh workers
  (``--first-workers``), pinned and not, for torch, rloader processes and rloader threads, on
  uint8 images [3, 224, 224] and on (float32[3, 32, 32], int) pairs, batch 256 (issue #24). A
  timeline says where it went: when worker 0 began its first sample and when it had fetched its
  first batch (read from a shared array the dataset writes), against the whole.
- ``imagefolder``: torchvision ``ImageFolder`` of generated JPEGs with the ImageNet training
  transforms (benches/real_pipelines.py's pipeline, ``--images-jpeg`` of them), batch 64,
  shuffled, 14 worker processes (``--imagefolder-workers``), pinned, each batch moved to the
  device; torch against rloader processes (and threads, for information).

The throughput workload is that of issue #15: uint8 images [3, 224, 224] held in memory (numpy), batch 256,
``pin_memory=True``, persistent workers, each batch moved with ``.to("cuda", non_blocking=True)``.
torch and rloader (worker processes, and worker threads, which pin on the workers) run
interleaved for each worker count, and the limits are measured in the same run: one core's
memcpy bandwidth (one core, and all of them) and pinned host-to-device bandwidth.

    python benches/gpu.py                   # needs CUDA; says so and exits 0 without it
    python benches/gpu.py --workers 8 14 --repeats 3
    python benches/gpu.py --dry-run         # the same code on the CPU (no pinning, no device):
                                            # checks the script, measures nothing of a GPU

The run is written to benches/results/ as a dated JSON file (bench_results.py; a dry run's in
benches/results/smoke/).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import bench_results  # (benches/ is this script's folder)
import numpy as np
import torch
import torch.utils.data as tud
from side_by_side import ImageLabelDataset  # (benches/ is this script's folder)

import rloader

IMAGE = (3, 224, 224)
IMAGE_BYTES = 3 * 224 * 224


class Images(tud.Dataset):
    """uint8 images decoded into memory: a pool of distinct rows, indexed modulo its size."""

    def __init__(self, n: int, pool: int = 512) -> None:
        rng = np.random.default_rng(0)
        self.rows = rng.integers(0, 255, (pool, *IMAGE), dtype=np.uint8)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.rows[i % len(self.rows)]


def memcpy_gbps(threads: int, nbytes: int = 1 << 30) -> float:
    """Bytes copied per second by ``threads`` threads (one tensor copy split by torch)."""
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    for _ in range(3):
        dst.copy_(src)
    elapsed = time.perf_counter() - start
    torch.set_num_threads(before)
    return 3 * nbytes / elapsed / 1e9


def h2d_gbps(device: str, nbytes: int = 1 << 30) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return 3 * nbytes / (time.perf_counter() - start) / 1e9


def epoch(loader, device: str) -> float:
    """Seconds for one epoch, every batch moved to the device; the device is waited for."""
    start = time.perf_counter()
    for batch in loader:
        to_device(batch, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


class Timeline(tud.Dataset):
    """A dataset that writes, into an array shared with the workers (forked), when each worker
    began its first sample and when it had fetched ``batch`` of them: perf_counter, which
    is the same clock in every process."""

    MAX_WORKERS = 64

    def __init__(self, inner, batch: int) -> None:
        self.inner, self.batch = inner, batch
        self.marks = multiprocessing.RawArray("d", 2 * self.MAX_WORKERS)
        self.counts: dict = {}

    def reset(self) -> None:
        self.counts = {}
        for i in range(len(self.marks)):
            self.marks[i] = 0.0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        info = tud.get_worker_info()
        wid = 0 if info is None else info.id
        count = self.counts.get(wid, 0) + 1
        self.counts[wid] = count
        if count == 1:
            self.marks[2 * wid] = time.perf_counter()
        sample = self.inner[i]
        if count == self.batch:
            self.marks[2 * wid + 1] = time.perf_counter()
        return sample


def to_device(batch, device: str):
    if isinstance(batch, (list, tuple)):
        return [to_device(b, device) for b in batch]
    return batch.to(device, non_blocking=True)


def pinning_costs(nbytes: int) -> str:
    """What pinning ``nbytes`` costs on this machine: registering shared memory the size of a
    worker's slot (written first, as a worker writes its batch) with the driver, and a first
    ``pin_memory()`` (a fresh page-locked allocation and a copy), each once."""
    import ctypes
    import mmap

    region = mmap.mmap(-1, nbytes)  # MAP_SHARED | MAP_ANONYMOUS, as shared memory
    np.frombuffer(region, np.uint8).fill(1)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    cudart = torch.cuda.cudart()
    start = time.perf_counter()
    error = cudart.cudaHostRegister(addr, nbytes, 1)
    registered = time.perf_counter() - start
    start = time.perf_counter()
    cudart.cudaHostUnregister(addr)
    unregistered = time.perf_counter() - start
    source = torch.ones(nbytes, dtype=torch.uint8)
    start = time.perf_counter()
    pinned = source.pin_memory()
    pin_time = time.perf_counter() - start
    start = time.perf_counter()
    pinned.copy_(source)
    copy_time = time.perf_counter() - start
    pinned = None
    return (
        f"cudaHostRegister of {nbytes / 2**20:.0f} MiB of written shared memory "
        f"{registered * 1e3:.1f} ms ({error}), cudaHostUnregister {unregistered * 1e3:.1f} ms; "
        f"a first pin_memory() of as much {pin_time * 1e3:.1f} ms (a copy into it again "
        f"{copy_time * 1e3:.1f} ms)"
    )


FIRST_WORKLOADS = {
    "uint8 [3,224,224]": Images,
    "(float32[3,32,32], int)": ImageLabelDataset,
}
FIRST_KINDS = {
    "torch": (tud, {}),
    "rloader processes": (rloader, {}),
    "rloader threads": (rloader, {"worker_type": "thread"}),
}


def first_batch_runs(args, device: str, workload: str, kind: str, pin: bool) -> list:
    """One loader's rounds in this process: [(total, worker 0 began, worker 0 fetched, the
    last worker began)] in seconds from iter(), after a round that warms caches."""
    w = args.first_workers
    data = Timeline(FIRST_WORKLOADS[workload](256 * 4 * w), 256)
    lib, ours = FIRST_KINDS[kind]
    loader = lib.DataLoader(
        data, batch_size=256, shuffle=True, num_workers=w, pin_memory=pin, **ours
    )
    runs = []
    for r in range(args.first_repeats + 1):
        data.reset()
        start = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        on_device = to_device(batch, device)
        if device == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
        began, fetched = data.marks[0], data.marks[1]
        starts = [data.marks[2 * i] for i in range(w) if data.marks[2 * i] > 0]
        del it, batch, on_device
        if r > 0:
            runs.append((end - start, began - start, fetched - start, max(starts) - start))
    return runs


def first_batches(args, device: str) -> list:
    """Time from iter() to the first batch on the device, fresh workers each time; each loader
    in a process of its own (a fork copies what the process holds: another loader's memory
    would slow this one's starts)."""
    import json
    import subprocess

    pin = device == "cuda"
    if pin:
        try:
            print(pinning_costs(48 << 20), flush=True)
        except Exception as e:  # a measurement of the machine, not of either loader
            print(f"pinning costs not measured: {e!r}", flush=True)
    rows, comparisons = [], []
    for workload in FIRST_WORKLOADS:
        runs = {}
        for kind in FIRST_KINDS:
            for p in (True, False) if pin else (False,):
                command = [
                    sys.executable,
                    __file__,
                    "--first-one",
                    json.dumps([workload, kind, p]),
                    "--first-workers",
                    str(args.first_workers),
                    "--first-repeats",
                    str(args.first_repeats),
                ] + (["--dry-run"] if args.dry_run else [])
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"{workload}, {kind}, pinned={p}: failed\n{done.stderr}", flush=True)
                    continue
                runs[(kind, p)] = json.loads(done.stdout.strip().splitlines()[-1])
                sys.stderr.write(f"[first batch, {workload}, {kind}, pinned={p}]\n")
        if ("torch", pin) not in runs:
            continue
        torch_runs = [t[0] for t in runs[("torch", pin)]]
        torch_med = statistics.median(torch_runs)
        comparisons += [
            bench_results.comparison(
                f"first batch, {args.first_workers} fresh workers, {workload}: {k}"
                + (", pinned" if p else ""),
                torch_runs,
                [t[0] for t in samples],
            )
            for (k, p), samples in runs.items()
            if k != "torch" and p == pin and len(samples) == len(torch_runs)
        ]
        for (k, p), samples in runs.items():
            med = [statistics.median(col) for col in zip(*samples)]
            total = [t[0] for t in samples]
            rows.append(
                (
                    workload,
                    k,
                    "yes" if p else "no",
                    f"{med[0] * 1e3:.1f}",
                    f"{min(total) * 1e3:.0f}-{max(total) * 1e3:.0f}",
                    f"{med[1] * 1e3:.1f}",
                    f"{med[3] * 1e3:.1f}",
                    f"{med[2] * 1e3:.1f}",
                    f"{(med[0] - med[2]) * 1e3:.1f}",
                    f"{med[0] / torch_med:.2f}x",
                )
            )
    print(
        f"\nfirst batch on the device, {args.first_workers} fresh workers, batch 256, each "
        f"loader in a process of its own, median of {args.first_repeats} (ms from iter()); "
        f"'vs torch' is the time over torch's {'pinned ' if pin else ''}time (targets, issue "
        "#24: processes <= 0.5x, threads <= 0.2x)"
    )
    table(
        (
            "workload",
            "loader",
            "pinned",
            "total ms",
            "range",
            "w0 began",
            "last began",
            "w0 fetched",
            "after fetch",
            "vs torch",
        ),
        rows,
    )
    return comparisons


def fork_costs() -> None:
    """What a fork costs this process as it holds 1 GiB of page-locked memory of each kind
    (Linux copies a private page pinned for the device into the child at fork), and whether
    a forked child can read it."""
    import ctypes
    import mmap

    def fork_ms(probe=None) -> tuple:
        times, codes = [], []
        for _ in range(3):
            start = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                code = 0
                if probe is not None:
                    code = 0 if probe() == 1 else 3
                os._exit(code)
            times.append(time.perf_counter() - start)
            _, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
        return statistics.median(times) * 1e3, codes[-1]

    n = 1 << 30
    cudart = torch.cuda.cudart()
    lines = [f"nothing pinned: a fork {fork_ms()[0]:.1f} ms"]
    pinned = torch.ones(n, dtype=torch.uint8).pin_memory()
    ms, code = fork_ms(lambda: int(pinned[0]))
    lines.append(f"1 GiB of torch pinned memory: {ms:.1f} ms, a child reading it exits {code}")
    pinned = None
    for name, flags in (("private", mmap.MAP_PRIVATE), ("shared", mmap.MAP_SHARED)):
        region = mmap.mmap(-1, n, flags=flags | mmap.MAP_ANONYMOUS)
        np.frombuffer(region, np.uint8).fill(1)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
        cudart.cudaHostRegister(addr, n, 1)
        ms, code = fork_ms(lambda region=region: region[0])
        lines.append(f"1 GiB {name} registered: {ms:.1f} ms, a child reading it exits {code}")
        cudart.cudaHostUnregister(addr)
    print("forks: " + "; ".join(lines), flush=True)


def imagefolder(args, device: str) -> list:
    """ImageFolder + ImageNet transforms, pinned batches moved to the device: torchvision's
    under torch's and rloader's loaders, and rloader.vision's (decoded in Rust)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from real_pipelines import imagenet_train_transform, jpeg_folder
    from torchvision import datasets as tv_datasets

    import rloader.vision

    folder = str(jpeg_folder(args.data_dir, False, images=args.images_jpeg) / "train")
    dataset = tv_datasets.ImageFolder(folder, transform=imagenet_train_transform())
    ours = rloader.vision.ImageFolder(folder, transform=imagenet_train_transform())
    n, w, pin = len(dataset), args.imagefolder_workers, device == "cuda"

    def make(lib, ds=dataset, **kw):
        return lib.DataLoader(ds, batch_size=64, shuffle=True, num_workers=w, pin_memory=pin, **kw)

    loaders = {
        "torch": make(tud),
        "rloader processes": make(rloader),
        "rloader threads": make(rloader, worker_type="thread"),
        "rloader.vision processes": make(rloader, ours),
        "rloader.vision threads": make(rloader, ours, worker_type="thread"),
    }
    times = interleaved(loaders, device, args.repeats, "ImageFolder")
    torch_time = statistics.median(times["torch"])
    rows = []
    for name, runs in times.items():
        med = statistics.median(runs)
        rows.append(
            (
                name,
                f"{n / med:,.0f}",
                f"{n / max(runs):,.0f}-{n / min(runs):,.0f}",
                f"{torch_time / med:.2f}x",
            )
        )
    print(
        f"\nImageFolder, {n:,} JPEGs, ImageNet training transforms, batch 64, shuffled, "
        f"{w} fresh workers each epoch, pin_memory={pin}, to {device}; median of "
        f"{args.repeats} interleaved epochs (targets: rloader processes >= 1.3x torch, issue #24;"
        " rloader.vision threads >= 3x, issue #37)"
    )
    table(("loader", "images/s", "range", "vs torch"), rows)
    return [
        bench_results.comparison(
            f"ImageFolder, {w} workers, pinned, to {device}: {name}", times["torch"], runs
        )
        for name, runs in times.items()
        if name != "torch"
    ]


def interleaved(loaders: dict, device: str, repeats: int, label: str) -> dict:
    """Seconds of each loader's epochs, ``repeats`` rounds of one epoch each after a warm-up
    epoch (workers started, memory touched)."""
    for warm in loaders.values():
        epoch(warm, device)
    times: dict = {name: [] for name in loaders}
    for r in range(repeats):
        for name, timed in loaders.items():
            times[name].append(epoch(timed, device))
            sys.stderr.write(f"[{label}, run {r + 1}/{repeats}] {name}\n")
    return times


def table(headers: tuple, rows: list) -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 14])
    parser.add_argument("--images", type=int, default=40_960)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="run on the CPU, without pinning")
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["first", "imagefolder", "throughput"],
        choices=["first", "imagefolder", "throughput", "forks"],
    )
    parser.add_argument("--first-workers", type=int, default=8)
    parser.add_argument("--first-one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--first-repeats", type=int, default=5)
    parser.add_argument("--imagefolder-workers", type=int, default=14)
    parser.add_argument("--images-jpeg", type=int, default=6000, help="JPEGs for imagefolder")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parent.parent / ".bench-data"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("benches/gpu.py: no CUDA device here; nothing measured (see --dry-run).")
        return
    device = "cuda" if cuda and not args.dry_run else "cpu"
    pin = device == "cuda"
    if pin:
        torch.zeros(1, device=device)  # a training process has its CUDA context already
    if args.first_one is not None:  # one loader of the "first" section, in a process of its own
        import json

        workload, kind, p = json.loads(args.first_one)
        print(json.dumps(first_batch_runs(args, device, workload, kind, p)))
        return
    where = torch.cuda.get_device_name() if pin else "CPU (dry run)"
    print(f"{where}, {os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    # Before the throughput section, whose 1 GiB of pinned memory torch would keep cached.
    if "forks" in args.sections and pin:
        try:
            fork_costs()
        except Exception as e:  # a measurement of the machine, not of either loader
            print(f"fork costs not measured: {e!r}", flush=True)
    started = bench_results.now()
    comparisons = []
    if "first" in args.sections:
        comparisons += first_batches(args, device)
    if "imagefolder" in args.sections:
        comparisons += imagefolder(args, device)
    if "throughput" in args.sections:
        comparisons += throughput(args, device)
    figures = {"device": where, "comparisons": comparisons}
    # A dry run measures nothing of a GPU: a smoke run's file, never scored.
    path = bench_results.save("gpu", figures, smoke=args.dry_run, started=started)
    print(f"This run's figures: {path}")


def throughput(args, device: str) -> list:
    pin = device == "cuda"
    dataset = Images(args.images)
    nbytes = args.images * IMAGE_BYTES
    cores = os.cpu_count() or 1
    limits = [
        f"memcpy: one core {memcpy_gbps(1):.1f} GB/s, {cores} cores {memcpy_gbps(cores):.1f} GB/s"
    ]
    if pin:
        limits.append(f"pinned host-to-device {h2d_gbps(device):.1f} GB/s")
    print("\nthroughput: " + "; ".join(limits))

    def loader(lib, workers: int, **ours):
        return lib.DataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
            pin_memory=pin,
            persistent_workers=True,
            **ours,
        )

    kinds = {
        "torch": lambda w: loader(tud, w),
        "rloader processes": lambda w: loader(rloader, w),
        "rloader threads": lambda w: loader(rloader, w, worker_type="thread"),
    }
    rows, comparisons = [], []
    for workers in args.workers:
        loaders = {name: make(workers) for name, make in kinds.items()}
        times = interleaved(loaders, device, args.repeats, f"{workers} workers")
        torch_time = statistics.median(times["torch"])
        comparisons += [
            bench_results.comparison(
                f"uint8 images, batch {args.batch_size}, {workers} workers, to {device}: {name}",
                times["torch"],
                runs,
            )
            for name, runs in times.items()
            if name != "torch"
        ]
        for name, runs in times.items():
            med = statistics.median(runs)
            rows.append(
                (
                    str(workers),
                    name,
                    f"{args.images / med / 1e3:.1f}k",
                    f"{nbytes / med / 1e9:.2f}",
                    f"{nbytes / max(runs) / 1e9:.1f}-{nbytes / min(runs) / 1e9:.1f}",
                    f"{torch_time / med:.2f}x",
                )
            )
        del loaders
    headers = ("workers", "loader", "images/s", "GB/s", "GB/s range", "vs torch")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    print(f"median of {args.repeats} interleaved epochs of {args.images:,} images")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return comparisons


if __name__ == "__main__":
    main()
