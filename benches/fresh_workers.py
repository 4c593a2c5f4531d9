"""Fresh worker processes under a real training script's heap, rloader vs torch (issue #36).

A training script's parent process holds what it imported and built (torchvision, a model, a
dataset and its index) when it forks new workers each epoch (``persistent_workers=False``,
torch's default). Whatever a forked worker writes of that heap is copied, and a garbage
collection in the worker that runs over the inherited objects writes all of them. Each run here
is a script of its own, a child process that imports and builds what such a script does and
then iterates its loader for a few epochs, so that one library's epochs never run (or leave)
the other's collections; the runs alternate, torch then rloader, ``--repeats`` times.

  reference     torchvision's classification reference (references/classification/train.py)
                as its parent stands: torchvision imported, ``ImageFolder`` over real_pipelines'
                JPEG folder with ``ClassificationPresetTrain``'s transforms
                (``RandomResizedCrop(224)``, ``RandomHorizontalFlip``, ``PILToTensor``,
                ``ConvertImageDtype(float)``, ``Normalize``), ``resnet50(weights=None)``, its
                loss and SGD optimizer built; batch 32, shuffled, 2 fresh workers.
  index         a dataset holding a per-sample Python index: COCO-style person keypoint
                annotations (one record per sample: 17 keypoints, a box, an area, ids and a
                file name; about 29 Python objects each) read with ``json.load``; a sample is
                its record's keypoints ``[17, 3]``, box ``[4]`` and category; batch 64,
                shuffled, 2 fresh workers.
  index-memory  the same parent with 4 fresh workers: each worker's proportional set size
                (PSS, /proc/self/smaps_rollup) as it leaves, its share of the epoch done.
                A ``worker_init_fn`` (the same for both libraries) registers the reading with
                multiprocessing's exit finalizers, which run when the worker's loop returns.
  index-memory-unread
                the same, but each sample is one fixed sample that reads no record: the memory
                row's control (not scored). Reading a record writes the reference counts of
                the objects read, so a worker copies the pages of its share of the index with
                either library; without those writes, what is left is what the libraries do.

The timing rows are the epochs after a script's first (its time from ``iter()`` to the end of
the epoch, and to the first batch), paired run by run and epoch by epoch; a ratio is torch's
median time over rloader's (above 1: rloader is faster). The memory row pairs each run's median
worker PSS in its epochs after the first; its ratio is torch's PSS over rloader's.

Whether a worker's collections reach the inherited heap depends on where the parent's collector
stands at the fork, which a script's allocations decide, not its author. So each shape runs in
two states (``--collector``): ``as-built``, as building the script left it, and ``due``, with a
full collection due within the next young collections of whichever process gets there first
(``hold_full_collection_due``), as a real script's parent after its imports (issue #36 found
``gc.get_count()`` at ``(0, 0, 12)`` there). The state is made again before each epoch, at its
fork: the epoch before may have run the collection in the parent (torch's, with 4 workers,
does in its first epoch, after its workers have forked, leaving later epochs none due) or in
no process. It exists on CPython 3.9-3.12 only (``DUE_STATE_HOLDS``): elsewhere the ``due``
rows are left out, with a note. Each run records the parent's ``gc.get_count()`` at each
epoch's ``iter()``, and each full collection in the parent (not the state's own) and in its
workers, with its seconds (a ``gc.callbacks`` entry that forked workers inherit).

    python benches/fresh_workers.py                   # every shape, 3 repeats (make bench-real)
    python benches/fresh_workers.py --quick           # small sizes, a smoke test (not scored)
    python benches/fresh_workers.py --shapes index,index-memory --collector due --repeats 5
    python benches/fresh_workers.py --shapes index-memory,index-memory-unread --repeats 3

Data comes from real_pipelines.py's cache (``.bench-data/``; ``--data-dir``): its JPEG folder,
and an annotations file made here at the first run. Each run is written to benches/results/
as a dated JSON file (bench_results.py; a --quick run's to benches/results/smoke/).
"""

from __future__ import annotations

# The standard library and torch at the top: this file is also each run's script
# (``--child``), whose heap is what is measured, and the driver's imports stay out of it.
import argparse
import functools
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.utils.data

LIBS = ("torch", "rloader")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
KEYPOINTS = 17


# ---------------------------------------------------------------------------------------------
# The scripts: what one run's child process builds, then iterates


def data_loader_class(lib: str):
    if lib == "torch":
        from torch.utils.data import DataLoader
    else:
        from rloader import DataLoader
    return DataLoader


def reference_script(spec: dict):
    """The classification reference's parent: its transforms as ``ClassificationPresetTrain``
    builds them (PIL backend, no auto-augment, bilinear), an ImageFolder, the model, loss and
    optimizer; its training loader with 2 workers (the reference's default is 16)."""
    import torchvision
    from torchvision import transforms as T
    from torchvision.transforms.functional import InterpolationMode

    transform = T.Compose(
        [
            T.RandomResizedCrop(224, interpolation=InterpolationMode.BILINEAR, antialias=True),
            T.RandomHorizontalFlip(0.5),
            T.PILToTensor(),
            T.ConvertImageDtype(torch.float),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(spec["folder"], transform)
    model = torchvision.models.resnet50(weights=None, num_classes=len(dataset.classes))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loader = data_loader_class(spec["lib"])(
        dataset, batch_size=32, shuffle=True, num_workers=2, persistent_workers=False
    )
    return loader, (model, criterion, optimizer)


class KeypointIndex(torch.utils.data.Dataset):
    """A person-keypoints dataset over annotations held as Python objects, one record each."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.records = json.load(f)["annotations"]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        record = self.records[i]
        keypoints = torch.tensor(record["keypoints"], dtype=torch.float32).view(KEYPOINTS, 3)
        return keypoints, torch.tensor(record["bbox"]), record["category_id"]


class UnreadKeypointIndex(KeypointIndex):
    """The same index, held the same way, whose samples read no record: each is one fixed
    sample of the same shapes (the control of the memory row: a worker's memory without the
    reference counts that reading its share of the records writes)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.sample = (torch.zeros(KEYPOINTS, 3), torch.zeros(4), 1)

    def __getitem__(self, i: int):
        return self.sample


def index_script(spec: dict, num_workers: int = 2, dataset_class=KeypointIndex, **extra):
    loader = data_loader_class(spec["lib"])(
        dataset_class(spec["annotations"]),
        batch_size=64,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=False,
        **extra,
    )
    return loader, None


def report_at_exit(folder: str, worker_id: int) -> None:
    """A ``worker_init_fn``: as the worker leaves, writes its PSS and private memory (bytes)
    to ``folder/<pid>.json``."""
    from multiprocessing import util

    def report() -> None:
        with open("/proc/self/smaps_rollup") as f:
            kib = {line.split(":")[0]: int(line.split()[1]) for line in f if line.endswith(" kB\n")}
        out = {
            "worker_id": worker_id,
            "pss": kib["Pss"] * 1024,
            "private": (kib["Private_Clean"] + kib["Private_Dirty"]) * 1024,
        }
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(out))

    # Run by multiprocessing when the worker's process function returns (torch's and rloader's
    # workers both end so), before the process exits.
    util.Finalize(None, report, exitpriority=100)


# How far the parent's survivors since its last full collection stay short of a quarter of the
# heap (the share that lets CPython run the next full collection) in the "due" state.
DUE_MARGIN = 50


# The rule below is CPython 3.9-3.12's; from 3.13 these steps leave no full collection due (a
# forked child's next young collections run none), so there the "due" rows are as built's.
DUE_STATE_HOLDS = sys.version_info < (3, 13)


def hold_full_collection_due(margin: int = DUE_MARGIN) -> list:
    """Leaves this process's collector with a full collection due within its next two young
    collections, whichever process makes them: the parent or each worker it forks.

    CPython runs a full (generation 2) collection when more than 10 generation-1 collections
    happened since the last one and the objects they moved to generation 2 since are at least a
    quarter of those it found alive then. A full collection now, then that quarter less
    ``margin`` of new long-lived objects (returned: the caller keeps them), 12 generation-1
    collections and 11 generation-0 ones leave the counts at (0, 11, 12): the next young
    collection is a generation-1 one, and once it moves ``margin`` survivors the following one
    is full. Which process gets there first depends on what each allocates, as issue #36 found
    in the reference script (torch's parent ran it, rloader's workers did)."""
    enabled = gc.isenabled()
    gc.disable()  # (no automatic collection in between)
    try:
        gc.collect()
        alive = len(gc.get_objects(generation=2))
        kept = [[] for _ in range(max(0, alive // 4 - margin))]
        for _ in range(12):
            gc.collect(1)
        for _ in range(11):
            gc.collect(0)
    finally:
        if enabled:
            gc.enable()
    return kept


class FullCollections:
    """The full (generation 2) collections of this process and of the workers it forks, with
    how long each took: a ``gc.callbacks`` entry, which a forked worker inherits, and which
    there appends each of its own to a file the parent reads after the epoch."""

    def __init__(self, folder: Path) -> None:
        self.pid, self.path = os.getpid(), folder / "worker-full-collections.txt"
        self.started = 0.0
        self.parent: list = []
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        if os.getpid() == self.pid:
            self.parent.append(took)
        else:
            with open(self.path, "a") as f:
                f.write(f"{took}\n")

    def without(self, make):
        """``make()``, with the full collections it runs in this process left unrecorded."""
        recorded = len(self.parent)
        made = make()
        del self.parent[recorded:]
        return made

    def epoch(self) -> tuple:
        """The seconds of each full collection since the last call: the parent's, the workers'."""
        parent, self.parent = self.parent, []
        try:
            workers = [float(line) for line in self.path.read_text().split()]
            self.path.unlink()
        except FileNotFoundError:
            workers = []
        return parent, workers


def worker_reports(folder: Path, workers: int, timeout: float = 30.0) -> list:
    """The reports of an epoch's workers, once all have left; the folder emptied for the next."""
    deadline = time.monotonic() + timeout
    while len(found := sorted(folder.glob("*.json"))) < workers:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {workers} workers reported their memory")
        time.sleep(0.02)
    reports = [json.loads(p.read_text()) for p in found]
    for p in found:
        p.unlink()
    return reports


def child(spec: dict) -> dict:
    """One run: builds the shape's script, iterates it ``epochs`` times, returns its figures."""
    shape, memory = spec["shape"], spec["shape"] in MEMORY_SHAPES
    reports_dir = Path(tempfile.mkdtemp(prefix="fresh-workers-"))
    if shape == "reference":
        loader, _kept = reference_script(spec)
    elif memory:
        init = functools.partial(report_at_exit, str(reports_dir))
        dataset_class = UnreadKeypointIndex if shape == "index-memory-unread" else KeypointIndex
        loader, _kept = index_script(
            spec, num_workers=4, dataset_class=dataset_class, worker_init_fn=init
        )
    else:
        loader, _kept = index_script(spec)
    out: dict = {"gc_count_before": [], "epoch_s": [], "first_batch_s": []}
    out["samples"], out["workers"] = [], []
    out["parent_full_collections_s"], out["worker_full_collections_s"] = [], []
    full = FullCollections(reports_dir)
    _held = None
    try:
        for epoch in range(spec["epochs"]):
            if spec["collector"] == "due":
                # Due again at each epoch's fork: the epoch before may have run it, in the
                # parent (torch's, with 4 workers, does in its first) or in no process. The
                # last quarter's objects go first; the hold's own collection is not recorded.
                _held = None
                _held = full.without(hold_full_collection_due)
            out["gc_count_before"].append(list(gc.get_count()))
            start = time.perf_counter()
            batches = iter(loader)
            samples = len(next(batches)[0])
            first = time.perf_counter() - start
            for batch in batches:
                samples += len(batch[0])
            elapsed = time.perf_counter() - start
            del batches
            out["epoch_s"].append(elapsed)
            out["first_batch_s"].append(first)
            out["samples"].append(samples)
            if memory:
                out["workers"].append(worker_reports(reports_dir, loader.num_workers))
            parent, workers = full.epoch()
            out["parent_full_collections_s"].append(parent)
            out["worker_full_collections_s"].append(workers)
            sys.stderr.write(
                f"[{shape}] {spec['lib']:<7} epoch {epoch + 1}: {elapsed:6.2f} s, "
                f"first batch {first:.3f} s\n"
            )
    finally:
        gc.callbacks.remove(full)
        shutil.rmtree(reports_dir, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# The driver: data, runs, tables


def annotation_params(quick: bool) -> dict:
    return {"records": 10_000 if quick else 100_000, "width": 640, "height": 480, "seed": 0}


def annotations(root: Path, quick: bool) -> Path:
    """``annotations.json``: COCO's person-keypoints layout, ``{"annotations": [record, ...]}``,
    three people an image."""
    import numpy as np
    import real_pipelines

    p = annotation_params(quick)

    def make(folder: Path) -> None:
        rng = np.random.default_rng(p["seed"])
        records = []
        for i in range(p["records"]):
            xs = rng.integers(0, p["width"], KEYPOINTS)
            ys = rng.integers(0, p["height"], KEYPOINTS)
            visible = rng.integers(0, 3, KEYPOINTS)
            x, y = rng.uniform(0, p["width"] / 2), rng.uniform(0, p["height"] / 2)
            w, h = rng.uniform(20, p["width"] / 2), rng.uniform(20, p["height"] / 2)
            records.append(
                {
                    "id": i,
                    "image_id": i // 3,
                    "file_name": f"{i // 3:012d}.jpg",
                    "category_id": 1,
                    "iscrowd": 0,
                    "bbox": [round(float(v), 2) for v in (x, y, w, h)],
                    "area": round(float(w * h), 2),
                    "num_keypoints": int((visible > 0).sum()),
                    "keypoints": np.stack([xs, ys, visible], 1).ravel().tolist(),
                }
            )
        (folder / "annotations.json").write_text(json.dumps({"annotations": records}))

    name = f"keypoints-{p['records']}"
    return real_pipelines.cached(root, name, p, make) / "annotations.json"


SHAPES = ("reference", "index", "index-memory", "index-memory-unread")
MEMORY_SHAPES = ("index-memory", "index-memory-unread")
TITLES = {
    "reference": (
        "classification reference's parent: torchvision ImageFolder ({samples:,} JPEGs) with "
        "ClassificationPresetTrain's transforms, resnet50 built, batch 32, 2 fresh workers"
    ),
    "index": (
        "per-sample Python index: {samples:,} COCO-style keypoint records from json.load, "
        "batch 64, 2 fresh workers"
    ),
    "index-memory": (
        "the same index parent, 4 fresh workers: each worker's PSS as it leaves, "
        "its share of the epoch done"
    ),
    "index-memory-unread": (
        "the same index parent, 4 fresh workers whose samples read no record (one fixed "
        "sample): each worker's PSS as it leaves (not scored: the memory row's control)"
    ),
}
# The memory rows' target: the issue's, for workers that read their share of the index.
PSS_TARGETS = {"index-memory": 1.5, "index-memory-unread": None}


def run_child(spec: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {spec['shape']} script with {spec['lib']} failed (see above)")
    return json.loads(done.stdout)


def later(runs: list, key: str) -> list:
    """A value per epoch after each run's first, in run order: the pairs of the comparison."""
    return [v for run in runs for v in run[key][1:]]


def collections(runs: list, who: str) -> str:
    """``who``'s (parent or worker) full collections in the runs' later epochs: how many, and
    the seconds they took in all."""
    took = [t for r in runs for epoch in r[f"{who}_full_collections_s"][1:] for t in epoch]
    return f"{len(took)}, {sum(took):.2f} s"


def median_worker(epoch: list, key: str) -> float:
    return statistics.median(w[key] for w in epoch)


COLLECTORS = {
    "as-built": "the parent's collector as building the script left it",
    "due": "the parent's collector with a full collection due (hold_full_collection_due)",
}


FULL_HEADERS = ("parent's full", "workers' full", "parent gc")


def report(shape: str, collector: str, runs: dict, samples: int, smoke: bool) -> tuple:
    """Prints a shape's tables; returns (targets met, targets) and its figures."""
    import bench_results
    from real_pipelines import RATIO_HEADERS, print_table, ratio_cells

    key = f"{shape}, {collector}"
    print(f"\n== {key}: {TITLES[shape].format(samples=samples)}; {COLLECTORS[collector]}\n")
    rows, comparisons = [], []
    if shape in MEMORY_SHAPES:
        per_run = {
            lib: [statistics.median(median_worker(e, "pss") for e in r["workers"][1:]) for r in rs]
            for lib, rs in runs.items()
        }
        for lib, rs in runs.items():
            epochs = [e for r in rs for e in r["workers"][1:]]
            private = statistics.median(median_worker(e, "private") for e in epochs)
            rows.append(
                (
                    lib,
                    f"{statistics.median(per_run[lib]) / 2**20:,.0f}",
                    f"{private / 2**20:,.0f}",
                    collections(rs, "parent"),
                    collections(rs, "worker"),
                    str(rs[0]["gc_count_before"][1]),
                )
            )
        headers = ("loader", "PSS MiB/worker", "private MiB", *FULL_HEADERS)
        target = PSS_TARGETS[shape]
        comparisons.append((f"{key}: PSS per worker", per_run["torch"], per_run["rloader"], target))
    else:
        for lib, rs in runs.items():
            epochs, firsts = later(rs, "epoch_s"), later(rs, "first_batch_s")
            rows.append(
                (
                    lib,
                    f"{statistics.median(epochs):.2f}",
                    f"{min(epochs):.2f}-{max(epochs):.2f}",
                    f"{statistics.median(firsts):.3f}",
                    f"{min(firsts):.3f}-{max(firsts):.3f}",
                    collections(rs, "parent"),
                    collections(rs, "worker"),
                    str(rs[0]["gc_count_before"][1]),
                )
            )
        headers = ("loader", "epoch s", "runs", "first batch s", "runs", *FULL_HEADERS)
        for what, field in (("epoch", "epoch_s"), ("time to first batch", "first_batch_s")):
            theirs, ours = later(runs["torch"], field), later(runs["rloader"], field)
            comparisons.append((f"{key}: {what}", theirs, ours, 1.0))
    print_table(headers, rows)
    print()
    met = total = 0
    table, figures = [], []
    for name, theirs, ours, target in comparisons:
        row = bench_results.comparison(name, theirs, ours, target=target, smoke=smoke)
        figures.append(row)
        if row["target"] is not None:
            total += 1
            met += row["met"]
        table.append(ratio_cells(name, row, smoke))
    print_table(RATIO_HEADERS, table)
    return met, total, {"runs": runs, "comparisons": figures}


def names(text: str, known, what: str, parser) -> list:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    if not chosen or set(chosen) - set(known):
        parser.error(f"{what}: choose from {','.join(known)}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="runs (scripts) per library")
    parser.add_argument("--epochs", type=int, help="epochs per run (default 3; --quick 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke test")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"from {','.join(SHAPES)}")
    parser.add_argument(
        "--collector", default=",".join(COLLECTORS), help=f"from {','.join(COLLECTORS)}"
    )
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    if args.child:
        # index-memory's 4 workers are more than 2 cores: both libraries warn so, each run.
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        print(json.dumps(child(json.loads(args.child))))
        return

    import bench_results
    import real_pipelines

    shapes = names(args.shapes, SHAPES, "--shapes", parser)
    collectors = names(args.collector, COLLECTORS, "--collector", parser)
    epochs = args.epochs or (2 if args.quick else 3)
    if args.repeats < 1 or epochs < 2:
        parser.error("--repeats must be at least 1 and --epochs at least 2")
    root = args.data_dir or real_pipelines.DEFAULT_DATA_DIR
    started, started_at = time.perf_counter(), bench_results.now()
    load_before = real_pipelines.load_average()
    data: dict = {}
    if "reference" in shapes:
        data["folder"] = str(real_pipelines.jpeg_folder(root, args.quick) / "train")
    if {"index", *MEMORY_SHAPES} & set(shapes):
        data["annotations"] = str(annotations(root, args.quick))
    if "due" in collectors and not DUE_STATE_HOLDS:
        collectors.remove("due")
        if not collectors:
            parser.error(f"--collector due: no full collection is held due on {sys.version}")
        print(
            f"note: Python {sys.version.split()[0]}: no full collection is held due here "
            "(hold_full_collection_due is CPython 3.9-3.12's); the 'due' rows are left out",
            flush=True,
        )
    variants = [(shape, collector) for shape in shapes for collector in collectors]
    runs: dict = {v: {lib: [] for lib in LIBS} for v in variants}
    for _ in range(args.repeats):
        for shape, collector in variants:
            for lib in LIBS:
                spec = {"shape": shape, "collector": collector, "lib": lib, "epochs": epochs}
                runs[shape, collector][lib].append(run_child({**spec, **data}))
    print(
        f"\nFresh workers under a script's heap: each run a script (child process) of its own, "
        f"{args.repeats} per library, alternating, {epochs} epochs each, the first not counted"
        f"{'; quick sizes' if args.quick else ''};\nload average {load_before} at the start, "
        f"{real_pipelines.load_average()} at the end. Times are medians over the later epochs "
        "of all runs; runs: fastest-slowest.\nparent's full, workers' full: the full "
        "(generation 2) collections in the later epochs, how many and their seconds in all;\n"
        "parent gc: gc.get_count() in the first run's parent before its second epoch. Ratios: "
        "torch's median over rloader's."
    )
    met = total = 0
    figures: dict = {"repeats": args.repeats, "epochs": epochs, "shapes": {}, "comparisons": []}
    for shape, collector in variants:
        for lib in LIBS:
            for r in runs[shape, collector][lib]:
                if len(set(r["samples"])) != 1:
                    raise AssertionError(f"{shape}, {lib}: epochs of {r['samples']} samples")
        samples = runs[shape, collector]["torch"][0]["samples"][0]
        m, t, fig = report(shape, collector, runs[shape, collector], samples, args.quick)
        met, total = met + m, total + t
        title = f"{TITLES[shape].format(samples=samples)}; {COLLECTORS[collector]}"
        figures["shapes"][f"{shape}, {collector}"] = {"title": title, **fig}
        figures["comparisons"] += fig["comparisons"]
    elapsed = f"{time.perf_counter() - started:.0f} s in all"
    real_pipelines.save_run(
        "fresh_workers", figures, (met, total, elapsed), args.quick, started_at, load_before
    )


if __name__ == "__main__":
    main()
