"""rloader and torch.utils.data loaders, unprepared and prepared by Hugging Face accelerate.

The workload is side_by_side.py's "2 workers: (float32[3,32,32], int) x 20,000, batch 256"
row, on the CPU in one process: ``Accelerator(cpu=True).prepare(loader)``, as in the issue.
rloader's prepared loader is made after ``rloader.integrations.accelerate.install()``, which
keeps rloader's engine under accelerate's DataLoaderShard; without it, ``prepare()`` rebuilds
the loader as torch's (shown as "rloader prepared, not installed").

Each loader is built once and each run is one epoch of it, as in a training loop. After one
untimed warm-up epoch each, the loaders run interleaved (one epoch each, in turn) --repeats
times; each figure is the median.

    python benches/accelerate_prepare.py              # 20,000 samples, batch 256, 5 repeats
    python benches/accelerate_prepare.py --quick      # 2,000 samples, 3 repeats (a smoke run)

The run is written to benches/results/ as a dated JSON file (bench_results.py).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import accelerate
import bench_results
import torch
import torch.utils.data as tud
from accelerate import Accelerator
from side_by_side import ImageLabelDataset

import rloader
import rloader.integrations.accelerate


def epoch(loader) -> int:
    n = 0
    for _batch in loader:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2,000 samples, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.repeats = 2_000, 3
    started = bench_results.now()

    dataset = ImageLabelDataset(args.samples)
    acc = Accelerator(cpu=True)

    def build(lib):
        return lib.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)

    loaders = {"rloader unprepared": build(rloader)}
    loaders["rloader prepared, not installed"] = acc.prepare(build(rloader))
    rloader.integrations.accelerate.install()
    loaders["rloader prepared (install())"] = acc.prepare(build(rloader))
    loaders["torch prepared"] = acc.prepare(build(tud))
    loaders["torch unprepared"] = build(tud)

    engines = {
        name: type(getattr(loader, "base_dataloader", loader)) for name, loader in loaders.items()
    }
    assert engines["rloader prepared (install())"] is rloader.DataLoader
    assert engines["torch prepared"] is tud.DataLoader
    assert engines["rloader prepared, not installed"] is tud.DataLoader
    # The prepared loaders give the same batches.
    pairs = itertools.zip_longest(
        loaders["rloader prepared (install())"], loaders["torch prepared"]
    )
    for ours, theirs in pairs:  # (zip_longest ends both epochs, and sees a length mismatch)
        assert ours is not None and theirs is not None
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))

    for loader in loaders.values():  # warm-up
        epoch(loader)
    times: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, loader in loaders.items():
            start = time.perf_counter()
            epoch(loader)
            times[name].append(time.perf_counter() - start)

    med = {name: statistics.median(t) for name, t in times.items()}
    base, torch_prepared = med["rloader unprepared"], med["torch prepared"]
    print(
        f"\nrloader {rloader.__version__}, torch {torch.__version__}, accelerate {accelerate.__version__}; "
        f"(float32[3,32,32], int) x {args.samples:,}, batch {args.batch_size}, {args.workers} workers, CPU, "
        f"1 process; median of {args.repeats} interleaved epochs"
    )
    headers = (
        "loader",
        "engine",
        "seconds",
        "samples/s",
        "time / rloader unprepared",
        "torch prepared / time",
    )
    rows = [
        (
            name,
            engines[name].__module__.split(".")[0],
            f"{med[name]:.3f}",
            f"{args.samples / med[name]:,.0f}",
            f"{med[name] / base:.2f}x",
            f"{torch_prepared / med[name]:.2f}x",
        )
        for name in loaders
    ]
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(
        "runs (s): "
        + "; ".join(f"{name}: " + ", ".join(f"{t:.3f}" for t in ts) for name, ts in times.items())
    )
    figures = {
        "samples": args.samples,
        "batch_size": args.batch_size,
        "num_workers": args.workers,
        "seconds": times,
        "comparisons": [
            bench_results.comparison(
                f"accelerate-prepared, {args.workers} workers: rloader (install()) vs torch",
                times["torch prepared"],
                times["rloader prepared (install())"],
                smoke=args.quick,
            )
        ],
    }
    path = bench_results.save(
        "accelerate_prepare",
        figures,
        smoke=args.quick,
        started=started,
        accelerate=accelerate.__version__,
    )
    print(f"This run's figures: {path}")


if __name__ == "__main__":
    main()
