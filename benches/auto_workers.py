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

import numpy as np
import torch
import torch.utils.data as tud

import rloader


class PurePython(tud.Dataset):
    """About 50 µs of pure Python per sample (holds the GIL)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        x = 0
        for k in range(600):
            x += (i * k) % 7
        return x


class Sleeps(tud.Dataset):
    """1 ms of waiting per sample (I/O-like: releases the GIL)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.001)
        return i


class Tensors(tud.Dataset):
    """(float32[3, 32, 32], int) pairs from memory."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 3, 32, 32)
        self.y = torch.randint(0, 10, (n,))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], int(self.y[i])


class Images(tud.Dataset):
    """uint8 [3, 224, 224] numpy arrays from memory."""

    def __init__(self, n: int) -> None:
        self.x = np.random.randint(0, 255, (n, 3, 224, 224), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i]


WORKLOADS = {
    # name: (dataset, samples (full, quick), batch size, training step in seconds)
    "pure-python": (PurePython, (8192, 2048), 32, 0.0),
    "sleep": (Sleeps, (4096, 1024), 32, 0.0),
    "tensors": (Tensors, (131072, 32768), 256, 0.0),
    "uint8": (Images, (2048, 512), 64, 0.0),
    "step": (Tensors, (32768, 8192), 256, 0.02),
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--settings", default=SETTINGS)
    args = parser.parse_args()
    settings = [parse_setting(s) for s in args.settings.split(",")]
    print(f"cores usable: {rloader._auto.usable_cores()}, epochs: {args.epochs}")
    header = f"{'workload':12} {'setting':14} {'epoch 1/s':>10} {'later/s':>10}  note"
    for name in args.only.split(","):
        make, sizes, batch_size, step = WORKLOADS[name]
        n = sizes[1] if args.quick else sizes[0]
        dataset = make(n)
        print(f"\n{header}")
        rows = []

        def row(label, loader, epochs=args.epochs):
            times = run(loader, epochs, step)
            first = n / times[0]
            later = n / statistics.median(times[1:]) if len(times) > 1 else float("nan")
            note = ""
            stats = loader.stats() if isinstance(loader, rloader.DataLoader) else None
            if stats is not None and "auto" in stats:
                a = stats["auto"]
                note = f"ended on {a['num_workers']} {a['worker_type']}"
            rows.append((label, first, later))
            print(f"{name:12} {label:14} {first:10.0f} {later:10.0f}  {note}", flush=True)
            return first, later

        torch_first, _ = row("torch nw=0", tud.DataLoader(dataset, batch_size=batch_size), 1)
        best = ("", 0.0)
        for nw, kind in settings:
            loader = rloader.DataLoader(
                dataset,
                batch_size=batch_size,
                num_workers=nw,
                worker_type=kind,
                persistent_workers=nw > 0,
            )
            _, later = row(f"{nw} {kind}", loader)
            if later > best[1]:
                best = (f"{nw} {kind}", later)
            del loader
        for label, kind in (("auto", "process"), ("auto/auto", "auto")):
            loader = rloader.DataLoader(
                dataset, batch_size=batch_size, num_workers="auto", worker_type=kind
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
