"""A generated corpus of image files for rloader.vision's tests: every kind the Rust path
decodes (JPEG subsamplings, progressive, qualities, grayscale, sizes from 1x1 up; PNG modes)
and the kinds left to Pillow (CMYK JPEG, 16-bit and transparent PNG, BMP, GIF, WebP)."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image


def _picture(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    # Smooth shapes plus noise: resampling and chroma upsampling both have work to do.
    base = rng.integers(0, 256, (height // 16 + 2, width // 16 + 2, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(base).resize((width, height), Image.Resampling.BICUBIC))
    noise = rng.integers(-24, 25, img.shape)
    return Image.fromarray((img.astype(np.int16) + noise).clip(0, 255).astype(np.uint8))


def _jpeg(img, path, **kw):
    img.save(path, "JPEG", **kw)


def files(seed: int = 0):
    """(class folder, file name, writer) for every file of the corpus, `writer(path)` making it."""
    rng = np.random.default_rng(seed)
    out = []

    def add(folder, name, write):
        out.append((folder, name, write))

    sizes = [(1, 1), (2, 3), (7, 5), (17, 9), (64, 48), (333, 251), (500, 375), (375, 500)]
    for w, h in sizes:
        for sub in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
            q = int(rng.integers(50, 101))
            img = _picture(rng, w, h)
            add(
                "jpeg",
                f"s{w}x{h}_sub{sub}_q{q}.jpg",
                lambda p, img=img, sub=sub, q=q: _jpeg(img, p, quality=q, subsampling=sub),
            )
        img = _picture(rng, w, h)
        add(
            "jpeg",
            f"s{w}x{h}_progressive.jpg",
            lambda p, img=img: _jpeg(img, p, quality=85, progressive=True),
        )
        add("gray", f"s{w}x{h}_L.jpg", lambda p, img=img: _jpeg(img.convert("L"), p, quality=90))
    big = _picture(rng, 3840, 2160)
    add("jpeg", "s3840x2160.jpg", lambda p: _jpeg(big, p, quality=92))
    add("jpeg", "s1001x7_odd.jpg", lambda p: _jpeg(_picture(rng, 1001, 7), p, quality=75))

    img = _picture(rng, 97, 61)
    rgba = img.copy()
    rgba.putalpha(Image.fromarray(rng.integers(0, 256, (61, 97), dtype=np.uint8)))
    add("png", "rgb.png", lambda p: img.save(p))
    add("png", "rgba.png", lambda p: rgba.save(p))
    add("png", "L.png", lambda p: img.convert("L").save(p))
    add("png", "LA.png", lambda p: rgba.convert("LA").save(p))
    add("png", "palette.png", lambda p: img.convert("P", palette=Image.Palette.ADAPTIVE).save(p))
    add("png", "s1x1.png", lambda p: img.resize((1, 1)).save(p))
    # Left to Pillow: CMYK JPEG, 16-bit, 1-bit and transparent PNGs, BMP, GIF, WebP.
    add("other", "cmyk.jpg", lambda p: _jpeg(img.convert("CMYK"), p, quality=90))
    add(
        "other",
        "i16.png",
        lambda p: Image.fromarray((np.asarray(img.convert("L")).astype(np.uint16) * 257)).save(p),
    )
    add("other", "bits1.png", lambda p: img.convert("1").save(p))
    add("other", "trns.png", lambda p: img.convert("P").save(p, transparency=0))
    add("other", "img.bmp", lambda p: img.save(p))
    add("other", "img.gif", lambda p: img.save(p))
    add("other", "img.webp", lambda p: img.save(p, lossless=True))
    return out


def write(root: str, seed: int = 0) -> str:
    """Writes the corpus under `root` (a folder per kind, ImageFolder's classes)."""
    for folder, name, writer in files(seed):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        writer(os.path.join(root, folder, name))
    return root
