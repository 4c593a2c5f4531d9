"""Feeding a GPU: rloader vs torch.utils.data, batches pinned and moved to the device.

The workload of issue #15: uint8 images [3, 224, 224] held in memory (numpy), batch 256,
``pin_memory=True``, persistent workers, each batch moved with ``.to("cuda", non_blocking=True)``.
torch and rloader (worker processes, and worker threads, which pin on the workers) run
interleaved for each worker count, and the limits are measured in the same run: one core's
memcpy bandwidth (one core, and all of them) and pinned host-to-device bandwidth.

    python benches/gpu.py                   # needs CUDA; says so and exits 0 without it
    python benches/gpu.py --workers 8 14 --repeats 3
    python benches/gpu.py --dry-run         # the same code on the CPU (no pinning, no device):
                                            # checks the script, measures nothing of a GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.utils.data as tud

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
    for images in loader:
        images.to(device, non_blocking=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 14])
    parser.add_argument("--images", type=int, default=40_960)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="run on the CPU, without pinning")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("benches/gpu.py: no CUDA device here; nothing measured (see --dry-run).")
        return
    device = "cuda" if cuda and not args.dry_run else "cpu"
    pin = device == "cuda"
    dataset = Images(args.images)
    nbytes = args.images * IMAGE_BYTES
    cores = os.cpu_count() or 1
    limits = [
        f"memcpy: one core {memcpy_gbps(1):.1f} GB/s, {cores} cores {memcpy_gbps(cores):.1f} GB/s"
    ]
    if pin:
        limits.append(f"pinned host-to-device {h2d_gbps(device):.1f} GB/s")
    where = torch.cuda.get_device_name() if pin else "CPU (dry run)"
    print(f"{where}, {os.cpu_count()} cores, torch {torch.__version__}; " + "; ".join(limits))

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
    rows = []
    for workers in args.workers:
        loaders = {name: make(workers) for name, make in kinds.items()}
        for warm in loaders.values():  # warm-up: workers started, memory touched
            epoch(warm, device)
        times: dict = {name: [] for name in loaders}
        for r in range(args.repeats):
            for name, timed in loaders.items():
                times[name].append(epoch(timed, device))
                sys.stderr.write(f"[{workers} workers, run {r + 1}/{args.repeats}] {name}\n")
        torch_time = statistics.median(times["torch"])
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


if __name__ == "__main__":
    main()
