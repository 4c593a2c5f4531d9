"""num_workers="auto" against fixed settings, on the workloads of issue #25 that need no data.

For each workload, one loader per setting is built and iterated for --epochs epochs (a training
loop that builds its DataLoader once). The table gives samples/s of the first epoch and of the
later ones (their median), for:

- ``torch nw=0``: torch.utils.data's default, the first-epoch target's reference;
- each fixed rloader setting (``nw`` × ``process``/``thread``);
- ``auto`` (``num_workers="auto"``, processes) and ``auto/auto`` (with ``worker_type="auto"``),
  with the workers auto ended on.

Targets (issue #25): from the second epoch, auto ≥ 0.9× the best fixed setting; in the first
epoch, ≥ 0.95× torch's ``num_workers=0``. The ``step`` workload adds a 20 ms training step per
batch (consumer-bound): auto should end on few workers at the best fixed throughput.

    python benches/auto_workers.py            # every workload
    python benches/auto_workers.py --quick    # smaller, for a smoke test
    python benches/auto_workers.py --only sleep --settings 0p,2p,8t,32t
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch.utils.data as tud
from side_by_side import BusyDataset, ImageArrayDataset, ImageLabelDataset, SleepyDataset

import rloader

WORKLOADS = {
    # name: (dataset, samples (full, quick), batch size, training step in seconds)
    # (the datasets of benches/side_by_side.py: ~50 us of pure Python; 1 ms sleep; in-memory
    # (float32[3, 32, 32], int) pairs; in-memory uint8 [3, 224, 224] arrays)
    "pure-python": (BusyDataset, (8192, 2048), 32, 0.0),
    "sleep": (SleepyDataset, (4096, 1024), 32, 0.0),
    "tensors": (ImageLabelDataset, (131072, 32768), 256, 0.0),
    "uint8": (ImageArrayDataset, (2048, 512), 64, 0.0),
    "step": (ImageLabelDataset, (32768, 8192), 256, 0.02),
}

SETTINGS = "0p,1p,2p,4p,2t,4t,8t,16t,32t"


def parse_setting(text: str) -> tuple[int, str]:
    return int(text[:-1]), {"p": "process", "t": "thread"}[text[-1]]


def run(loader, epochs: int, step: float) -> list[float]:
    """Seconds per epoch."""
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for _batch in loader:
            if step:
                time.sleep(step)
        times.append(time.perf_counter() - start)
    return times


def measure(name: str, label: str, loader, n: int, epochs: int, step: float) -> tuple:
    """Prints and returns (samples/s of the first epoch, median samples/s of the later ones)."""
    times = run(loader, epochs, step)
    first = n / times[0]
    later = n / statistics.median(times[1:]) if len(times) > 1 else float("nan")
    note = ""
    stats = loader.stats() if type(loader) is rloader.DataLoader else None
    if stats is not None and "auto" in stats:
        auto = stats["auto"]
        note = f"ended on {auto['num_workers']} {auto['worker_type']}"
    print(f"{name:12} {label:14} {first:10.0f} {later:10.0f}  {note}", flush=True)
    return first, later


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--settings", default=SETTINGS)
    parser.add_argument(
        "--no-persistent",
        dest="persistent",
        action="store_false",
        help="fixed and auto loaders without persistent_workers (each epoch starts its pools)",
    )
    args = parser.parse_args()
    settings = [parse_setting(s) for s in args.settings.split(",")]
    print(
        f"cores usable: {rloader._auto.usable_cores()}, epochs: {args.epochs}, "
        f"persistent_workers: {args.persistent}"
    )
    header = f"{'workload':12} {'setting':14} {'epoch 1/s':>10} {'later/s':>10}  note"
    for name in args.only.split(","):
        make, sizes, batch_size, step = WORKLOADS[name]
        n = sizes[1] if args.quick else sizes[0]
        dataset = make(n)
        print(f"\n{header}")

        def row(label, loader, epochs=args.epochs, n=n, step=step, name=name):
            return measure(name, label, loader, n, epochs, step)

        torch_first, _ = row("torch nw=0", tud.DataLoader(dataset, batch_size=batch_size), 1)
        best = ("", 0.0)
        for nw, kind in settings:
            loader = rloader.DataLoader(
                dataset,
                batch_size=batch_size,
                num_workers=nw,
                worker_type=kind,
                persistent_workers=args.persistent and nw > 0,
            )
            _, later = row(f"{nw} {kind}", loader)
            if later > best[1]:
                best = (f"{nw} {kind}", later)
            del loader
        for label, kind in (("auto", "process"), ("auto/auto", "auto")):
            loader = rloader.DataLoader(
                dataset,
                batch_size=batch_size,
                num_workers="auto",
                worker_type=kind,
                persistent_workers=args.persistent,
            )
            first, later = row(label, loader)
            print(
                f"{'':12} {'':14} {'':>10} {'':>10}  first epoch {first / torch_first:.2f}× "
                f"torch nw=0 (target ≥ 0.95), later {later / best[1]:.2f}× best fixed "
                f"({best[0]}; target ≥ 0.9)"
            )
            del loader


if __name__ == "__main__":
    main()
