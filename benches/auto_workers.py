"""num_workers="auto" against fixed settings, on the workloads of issue #25.

For each workload, one loader per setting is built and iterated for --epochs epochs (a training
loop that builds its DataLoader once). The table gives samples/s of the first epoch and of the
later ones (their median), for:

- ``torch nw=0``: torch.utils.data's default, the first-epoch target's reference;
- each fixed rloader setting (``nw`` × ``process``/``thread``);
- ``auto`` (``num_workers="auto"``, processes), ``auto/auto`` (with ``worker_type="auto"``)
  and ``auto/auto pf`` (with ``prefetch_factor="auto"`` too), with the workers auto ended on.

Targets (issue #25): from the second epoch, auto ≥ 0.9× the best fixed setting; in the first
epoch, ≥ 0.95× torch's ``num_workers=0``. The ``step`` workload adds a 20 ms training step per
batch (consumer-bound): auto should end on few workers at the best fixed throughput, its peak
PSS (this process's and its workers', read every 20 ms; ``--memory`` for every workload)
within 1.1× the best fixed setting's. The
``uneven`` workload's step is 1 ms but 30 ms every 10th batch: the fixed settings have torch's
prefetch (2 batches per worker), ``auto/auto pf`` tunes it. Each auto
row gives its epochs' samples/s one by one too (auto explores in its first epochs).

``imagefolder`` and ``tokens`` are the pipelines of benches/real_pipelines.py (its data, made
once into ``.bench-data/``, or ``--data-dir``): torchvision ``ImageFolder`` with the ImageNet
training transforms, batch 64; nanoGPT token windows from an ``np.memmap``, batch 32; both
shuffled. Set ``OMP_WAIT_POLICY=PASSIVE`` on a busy machine (see real_pipelines.py).

``--budget``: the memory budget row. A dataset that sleeps 1 ms per sample (work that wants
many workers) and whose every worker holds a 128 MiB buffer of its own; auto (processes) runs
with ``RLOADER_AUTO_MAX_MEMORY`` set below what 4 workers take (measured on a fixed 4-worker
loader first), and the peak of its workers' summed PSS (read every 20 ms) is set against it.

    python benches/auto_workers.py            # every workload
    python benches/auto_workers.py --quick    # smaller, for a smoke test
    python benches/auto_workers.py --only sleep --settings 0p,2p,8t,32t
    python benches/auto_workers.py --only none --budget
    python benches/auto_workers.py --epochs 4 --repeat 3   # medians of 3 runs (~35 minutes)
    python benches/auto_workers.py --only pure-python,sleep --busy 1   # beside a busy process

``--busy N``: N processes spinning in pure Python (``while True: pass``, pinned to no core) run
beside the whole sweep, fixed settings and auto alike, and are killed at its end (a shared node,
or a training step's own threads); the JSON records N.

``--repeat N``: after the sweep, torch's row, the best fixed setting and the three auto rows run
N-1 more times, in turn, each in a fresh process, and the ratios are of their medians (one
run of a row on a 2-core VM moves by +-10% and more, and the best of 9-10 fixed rows is the
luckiest of them).

Each run is written to benches/results/ as a dated JSON file (bench_results.py; a --quick
run's to benches/results/smoke/): every row's figures, and auto's ratios with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import bench_results
import numpy as np
import torch
import torch.utils.data as tud
from side_by_side import BusyDataset, ImageArrayDataset, ImageLabelDataset, SleepyDataset

import rloader
from rloader._auto import measure as auto_measure


def image_folder(n: int, data_dir: Path, quick: bool):
    from real_pipelines import imagenet_train_transform, jpeg_folder
    from torchvision import datasets as tv_datasets

    folder = jpeg_folder(data_dir, quick) / "train"
    return tv_datasets.ImageFolder(str(folder), transform=imagenet_train_transform())


def token_windows(n: int, data_dir: Path, quick: bool):
    from real_pipelines import TokenWindows, token_file

    return TokenWindows(token_file(data_dir, quick), n)


def in_memory(make):
    return lambda n, data_dir, quick: make(n)


WORKLOADS = {
    # name: (dataset(n, data dir, quick), samples (full, quick; None: the data's), batch size,
    # training step in seconds, shuffle, settings (None: --settings))
    # (the datasets of benches/side_by_side.py: ~50 us of pure Python; 1 ms sleep; in-memory
    # (float32[3, 32, 32], int) pairs; in-memory uint8 [3, 224, 224] arrays; and two pipelines
    # of benches/real_pipelines.py; uint8: 8192 arrays, 1.2 GB, so that an epoch in the main
    # process lasts ~40 ms: 2048 made 10 ms epochs, whose times a page fault or a collection
    # moved by a third)
    "pure-python": (in_memory(BusyDataset), (8192, 2048), 32, 0.0, False, None),
    "sleep": (in_memory(SleepyDataset), (4096, 1024), 32, 0.0, False, None),
    "tensors": (in_memory(ImageLabelDataset), (131072, 32768), 256, 0.0, False, None),
    "uint8": (in_memory(ImageArrayDataset), (8192, 512), 64, 0.0, False, None),
    "step": (in_memory(ImageLabelDataset), (32768, 8192), 256, 0.02, False, None),
    # (uneven steps: 1 ms, and 30 ms every 10th batch (logging, a checkpoint): the workers
    # keep up on average, but a shallow prefetch runs dry after each long step)
    "uneven": (in_memory(BusyDataset), (32768, 8192), 128, (0.001, 0.03, 10), False, None),
    # (JPEG decoding: ~300 images/s a core, so an epoch in the main process takes 5 s)
    "imagefolder": (image_folder, (None, None), 64, 0.0, True, "0p,1p,2p,4p,2t,4t,8t"),
    "tokens": (token_windows, (32768, 4096), 32, 0.0, True, None),
}

SETTINGS = "0p,1p,2p,4p,2t,4t,8t,16t,32t"
WORKER_BUFFER = 128 << 20  # the --budget dataset's buffer per worker


def parse_setting(text: str) -> tuple[int, str]:
    return int(text[:-1]), {"p": "process", "t": "thread"}[text[-1]]


WHY = False  # --why: print each auto epoch's decisions


def run(loader, epochs: int, step) -> list[float]:
    """Seconds per epoch. ``step``: the training step's seconds, or (seconds, seconds of every
    ``every``-th, every)."""
    fast, slow, every = step if isinstance(step, tuple) else (step, step, 1)
    times = []
    for e in range(epochs):
        start = time.perf_counter()
        for k, _batch in enumerate(loader, 1):
            if step:
                time.sleep(slow if k % every == 0 else fast)
        times.append(time.perf_counter() - start)
        stats = loader.stats() if WHY and type(loader) is rloader.DataLoader else None
        if stats is not None and "auto" in stats:
            for d in stats["auto"]["decisions"]:
                print(
                    f"{'':27} epoch {e + 1} batch {d['batch']} ({d['at_s']:.3f} s): "
                    f"{d['num_workers']} {d['worker_type']} (prefetch_factor "
                    f"{d.get('prefetch_factor')}): {d['reason']}"
                )
    return times


def measure(name: str, label: str, loader, n: int, epochs: int, step, memory=False) -> tuple:
    """Prints and returns (samples/s of the first epoch, median samples/s of the later ones,
    the peak PSS of this process and its workers while it ran, with ``memory``, else None)."""
    meter = PeakPss(include_self=True) if memory else None
    times = run(loader, epochs, step)
    peak = meter.stop() if meter is not None else None
    first = n / times[0]
    later = n / statistics.median(times[1:]) if len(times) > 1 else float("nan")
    note = ""
    stats = loader.stats() if type(loader) is rloader.DataLoader else None
    if stats is not None and "auto" in stats:
        auto = stats["auto"]
        prefetch = f" (prefetch_factor {auto['prefetch_factor']})" if auto["num_workers"] else ""
        note = f"ended on {auto['num_workers']} {auto['worker_type']}{prefetch}; epochs/s: "
        note += " ".join(f"{n / t:.0f}" for t in times)
    if peak is not None:
        note = f"peak PSS {peak / 2**20:.0f} MiB; " + note
    print(f"{name:12} {label:14} {first:10.0f} {later:10.0f}  {note}", flush=True)
    return first, later, peak


class WorkerBuffer(SleepyDataset):
    """Sleeps 1 ms per sample; each worker process holds a buffer of its own (a per-worker
    cache, a decoder's state), written once so its pages are the worker's."""

    buffer = None

    def __getitem__(self, i: int) -> int:
        if tud.get_worker_info() is not None and WorkerBuffer.buffer is None:
            WorkerBuffer.buffer = np.ones(WORKER_BUFFER, np.uint8)
        return super().__getitem__(i)


def children() -> list:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return pids


class PeakPss:
    """The peak of this process's children's summed PSS (and its own, with ``include_self``),
    read every 20 ms on a thread."""

    def __init__(self, include_self: bool = False) -> None:
        self.peak = 0
        self._self = include_self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            pids = children() + ([os.getpid()] if self._self else [])
            total = sum(auto_measure.process_memory(pid) or 0 for pid in pids)
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def budget_row(quick: bool, epochs: int) -> None:
    n = 1024 if quick else 4096
    dataset = WorkerBuffer(n)
    print(f"\nbudget: {n} samples sleeping 1 ms, batch 32, {WORKER_BUFFER >> 20} MiB per worker")
    meter = PeakPss()
    fixed = rloader.DataLoader(dataset, batch_size=32, num_workers=4, persistent_workers=True)
    run(fixed, 2, 0.0)
    four = meter.stop()
    del fixed
    budget = int(four * 0.75)
    os.environ[auto_measure.MEMORY_ENV] = str(budget)
    try:
        meter = PeakPss()
        loader = rloader.DataLoader(
            dataset, batch_size=32, num_workers="auto", persistent_workers=True
        )
        times = run(loader, epochs, 0.0)
        peak = meter.stop()
    finally:
        del os.environ[auto_measure.MEMORY_ENV]
    chosen = sorted({d["num_workers"] for d in loader.stats()["auto"]["decisions"]})
    print(
        f"fixed 4 processes: peak PSS {four / 2**20:.0f} MiB; auto with {auto_measure.MEMORY_ENV}="
        f"{budget / 2**20:.0f} MiB (0.75x): peak PSS {peak / 2**20:.0f} MiB "
        f"({peak / budget:.2f}x the budget; target <= 1), pools of {chosen} workers in the "
        f"last epoch, ended on {loader.stats()['auto']['num_workers']}; epochs/s: "
        + " ".join(f"{n / t:.0f}" for t in times)
    )


RESULT = "RESULT "  # the line a row's process ends with: its figures, as JSON


def one_row(spec: dict) -> None:
    """``--row``: one row, in this fresh process; prints its line, then ``RESULT`` and its
    figures as JSON."""
    global WHY
    WHY = spec["why"]
    if spec.get("budget"):
        budget_row(spec["quick"], spec["epochs"])
        print(RESULT + "{}", flush=True)
        return
    make, sizes, batch_size, step, shuffle, _ = WORKLOADS[spec["workload"]]
    n = sizes[1] if spec["quick"] else sizes[0]
    dataset = make(n, Path(spec["data_dir"]), spec["quick"])
    n = len(dataset)
    kw = spec["kw"]
    if kw is None:
        loader = tud.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
    else:
        # (each loader shuffles with its own generator, seeded alike)
        generator = torch.Generator().manual_seed(0) if shuffle else None
        loader = rloader.DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, **kw
        )
    step = tuple(step) if isinstance(step, (list, tuple)) else step
    first, later, peak = measure(
        spec["workload"], spec["label"], loader, n, spec["epochs"], step, spec["memory"]
    )
    print(RESULT + json.dumps({"first": first, "later": later, "peak": peak}), flush=True)


def in_fresh_process(spec: dict) -> tuple:
    """Runs one row in a process of its own and returns its (first, later, peak). Each row
    starts as a training script does, in a fresh interpreter: in one process, the rows before
    it (their datasets, their pools, the memory they freed) moved a row's first epoch most,
    since every worker process forked copies the parent's page tables."""
    command = [sys.executable, str(Path(__file__).resolve()), "--row", json.dumps(spec)]
    result = None
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(RESULT):
                result = json.loads(line[len(RESULT) :])
            else:
                print(line, end="", flush=True)
    if child.returncode or result is None:
        raise SystemExit(f"the row {spec} failed (exit status {child.returncode})")
    return result.get("first"), result.get("later"), result.get("peak")


class BusyProcesses:
    """``n`` processes spinning in pure Python while the block runs (``--busy``), killed at its
    end, on an error too."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list = []

    def __enter__(self) -> "BusyProcesses":
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--settings", default=None, help=f"default: {SETTINGS}")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: .bench-data/")
    parser.add_argument("--budget", action="store_true", help="the memory budget row too")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of torch's row, the best fixed setting and the auto rows (their medians)",
    )
    parser.add_argument("--why", action="store_true", help="print auto's decisions, each epoch")
    parser.add_argument(
        "--busy", type=int, default=0, help="processes spinning in pure Python beside the run"
    )
    parser.add_argument(
        "--memory", action="store_true", help="each row's peak PSS (always for step)"
    )
    parser.add_argument(
        "--no-persistent",
        dest="persistent",
        action="store_false",
        help="fixed and auto loaders without persistent_workers (each epoch starts its pools)",
    )
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row is not None:
        one_row(json.loads(args.row))
        return
    from real_pipelines import DEFAULT_DATA_DIR

    started = bench_results.now()
    with BusyProcesses(args.busy):
        figures = sweep(args, DEFAULT_DATA_DIR)
    path = bench_results.save(
        "auto_workers",
        figures,
        smoke=args.quick,
        started=started,
        persistent=args.persistent,
        busy_processes=args.busy,
    )
    print(f"\nThis run's figures: {path}")


def sweep(args, default_data_dir: Path) -> dict:
    """Every workload's rows (``main``), as the figures the run's JSON holds."""
    figures: dict = {"epochs": args.epochs, "repeat": args.repeat, "workloads": {}}
    figures["comparisons"] = comparisons = []

    data_dir = args.data_dir or default_data_dir
    print(
        f"cores usable: {auto_measure.usable_cores()}, epochs: {args.epochs}, "
        f"persistent_workers: {args.persistent}, busy processes beside it: {args.busy}; "
        "each row in a fresh process"
    )
    header = f"{'workload':12} {'setting':14} {'epoch 1/s':>10} {'later/s':>10}  note"
    common = {"quick": args.quick, "data_dir": str(data_dir), "why": args.why}
    if args.budget:
        in_fresh_process({**common, "budget": True, "epochs": args.epochs})
    for name in [w for w in args.only.split(",") if w != "none"]:
        own_settings = WORKLOADS[name][5]
        settings_text = args.settings or own_settings or SETTINGS
        settings = [parse_setting(s) for s in settings_text.split(",")]
        # (the pipelines' data made here, once, so that no row's time holds its making)
        if name == "imagefolder":
            from real_pipelines import jpeg_folder

            jpeg_folder(data_dir, args.quick)
        elif name == "tokens":
            from real_pipelines import token_file

            token_file(data_dir, args.quick)
        print(f"\n{header}")

        # (the consumer-bound workload's target is memory too: each row's peak PSS, this
        # process's and its workers', read every 20 ms)
        memory = args.memory or name == "step"

        def row(label, kw, epochs=args.epochs, name=name, memory=memory):
            spec = {**common, "workload": name, "label": label, "kw": kw, "epochs": epochs}
            return in_fresh_process({**spec, "memory": memory})

        # Each row once; with --repeat, torch's row, the best fixed setting and the auto rows
        # again, in turn, and each figure their median: one run of a row on this VM moves by
        # +-10% and more, and the best of 9-10 fixed rows is the luckiest of them.
        torch_firsts = [row("torch nw=0", None, 1)[0]]
        fixed_kw, fixed = {}, {}  # label: kw; label: [(first, later, peak)]
        for nw, kind in settings:
            label = f"{nw} {kind}"
            fixed_kw[label] = {
                "num_workers": nw,
                "worker_type": kind,
                "persistent_workers": args.persistent and nw > 0,
            }
            fixed[label] = [row(label, fixed_kw[label])]
        best = max(fixed, key=lambda label: fixed[label][0][1])
        auto_kw = {
            label: {
                "num_workers": "auto",
                "worker_type": kind,
                "persistent_workers": args.persistent,
                "prefetch_factor": prefetch,
            }
            for label, kind, prefetch in (
                ("auto", "process", None),
                ("auto/auto", "auto", None),
                ("auto/auto pf", "auto", "auto"),
            )
        }
        autos = {label: [row(label, kw)] for label, kw in auto_kw.items()}
        for _ in range(1, args.repeat):
            torch_firsts.append(row("torch nw=0", None, 1)[0])
            fixed[best].append(row(best, fixed_kw[best]))
            for label, kw in auto_kw.items():
                autos[label].append(row(label, kw))
        summarize(torch_firsts, fixed, best, autos, args.repeat)
        # (a row's name says the load it ran beside: bench_results.py shows runs side by side)
        scored = f"{name} beside {args.busy} busy processes" if args.busy else name
        comparisons += auto_comparisons(scored, torch_firsts, fixed, best, autos, args.quick)
        figures["workloads"][name] = {
            "torch nw=0 first": torch_firsts,
            "best fixed": best,
            # label: [[first epoch, later epochs, peak PSS], ...] per run, samples/s and bytes
            "rows": {**fixed, **autos},
        }
    return figures


def median_of(results: list, i: int) -> Optional[float]:
    values = [r[i] for r in results if r[i] is not None]
    return statistics.median(values) if values else None


def auto_comparisons(
    name: str, torch_firsts: list, fixed: dict, best: str, autos: dict, smoke: bool
) -> list:
    """Each auto row's first epoch against torch's ``num_workers=0`` and its later epochs against
    the best fixed setting, run by run (their samples/s as seconds per sample)."""
    rows = []
    for label, results in autos.items():
        firsts = [1 / r[0] for r in results]
        rows.append(
            bench_results.comparison(
                f"{name}: {label}, first epoch vs torch nw=0",
                [1 / f for f in torch_firsts[: len(firsts)]],
                firsts,
                target=0.95,
                smoke=smoke,
            )
        )
        best_runs = fixed[best]
        laters = [r[1] for r in best_runs + results]
        if len(best_runs) == len(results) and None not in laters:
            rows.append(
                bench_results.comparison(
                    f"{name}: {label}, later epochs vs the best fixed ({best})",
                    [1 / r[1] for r in best_runs],
                    [1 / r[1] for r in results],
                    target=0.9,
                    smoke=smoke,
                )
            )
    return rows


def summarize(torch_firsts: list, fixed: dict, best: str, autos: dict, repeat: int) -> None:
    """Each auto row's figures against torch's first epoch and the best fixed setting's later
    ones (medians over the runs of each: ``--repeat``)."""
    torch_first = statistics.median(torch_firsts)
    best_later, best_peak = median_of(fixed[best], 1), median_of(fixed[best], 2)
    # (the best process setting: num_workers=0 counts as one of either kind)
    processes = {
        label: median_of(runs, 1)
        for label, runs in fixed.items()
        if label.endswith("process") or label.startswith("0 ")
    }
    runs = f"; medians of {repeat} runs" if repeat > 1 else ""
    for label, results in autos.items():
        first, later, peak = (median_of(results, i) for i in range(3))
        own = ""
        if label == "auto" and processes:
            setting = max(processes, key=lambda k: processes[k])
            own = f", {later / processes[setting]:.2f}× the best process setting ({setting})"
        if peak is not None and best_peak:
            own += f"; peak PSS {peak / best_peak:.2f}× the best fixed setting's (target ≤ 1.1)"
        print(
            f"{label:>27}  first epoch {first / torch_first:.2f}× torch nw=0 (target ≥ 0.95), "
            f"later {later / best_later:.2f}× best fixed ({best}; target ≥ 0.9){own}{runs}"
        )


if __name__ == "__main__":
    main()
