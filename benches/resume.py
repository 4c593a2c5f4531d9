"""Resuming 90% into a shuffled epoch of 50M samples: rloader against torchdata's
StatefulDataLoader, in one run.

Each loader is built over ``range(50_000_000)`` (batch 256, shuffle, one process), iterated for
one batch, and its ``state_dict()`` taken; the state is then moved to 90% of the epoch (the
count of batches or samples handed out, the only field that differs between a state taken
after one batch and one taken after 90% of the epoch; iterating 45M samples to get there would
take minutes for the baseline). The time measured is a new loader's ``load_state_dict(state)``
plus ``next(iter(loader))``: what a restarted job waits before its first batch. rloader
generates the epoch's permutation (as every epoch does) and skips the handed-out indices in
Rust; StatefulDataLoader replays its sampler up to the position.

    python benches/resume.py [--samples N] [--repeats R]    # --quick: 1M samples, 1 run

The run is written to benches/results/ as a dated JSON file (bench_results.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import bench_results
import torch

import rloader


def rloader_state(n: int, batch: int, fraction: float) -> dict:
    loader = rloader.DataLoader(
        range(n), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    state["position"] = int(fraction * n) // batch
    return state


def rloader_resume(n: int, batch: int, state: dict) -> float:
    loader = rloader.DataLoader(range(n), batch_size=batch, shuffle=True)
    start = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def stateful_state(n: int, batch: int, fraction: float):
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(
        range(n), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    it = iter(loader)
    next(it)
    state = copy.deepcopy(loader.state_dict())
    batches = int(fraction * n) // batch
    state["_sampler_iter_yielded"] = state["_num_yielded"] = batches
    inner = state["_sampler_iter_state"]
    inner["samples_yielded"] = inner["sampler_iter_state"]["yielded"] = batches * batch
    return state


def stateful_resume(n: int, batch: int, state) -> float:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(range(n), batch_size=batch, shuffle=True)
    start = time.perf_counter()
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=50_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1M samples, 1 run (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.repeats = 1_000_000, 1
    started = bench_results.now()
    n, batch = args.samples, 256
    warnings.simplefilter("ignore")  # torchdata's deprecation notice
    try:
        import torchdata.stateful_dataloader  # noqa: F401

        have_torchdata = True
    except ImportError:
        have_torchdata = False
        print(
            "torchdata is not installed: StatefulDataLoader is skipped "
            "(pip install torchdata to compare)"
        )
    ours = rloader_state(n, batch, 0.9)
    print(f"rloader state: {len(__import__('pickle').dumps(ours))} bytes pickled")
    times: dict = {"rloader": [], "StatefulDataLoader": []}
    theirs = stateful_state(n, batch, 0.9) if have_torchdata else None
    for i in range(args.repeats):
        times["rloader"].append(rloader_resume(n, batch, ours))
        print(f"[{i + 1}/{args.repeats}] rloader {times['rloader'][-1] * 1e3:.0f} ms", flush=True)
        if have_torchdata:
            times["StatefulDataLoader"].append(stateful_resume(n, batch, theirs))
            print(
                f"[{i + 1}/{args.repeats}] StatefulDataLoader "
                f"{times['StatefulDataLoader'][-1] * 1e3:.0f} ms",
                flush=True,
            )
    print(
        f"\nresume at 90% of a shuffled epoch of {n:,} samples, batch {batch}: time to the "
        f"first batch (median of {args.repeats})"
    )
    for name, values in times.items():
        if values:
            print(
                f"  {name:20s} {statistics.median(values) * 1e3:10.0f} ms "
                f"(runs {min(values) * 1e3:.0f}-{max(values) * 1e3:.0f} ms)"
            )
    comparisons = []
    if all(times.values()):
        ratio = statistics.median(times["StatefulDataLoader"]) / statistics.median(times["rloader"])
        print(f"  rloader is {ratio:.1f}x faster")
        comparisons.append(
            bench_results.comparison(
                f"resume at 90% of {n:,} samples: first batch vs torchdata StatefulDataLoader",
                times["StatefulDataLoader"],
                times["rloader"],
                smoke=args.quick,
            )
        )
    figures = {"samples": n, "batch_size": batch, "seconds": times, "comparisons": comparisons}
    path = bench_results.save("resume", figures, smoke=args.quick, started=started)
    print(f"This run's figures: {path}")


if __name__ == "__main__":
    main()
