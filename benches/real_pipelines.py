"""rloader vs torch.utils.data on pipelines built from library code (issue #24).

Six pipelines as users write them, over data generated at the first run (no downloads) and
cached in a git-ignored folder (``.bench-data/`` at the repository's root; ``--data-dir``):

  imagefolder  torchvision ``ImageFolder`` over 1,500 photo-like JPEGs (300-600 px, quality 90,
               10 class folders) with the ImageNet training transforms (``RandomResizedCrop(224)``,
               ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``), batch 64.
  vision-train the same folder and transforms through ``rloader.vision.ImageFolder`` on
               rloader's side (decoding and transforms in Rust, torchvision's pixels exactly).
  vision-eval  the same with the ImageNet evaluation transforms (``Resize(256)``,
               ``CenterCrop(224)``, ``ToTensor``, ``Normalize``).
  webdataset   the same JPEGs in WebDataset tar shards (an ``IterableDataset`` split between
               workers by ``wds.split_by_worker``), decoded to PIL, the same transforms, batch 64.
               Every epoch checks that each sample came exactly once.
  tokens       nanoGPT-style token windows: an ``np.memmap`` of 100M uint16 tokens (200 MB), a
               map-style dataset whose item ``i`` is the 1,025-token window at a random offset
               drawn once per ``i`` (both libraries do the same work), as ``(x, y)`` int64
               tensors of 1,024, batch 32.
  arrow        a Hugging Face ``datasets.Dataset`` of 50,000 rows of token ids (64-512 long),
               saved with ``save_to_disk``, read with ``load_from_disk(...).with_format("torch")``
               through ``__getitems__`` (one ``ds[indices]`` per batch), padded to the batch's
               longest row with an attention mask, batch 32.

Each pipeline's loaders (torch.utils.data, rloader worker processes, rloader worker threads
with ``worker_type="thread"``, per ``num_workers``) are built once and iterated once per run,
as a training loop iterates its loader every epoch, after one untimed warm-up epoch each. The
runs are interleaved (torch, rloader, rloader threads, torch, ...) so all see the same machine
state; each figure is the median of ``--repeats`` runs. A ratio is rloader's throughput over
torch's with the same ``num_workers``; thread workers are compared with torch's processes.

Under each table: where rloader's median run spent its time (``loader.stats()``; workers'
stages are summed over the workers), and the machine's limit where one applies: one core's
rate for the per-sample work measured in this process (``torch.set_num_threads(1)``, as in a
worker) times the number of workers, and for the memmap the page-cache read bandwidth.

    python benches/real_pipelines.py                      # every pipeline, 3 repeats
    python benches/real_pipelines.py --quick              # small sizes, a smoke test (not scored)
    python benches/real_pipelines.py --pipelines tokens,arrow --repeats 5

On a machine other programs keep busy, set ``OMP_WAIT_POLICY=PASSIVE``: the num_workers=0 rows
run torch's transforms and collation on its intra-op threads (as many as the cores), whose
OpenMP barriers spin by default; with another process on a core they wait for a thread that is
not running, and an ImageFolder epoch on 2 busy cores took 10-15x longer (20-30 images/s
against 300). Worker processes run torch on one thread and are not affected.

Each run is written to benches/results/ as a dated JSON file (bench_results.py; a --quick
run's to benches/results/smoke/).

The tokens pipeline needs only numpy; the others import torchvision, pillow, webdataset and
datasets (``make bench-real`` installs them into the venv).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import ctypes
import gc
import io
import itertools
import json
import os
import shutil
import statistics
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import bench_results
import numpy as np
import torch
import torch.utils.data as tud

import rloader

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / ".bench-data"
# Bumped when a generator's code changes what it writes: cached data made before is made again.
GENERATOR_VERSION = 1
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Generated data, cached


def cached(root: Path, name: str, params: dict, make: Callable[[Path], None]) -> Path:
    """``root/name``, made by ``make(folder)`` unless its manifest records these ``params``.

    The data is written to ``name.partial`` and renamed when complete, so an interrupted run
    leaves nothing that a later one would take for finished."""
    params = json.loads(json.dumps({"generator_version": GENERATOR_VERSION, **params}))
    folder = root / name
    try:
        if json.loads((folder / "manifest.json").read_text()) == params:
            return folder
    except (OSError, ValueError):
        pass
    partial = root / f"{name}.partial"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    progress(f"generating {name} in {root} (once; cached for later runs) ...")
    start = time.perf_counter()
    make(partial)
    (partial / "manifest.json").write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")
    partial.rename(folder)
    progress(f"generated {name} in {time.perf_counter() - start:.1f} s")
    return folder


def _noise_field(rng, w: int, h: int, step: int, sigma: float) -> np.ndarray:
    """Gaussian noise on a grid ``step`` pixels apart, smoothly upsampled: texture at one scale."""
    from PIL import Image

    small = rng.normal(128, sigma, (h // step + 2, w // step + 2)).clip(0, 255).astype(np.uint8)
    big = Image.fromarray(small).resize((w + step, h + step), Image.BICUBIC)
    return np.asarray(big, np.float32)[:h, :w] - 128


def photo_like_jpeg(seed: int, quality: int, min_side: int, max_side: int) -> bytes:
    """A JPEG that compresses like a photo: smooth colour gradients, texture at three scales,
    flat shapes with soft edges, sensor noise. Deterministic from ``seed``; ~75 kB on average
    at 300-600 px and quality 90 (~0.35 bytes per pixel)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    w, h = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32) / max(w, h)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):  # a few low-frequency waves per channel: light and colour gradients
        plane = np.full((h, w), rng.uniform(60, 190), np.float32)
        for _ in range(3):
            fx, fy = rng.uniform(-3, 3, 2)
            phase = rng.uniform(0, 2 * np.pi)
            plane += rng.uniform(10, 45) * np.cos(2 * np.pi * (fx * x + fy * y) + phase)
        img[..., c] = plane
    texture = _noise_field(rng, w, h, 24, 40) + _noise_field(rng, w, h, 5, 30) * rng.uniform(
        0.3, 0.8
    )
    img += texture[..., None] * rng.uniform(0.5, 1.0, 3).astype(np.float32)
    pil = Image.fromarray(img.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(4, 12))):  # objects
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = int(rng.integers(3))
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            corners = rng.integers(0, [w, h], (int(rng.integers(3, 7)), 2))
            draw.polygon([(int(a), int(b)) for a, b in corners], fill=colour)
    pil = pil.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.6, 1.4))))  # optics
    fine = _noise_field(rng, w, h, 2, 30) * rng.uniform(0.3, 0.6)
    grain = rng.normal(0, rng.uniform(2, 4), (h, w)).astype(np.float32)
    colour_noise = rng.normal(0, 1.5, (h, w, 3)).astype(np.float32)
    arr = np.asarray(pil, np.float32) + (fine + grain)[..., None] + colour_noise
    out = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def image_params(quick: bool) -> dict:
    return {
        "images": 200 if quick else 1500,
        "classes": 10,
        "min_side": 300,
        "max_side": 600,
        "quality": 90,
        "seed": 0,
    }


def _write_jpeg(job) -> int:
    path, seed, p = job
    data = photo_like_jpeg(seed, p["quality"], p["min_side"], p["max_side"])
    Path(path).write_bytes(data)
    return len(data)


def jpeg_folder(root: Path, quick: bool, images: Optional[int] = None) -> Path:
    """``train/class_NN/img_NNNNNN.jpg``: image i is in class i mod classes (``images`` of
    them, or the size's default)."""
    p = image_params(quick)
    if images is not None:
        p["images"] = images

    def make(folder: Path) -> None:
        for c in range(p["classes"]):
            (folder / "train" / f"class_{c:02d}").mkdir(parents=True)
        jobs = [
            (str(image_path(folder, i, p["classes"])), p["seed"] * 1_000_003 + i, p)
            for i in range(p["images"])
        ]
        with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            sizes = list(pool.map(_write_jpeg, jobs, chunksize=16))
        progress(f"  {len(sizes):,} JPEGs, {sum(sizes) / 1e6:.1f} MB")

    return cached(root, f"jpegs-{p['images']}", p, make)


def image_path(folder: Path, i: int, classes: int) -> Path:
    return folder / "train" / f"class_{i % classes:02d}" / f"img_{i:06d}.jpg"


def shard_params(quick: bool) -> dict:
    return {"images": image_params(quick), "shards": 4 if quick else 8}


def tar_shards(root: Path, quick: bool) -> tuple[list[str], int]:
    """The JPEG folder's images as WebDataset shards (``key.jpg``, ``key.cls``), in image order,
    split evenly between the shards. Returns the shards' paths and the number of samples."""
    p = shard_params(quick)
    images = jpeg_folder(root, quick)
    n, classes = p["images"]["images"], p["images"]["classes"]

    def make(folder: Path) -> None:
        per_shard = -(-n // p["shards"])
        for s in range(p["shards"]):
            with tarfile.open(folder / f"shard-{s:04d}.tar", "w") as tar:
                for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                    for ext, data in (
                        ("jpg", image_path(images, i, classes).read_bytes()),
                        ("cls", str(i % classes).encode()),
                    ):
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size, info.mtime = len(data), 0
                        tar.addfile(info, io.BytesIO(data))

    folder = cached(root, f"shards-{n}", p, make)
    return [str(folder / f"shard-{s:04d}.tar") for s in range(p["shards"])], n


def token_params(quick: bool) -> dict:
    return {"tokens": 5_000_000 if quick else 100_000_000, "vocab": 50257, "seed": 0}


def token_file(root: Path, quick: bool) -> Path:
    p = token_params(quick)

    def make(folder: Path) -> None:
        rng = np.random.default_rng(p["seed"])
        out = np.memmap(folder / "train.bin", dtype=np.uint16, mode="w+", shape=(p["tokens"],))
        chunk = 10_000_000
        for at in range(0, p["tokens"], chunk):
            stop = min(p["tokens"], at + chunk)
            out[at:stop] = rng.integers(0, p["vocab"], stop - at, dtype=np.uint16)
        out.flush()
        del out

    return cached(root, f"tokens-{p['tokens']}", p, make) / "train.bin"


def arrow_params(quick: bool) -> dict:
    return {"rows": 5_000 if quick else 50_000, "min_len": 64, "max_len": 512, "seed": 0}


def arrow_folder(root: Path, quick: bool) -> Path:
    p = arrow_params(quick)

    def make(folder: Path) -> None:
        import datasets
        import pyarrow as pa

        rng = np.random.default_rng(p["seed"])
        lengths = rng.integers(p["min_len"], p["max_len"] + 1, p["rows"])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = rng.integers(0, 50257, int(offsets[-1]), dtype=np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
        table = datasets.table.InMemoryTable(pa.table({"input_ids": column}))
        datasets.Dataset(table).save_to_disk(str(folder / "dataset"))

    return cached(root, f"arrow-{p['rows']}", p, make) / "dataset"


# ---------------------------------------------------------------------------------------------
# The pipelines' datasets, as users write them


def imagenet_train_transform():
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def webdataset_pipeline(urls: list[str]):
    import webdataset as wds

    return (
        wds.WebDataset(
            urls,
            shardshuffle=False,
            nodesplitter=wds.single_node_only,
            workersplitter=wds.split_by_worker,
        )
        .decode("pil")
        .to_tuple("jpg", "cls", "__key__")
        .map_tuple(imagenet_train_transform(), int, str)
    )


class TokenWindows(tud.Dataset):
    """nanoGPT's ``get_batch`` as a map-style dataset: item ``i`` is the ``block + 1`` tokens
    at an offset drawn once for ``i`` (seeded), as ``(x, y)`` int64 tensors of ``block``."""

    def __init__(self, path: Path, windows: int, block: int = 1024, seed: int = 0) -> None:
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.block = block
        rng = np.random.default_rng(seed)
        self.offsets = rng.integers(0, len(self.tokens) - block - 1, windows)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int):
        o = int(self.offsets[i])
        x = torch.from_numpy(self.tokens[o : o + self.block].astype(np.int64))
        y = torch.from_numpy(self.tokens[o + 1 : o + 1 + self.block].astype(np.int64))
        return x, y


class TokenizedText(tud.Dataset):
    """A ``datasets.Dataset`` of token ids read a batch at a time: ``__getitems__`` makes one
    ``ds[indices]`` call, which returns the batch's rows as int64 tensors."""

    def __init__(self, path: Path) -> None:
        import datasets

        self.rows = datasets.load_from_disk(str(path)).with_format("torch")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]["input_ids"]

    def __getitems__(self, indices: list) -> list:
        # A list of tensors (a batch whose rows are all as long is one stacked tensor: unbound).
        return list(self.rows[indices]["input_ids"])


def pad_collate(rows: list) -> dict:
    """Pads a batch of token-id tensors to its longest, with an attention mask."""
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask}


# ---------------------------------------------------------------------------------------------
# Loaders, settings, comparisons


@dataclass(frozen=True)
class Setting:
    lib: str  # "torch" or "rloader"
    num_workers: int
    threads: bool = False
    persistent: bool = False

    @property
    def name(self) -> str:
        if self.num_workers == 0:
            return f"{self.lib} num_workers=0"
        kind = "threads" if self.threads else "processes"
        persistent = " persistent" if self.persistent else ""
        return f"{self.lib} {self.num_workers}{persistent} {kind}"


@dataclass(frozen=True)
class Comparison:
    label: str
    ours: Setting
    theirs: Setting
    target: Optional[float]  # None: for information


@dataclass
class Pipeline:
    key: str
    title: str
    unit: str  # what one sample is (images, windows, rows)
    samples: int  # per epoch
    dataset: object
    loader_args: dict
    settings: list
    comparisons: list
    # One epoch of a loader: returns how many samples it yielded (and checks them).
    epoch: Callable[[object], int]
    # Lines saying the machine's limit for this pipeline, measured in this process.
    limits: Callable[[], list] = lambda: []
    notes: list = field(default_factory=list)
    # What rloader's loaders read, where it is not `dataset` (rloader.vision's ImageFolder).
    rloader_dataset: object = None


TORCH0, OURS0 = Setting("torch", 0), Setting("rloader", 0)
TORCH2, OURS2, THREADS2 = Setting("torch", 2), Setting("rloader", 2), Setting("rloader", 2, True)
TORCH2P, OURS2P = Setting("torch", 2, persistent=True), Setting("rloader", 2, persistent=True)


def build_loader(p: Pipeline, s: Setting):
    if s.lib == "torch":
        return tud.DataLoader(
            p.dataset, num_workers=s.num_workers, persistent_workers=s.persistent, **p.loader_args
        )
    extra = {"worker_type": "thread"} if s.threads else {}
    return rloader.DataLoader(
        p.dataset if p.rloader_dataset is None else p.rloader_dataset,
        num_workers=s.num_workers,
        persistent_workers=s.persistent,
        **p.loader_args,
        **extra,
    )


def count_epoch(loader) -> int:
    """Samples in one epoch: the length of each batch's first tensor."""
    n = 0
    for batch in loader:
        first = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        n += len(first)
    return n


def one_core(fn: Callable[[], int]) -> float:
    """Samples per second of ``fn()`` (which returns how many it made) on one thread, as in a
    worker process: torch's intra-op threads set to 1 while it runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fn()  # warm: imports, page cache, first-touch
        start = time.perf_counter()
        n = fn()
        return n / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)


def workers_limit(unit: str, what: str, rate: float, workers: int = 2) -> list:
    cores = os.cpu_count() or 1
    return [
        f"one core {what}: {rate:,.0f} {unit}/s in this process; x {workers} workers: "
        f"{rate * workers:,.0f} {unit}/s ({cores} cores here, shared with the main process)"
    ]


def imagefolder(root: Path, quick: bool) -> Pipeline:
    from torchvision import datasets as tv_datasets

    folder = jpeg_folder(root, quick)
    dataset = tv_datasets.ImageFolder(str(folder / "train"), transform=imagenet_train_transform())
    n = len(dataset)
    k = min(n, 300)
    nbytes = sum(os.path.getsize(path) for path, _ in dataset.samples)

    def limits() -> list:
        rate = one_core(lambda: sum(1 for i in range(k) if dataset[i] is not None))
        return workers_limit("images", "opens, decodes and transforms", rate)

    return Pipeline(
        key="imagefolder",
        title=(
            f"torchvision ImageFolder, {n:,} JPEGs of 300-600 px (quality 90, "
            f"{nbytes / n / 1e3:.0f} kB on average, {len(dataset.classes)} classes), "
            "RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize, batch 64, shuffled"
        ),
        unit="images",
        samples=n,
        dataset=dataset,
        loader_args=dict(batch_size=64, shuffle=True),
        settings=[TORCH0, OURS0, TORCH2, OURS2, THREADS2],
        comparisons=[
            Comparison("num_workers=0", OURS0, TORCH0, 1.0),
            Comparison("2 processes", OURS2, TORCH2, 1.3),
            Comparison("2 threads vs torch's 2 processes", THREADS2, TORCH2, 1.2),
        ],
        epoch=count_epoch,
        limits=limits,
    )


def imagenet_eval_transform():
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def vision(root: Path, quick: bool, train: bool) -> Pipeline:
    """The same folder and transforms through torchvision's ImageFolder (torch's loaders) and
    rloader.vision's (rloader's), whose samples are torchvision's bit for bit."""
    from torchvision import datasets as tv_datasets

    import rloader.vision

    folder = str(jpeg_folder(root, quick) / "train")
    transform = imagenet_train_transform() if train else imagenet_eval_transform()
    theirs = tv_datasets.ImageFolder(folder, transform=transform)
    ours = rloader.vision.ImageFolder(folder, transform=transform)
    n = len(theirs)
    k = min(n, 300)
    torch.manual_seed(0)
    for i in range(0, n, max(1, n // 20)):  # a check, not a test: tests/test_vision.py is
        state = torch.get_rng_state()
        want = theirs[i][0]
        torch.set_rng_state(state)
        if not torch.equal(ours[i][0], want):
            raise AssertionError(f"rloader.vision's sample {i} is not torchvision's")

    def limits() -> list:
        lines = []
        for name, ds in (("torchvision", theirs), ("rloader.vision", ours)):
            rate = one_core(lambda ds=ds: sum(1 for i in range(k) if ds[i] is not None))
            lines += workers_limit("images", f"{name} opens, decodes and transforms", rate)
        return lines

    which = "training" if train else "evaluation"
    steps = (
        "RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize"
        if train
        else "Resize(256), CenterCrop(224), ToTensor, Normalize"
    )
    return Pipeline(
        key=f"vision-{'train' if train else 'eval'}",
        title=(
            f"rloader.vision.ImageFolder vs torchvision's, {n:,} JPEGs of 300-600 px, "
            f"ImageNet {which} transforms ({steps}), batch 64, shuffled"
        ),
        unit="images",
        samples=n,
        dataset=theirs,
        rloader_dataset=ours,
        loader_args=dict(batch_size=64, shuffle=True),
        settings=[TORCH0, OURS0, TORCH2, OURS2, THREADS2],
        comparisons=[
            Comparison("num_workers=0", OURS0, TORCH0, 2.5),
            *(
                [
                    Comparison("2 processes", OURS2, TORCH2, 2.5),
                    Comparison("2 threads vs torch's 2 processes", THREADS2, TORCH2, 2.5),
                    Comparison("2 threads vs rloader.vision's num_workers=0", THREADS2, OURS0, 1.8),
                ]
                if train
                else [
                    Comparison("2 processes", OURS2, TORCH2, None),
                    Comparison("2 threads vs torch's 2 processes", THREADS2, TORCH2, None),
                ]
            ),
        ],
        epoch=count_epoch,
        limits=limits,
    )


def webdataset(root: Path, quick: bool) -> Pipeline:
    urls, n = tar_shards(root, quick)
    dataset = webdataset_pipeline(urls)
    expected = {f"{i:06d}" for i in range(n)}

    def epoch(loader) -> int:
        seen: collections.Counter = collections.Counter()
        for _images, _labels, keys in loader:
            seen.update(keys)
        if set(seen) != expected or any(c != 1 for c in seen.values()):
            twice = sorted(k for k, c in seen.items() if c > 1)
            missing = sorted(expected - set(seen))
            raise AssertionError(
                f"{type(loader).__module__}: an epoch should yield each of the {n} samples once; "
                f"{len(missing)} missing (first {missing[:3]}), {len(twice)} more than once "
                f"(first {twice[:3]})"
            )
        return sum(seen.values())

    def limits() -> list:
        k = min(n, 300)
        rate = one_core(lambda: sum(1 for _ in itertools.islice(iter(dataset), k)))
        return workers_limit("images", "reads, decodes and transforms", rate)

    return Pipeline(
        key="webdataset",
        title=(
            f"WebDataset, the same {n:,} JPEGs in {len(urls)} tar shards, split by worker, "
            '.decode("pil"), the same transforms, batch 64'
        ),
        unit="images",
        samples=n,
        dataset=dataset,
        loader_args=dict(batch_size=64),
        settings=[TORCH2, OURS2, THREADS2],
        comparisons=[
            Comparison("2 processes", OURS2, TORCH2, 1.2),
            Comparison("2 threads vs torch's 2 processes", THREADS2, TORCH2, 1.1),
        ],
        epoch=epoch,
        limits=limits,
        notes=["every epoch of every loader checked: each sample exactly once"],
    )


def tokens(root: Path, quick: bool) -> Pipeline:
    path = token_file(root, quick)
    windows = 4_096 if quick else 32_768
    dataset = TokenWindows(path, windows)

    def limits() -> list:
        buf = bytearray(16 << 20)
        view = memoryview(buf)

        def read_file() -> int:
            total = 0
            with open(path, "rb", buffering=0) as f:
                while (got := f.readinto(view)) > 0:
                    total += got
            return total

        read_file()  # into the page cache
        start = time.perf_counter()
        nbytes = read_file()
        gbps = nbytes / (time.perf_counter() - start) / 1e9
        sample_bytes = 2 * (dataset.block + 1)
        batches = [list(range(i, min(windows, i + 32))) for i in range(0, min(windows, 2048), 32)]
        collate = tud.default_collate
        rate = one_core(lambda: sum(len(collate([dataset[i] for i in b])[0]) for b in batches))
        return [
            f"page cache: {path.name} ({nbytes / 1e6:.0f} MB) read at {gbps:.1f} GB/s, "
            f"{gbps * 1e9 / sample_bytes:,.0f} windows/s of {sample_bytes:,} bytes",
            *workers_limit("windows", "slices, converts and collates", rate),
        ]

    return Pipeline(
        key="tokens",
        title=(
            f"token windows: np.memmap of {len(dataset.tokens) / 1e6:.0f}M uint16 tokens "
            f"({len(dataset.tokens) * 2 / 1e6:.0f} MB), {windows:,} random 1,025-token windows "
            "-> (x, y) int64 [1024], batch 32, shuffled"
        ),
        unit="windows",
        samples=windows,
        dataset=dataset,
        loader_args=dict(batch_size=32, shuffle=True),
        # (With workers started anew each epoch, two forks of this process and the workers' exit
        # take a sixth of a 0.2 s epoch; persistent workers show what the workers add once
        # started: docs/benchmarks.md, "Why some targets are missed".)
        settings=[TORCH0, OURS0, TORCH2, OURS2, TORCH2P, OURS2P],
        comparisons=[
            Comparison("num_workers=0", OURS0, TORCH0, 1.2),
            Comparison("2 processes", OURS2, TORCH2, 5.0),
            Comparison("rloader 2 processes vs rloader num_workers=0", OURS2, OURS0, 1.5),
            Comparison("2 persistent processes", OURS2P, TORCH2P, None),
            Comparison(
                "rloader 2 persistent processes vs rloader num_workers=0", OURS2P, OURS0, 1.5
            ),
            Comparison("torch 2 processes vs torch num_workers=0", TORCH2, TORCH0, None),
        ],
        epoch=count_epoch,
        limits=limits,
    )


def arrow(root: Path, quick: bool) -> Pipeline:
    import datasets

    datasets.disable_progress_bars()
    path = arrow_folder(root, quick)
    dataset = TokenizedText(path)
    n = len(dataset)

    def limits() -> list:
        order = np.random.default_rng(1).permutation(n)[: min(n, 8192)].tolist()
        batches = [order[i : i + 32] for i in range(0, len(order), 32)]
        rate = one_core(
            lambda: sum(len(pad_collate(dataset.__getitems__(b))["input_ids"]) for b in batches)
        )
        return workers_limit("rows", "reads (ds[indices]) and pads", rate)

    return Pipeline(
        key="arrow",
        title=(
            f"Hugging Face datasets: {n:,} rows of 64-512 token ids, load_from_disk, "
            'with_format("torch"), __getitems__, padded collate with attention mask, '
            "batch 32, shuffled"
        ),
        unit="rows",
        samples=n,
        dataset=dataset,
        loader_args=dict(batch_size=32, shuffle=True, collate_fn=pad_collate),
        settings=[TORCH0, OURS0, TORCH2, OURS2, THREADS2],
        comparisons=[
            Comparison("2 processes", OURS2, TORCH2, 1.5),
            Comparison("num_workers=0", OURS0, TORCH0, None),
            Comparison("2 threads vs torch's 2 processes", THREADS2, TORCH2, None),
        ],
        epoch=count_epoch,
        limits=limits,
    )


PIPELINES = {
    "imagefolder": imagefolder,
    "vision-train": lambda root, quick: vision(root, quick, train=True),
    "vision-eval": lambda root, quick: vision(root, quick, train=False),
    "webdataset": webdataset,
    "tokens": tokens,
    "arrow": arrow,
}


# ---------------------------------------------------------------------------------------------
# Running and reporting


@dataclass
class Result:
    pipeline: Pipeline
    times: dict  # Setting -> [seconds per run]
    stats: dict  # Setting -> [rloader's stats() per run]
    limits: list


def release_freed_memory() -> None:
    """Hands freed heap memory back to the OS, so that later forks copy fewer page tables."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def run(p: Pipeline, repeats: int) -> Result:
    loaders = {s: build_loader(p, s) for s in p.settings}

    def one_epoch(s: Setting) -> float:
        gc.collect()
        start = time.perf_counter()
        got = p.epoch(loaders[s])
        elapsed = time.perf_counter() - start
        if got != p.samples:
            raise AssertionError(f"{s.name}: an epoch yielded {got} {p.unit}, not {p.samples}")
        return elapsed

    for s in p.settings:
        elapsed = one_epoch(s)
        progress(f"[{p.key}] warm-up   {s.name:<24} {elapsed:6.2f} s")
    times: dict = {s: [] for s in p.settings}
    stats: dict = {s: [] for s in p.settings}
    for r in range(repeats):
        for s in p.settings:
            elapsed = one_epoch(s)
            times[s].append(elapsed)
            if s.lib == "rloader":
                stats[s].append(loaders[s].stats())
            progress(
                f"[{p.key}] run {r + 1}/{repeats} {s.name:<24} {elapsed:6.2f} s  "
                f"{p.samples / elapsed:8,.0f} {p.unit}/s"
            )
    limits = p.limits()
    loaders.clear()  # their workers and buffers go before the next pipeline's
    p.dataset = p.rloader_dataset = p.epoch = p.limits = None  # only what the report prints is kept
    release_freed_memory()
    return Result(p, times, stats, limits)


def print_table(headers: tuple, rows: list) -> None:
    """Left-aligned columns as wide as their widest cell, with a rule under the headers."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


# loader.stats()'s fields, and their column headers.
STAGES = {
    "fetch": "fetch",
    "collate": "collate",
    "transport": "transport",
    "pin": "pin",
    "waiting_for_data": "wait data",
    "waiting_for_user": "wait user",
}


RATIO_HEADERS = ("rloader vs torch", "ratio", "runs", "target", "")


def ratio_cells(label: str, row: dict, smoke: bool) -> tuple:
    """A comparison's row of the ratios table (``RATIO_HEADERS``): the ratio, the spread of
    the runs' ratios, the target and whether it was met; a smoke run's rows are not scored."""
    if smoke:
        target, verdict = "-", "(smoke)"
    elif row["target"] is None:
        target, verdict = "-", "(information)"
    else:
        target, verdict = f">= {row['target']:g}x", "met" if row["met"] else "MISSED"
    lo, hi = row["spread"]
    return (label, f"{row['ratio']:.2f}x", f"{lo:.2f}-{hi:.2f}x", target, verdict)


def save_run(bench: str, figures: dict, scored: tuple, quick: bool, started, load_before: str):
    """Prints how many targets were met (``scored``: met, total, how long it all took), then
    writes the run's file (``bench_results.save``) and says where."""
    met, total, elapsed = scored
    if quick:
        print(f"\nA smoke run (--quick, {elapsed}): its rows are too short to score.")
    else:
        print(f"\n{met} of {total} targets met; {elapsed}")
    path = bench_results.save(
        bench,
        figures,
        smoke=quick,
        started=started,
        environment={"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        load_average_at_start=load_before,
    )
    print(f"This run's figures: {path}")


def report(res: Result, smoke: bool) -> tuple[int, int, dict]:
    """Prints a pipeline's tables; returns (targets met, targets) and its figures. A smoke
    run's rows (``--quick``) are not scored."""
    p = res.pipeline
    median = {s: statistics.median(t) for s, t in res.times.items()}
    print(f"\n== {p.key}: {p.title}\n")
    rows = []
    for s in p.settings:
        t = res.times[s]
        cells = [s.name, f"{p.samples / median[s]:,.0f}", f"{median[s]:.2f}"]
        cells.append(f"{p.samples / max(t):,.0f}-{p.samples / min(t):,.0f}")
        if res.stats[s]:
            # The stats of the run whose time is the median (the upper one for an even count).
            ranked = sorted(range(len(t)), key=t.__getitem__)
            st = res.stats[s][ranked[len(t) // 2]]
            cells.append(str(st["batches"]))
            cells += [f"{st[f'{stage}_s']:.2f}" for stage in STAGES]
        else:
            cells += ["-"] * (1 + len(STAGES))
        rows.append(tuple(cells))
    print_table(
        (
            "loader",
            f"{p.unit}/s",
            "epoch s",
            "runs",
            "batches",
            *STAGES.values(),
        ),
        rows,
    )
    print()
    met = total = 0
    comparisons, figures = [], []
    for c in p.comparisons:
        row = bench_results.comparison(
            f"{p.key}: {c.label}",
            res.times[c.theirs],
            res.times[c.ours],
            target=c.target,
            smoke=smoke,
            ours=c.ours.name,
            theirs=c.theirs.name,
        )
        figures.append(row)
        if row["target"] is not None:
            total += 1
            met += row["met"]
        comparisons.append(ratio_cells(c.label, row, smoke))
    print_table(RATIO_HEADERS, comparisons)
    for line in [*res.limits, *p.notes]:
        print(f"- {line}")
    pipeline = {
        "title": p.title,
        "unit": p.unit,
        "samples": p.samples,
        "seconds": {s.name: res.times[s] for s in p.settings},
        "rloader_stats": {s.name: res.stats[s] for s in p.settings if res.stats[s]},
        "limits": res.limits,
    }
    return met, total, {"pipeline": pipeline, "comparisons": figures}


def load_average() -> str:
    """The 1-minute load average. At the start it is other programs' alone: above ~0.5 on 2
    cores, they take time from the workers, and figures are noisier."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per loader")
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke test")
    parser.add_argument(
        "--pipelines",
        default=",".join(PIPELINES),
        help=f"comma-separated, from {','.join(PIPELINES)} (default: all)",
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    chosen = [name.strip() for name in args.pipelines.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PIPELINES]
    if unknown or args.repeats < 1:
        parser.error(
            f"unknown pipeline(s) {unknown}; choose from {list(PIPELINES)}"
            if unknown
            else "--repeats must be at least 1"
        )
    started, load_before = time.perf_counter(), load_average()
    started_at = bench_results.now()
    results = []
    for name in chosen:
        pipeline = PIPELINES[name](args.data_dir, args.quick)
        results.append(run(pipeline, args.repeats))
        pipeline = None
        release_freed_memory()
    print(
        f"\nrloader {rloader.__version__} vs torch {torch.__version__}, {os.cpu_count()} cores, "
        f"{'quick sizes, ' if args.quick else ''}median of {args.repeats} interleaved runs "
        "after a warm-up epoch per loader;\n"
        f"torch's intra-op threads in this process: {torch.get_num_threads()} "
        f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; see --help); "
        f"load average {load_before} at the start, {load_average()} at the end.\n"
        "First table, runs: the slowest and fastest run; batches to wait user: loader.stats() of "
        "rloader's median run,\nin seconds, workers' stages summed over the workers (fetch: the "
        "dataset; wait data: the loop inside next(),\nwaiting for a batch; wait user: the loop's "
        "own time between batches). Second table, ratio: rloader's throughput\nover torch's "
        "(medians); runs: the lowest and highest ratio of one run to the run beside it."
    )
    met = total = 0
    figures: dict = {"repeats": args.repeats, "pipelines": {}, "comparisons": []}
    for res in results:
        m, t, fig = report(res, args.quick)
        met, total = met + m, total + t
        figures["pipelines"][res.pipeline.key] = fig["pipeline"]
        figures["comparisons"] += fig["comparisons"]
    elapsed = f"{time.perf_counter() - started:.0f} s in all"
    save_run("real_pipelines", figures, (met, total, elapsed), args.quick, started_at, load_before)


if __name__ == "__main__":
    main()
