"""rloader.vision's ``draft=True`` against exact decoding: how far its pixels are, how much
faster one sample is.

``ImageFolder(..., draft=True)`` decodes a JPEG at 1/2, 1/4 or 1/8 in the DCT where the
transform reduces it at least that much anyway (Pillow's ``draft`` rule; rloader-vision's
NOTE [Draft]). This prints, for the ImageNet training (``RandomResizedCrop(224)``, flip) and
evaluation (``Resize(256)``, ``CenterCrop(224)``) transforms, over two corpora of photo-like
JPEGs (benches/real_pipelines.py's generator, cached in ``.bench-data/``):

- PSNR (dB) of draft's uint8 output against exact (``PILToTensor``), per sample: the mean over
  the samples draft changed, the lowest, and the share it changed (the rest decode at 1/1 and
  are exact);
- one sample's time on one core (``torch.set_num_threads(1)``, the full transform with
  ``ToTensor`` and ``Normalize``, a loop over the dataset), exact and draft, the median of
  ``--repeats`` passes, interleaved.

    python benches/vision_draft.py                 # 200 images of 300-600 px, 60 of 1200-2400
    python benches/vision_draft.py --large 0 --repeats 5
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torchvision import transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_pipelines as rp  # noqa: E402 - the benches' own data generators

import rloader.vision as RV  # noqa: E402

NORM = (rp.IMAGENET_MEAN, rp.IMAGENET_STD)
GEOMETRY = {
    "train": lambda: [T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
    "eval": lambda: [T.Resize(256), T.CenterCrop(224)],
}


def large_folder(root: Path, images: int) -> Path:
    """Photo-like JPEGs of 1200-2400 px, as cameras' photos are: where draft does the most."""
    p = {"images": images, "classes": 1, "min_side": 1200, "max_side": 2400, "quality": 90}

    def make(folder: Path) -> None:
        (folder / "train" / "class_00").mkdir(parents=True)
        for i in range(images):
            data = rp.photo_like_jpeg(i, p["quality"], p["min_side"], p["max_side"])
            rp.image_path(folder, i, 1).write_bytes(data)

    return rp.cached(root, f"jpegs-large-{images}", p, make)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def distances(root: Path, name: str) -> tuple[float, float, float]:
    """Mean and lowest PSNR over the samples draft changed, and their share."""
    t = T.Compose(GEOMETRY[name]() + [T.PILToTensor()])
    exact, draft = RV.ImageFolder(root, t), RV.ImageFolder(root, t, draft=True)
    values = []
    for i in range(len(exact)):
        torch.manual_seed(i)
        want = exact[i][0]
        torch.manual_seed(i)
        got = draft[i][0]
        assert got.shape == want.shape and got.dtype == want.dtype
        values.append(psnr(got, want))
    changed = [v for v in values if v != math.inf]
    if not changed:
        return math.inf, math.inf, 0.0
    return statistics.mean(changed), min(changed), len(changed) / len(values)


def per_sample_ms(root: Path, name: str, repeats: int) -> tuple[float, float]:
    """One sample's median time, exact and draft, on one core."""
    t = T.Compose(GEOMETRY[name]() + [T.ToTensor(), T.Normalize(*NORM)])
    sets = {False: RV.ImageFolder(root, t), True: RV.ImageFolder(root, t, draft=True)}
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats + 1):  # the first pass warms the page cache and is not counted
        for draft, ds in sets.items():
            torch.manual_seed(0)
            start = time.perf_counter()
            for i in range(len(ds)):
                ds[i]
            runs[draft].append((time.perf_counter() - start) / len(ds) * 1e3)
    return statistics.median(runs[False][1:]), statistics.median(runs[True][1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=rp.DEFAULT_DATA_DIR)
    parser.add_argument("--images", type=int, default=200, help="300-600 px JPEGs")
    parser.add_argument("--large", type=int, default=60, help="1200-2400 px JPEGs (0: none)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpora = [(f"{args.images} x 300-600 px", rp.jpeg_folder(args.data_dir, False, args.images))]
    if args.large:
        corpora.append((f"{args.large} x 1200-2400 px", large_folder(args.data_dir, args.large)))

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    header = (
        f"{'corpus':<22} {'transform':<9} {'drafted':>8} {'PSNR mean':>10} {'PSNR min':>9}"
        f" {'exact ms':>9} {'draft ms':>9} {'speed-up':>9}"
    )
    print(header)
    print("-" * len(header))
    for label, root in corpora:
        root = root / "train"
        for name in GEOMETRY:
            mean, low, share = distances(root, name)
            exact_ms, draft_ms = per_sample_ms(root, name, args.repeats)
            print(
                f"{label:<22} {name:<9} {share:>8.0%} {mean:>10.1f} {low:>9.1f}"
                f" {exact_ms:>9.2f} {draft_ms:>9.2f} {exact_ms / draft_ms:>8.2f}x",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
