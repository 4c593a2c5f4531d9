"""Writes pillow_cases.bin: golden resize / crop / flip results from the real Pillow.

Run with the Pillow the project pins (the version is stored in the file, and the cargo test
prints it):  .venv/bin/python rust/rloader-vision/tests/data/make_pillow_cases.py
Deterministic: a fixed seed, and no time or path in the output.

Format, all integers little-endian:
  header    b"RLPC" | u32 version (1) | u8 n, then n bytes of Pillow's version (ASCII)
            | u32 image count | u32 case count
  image     u16 width | u16 height | u8 bands (1 = "L", 3 = "RGB") | width*height*bands bytes
  case      u8 op | u32 image index | op's parameters | expected image (as above)
    op 0 resize       u8 filter | u16 out_w | u16 out_h | 4 x f64 box   -> img.resize(size, filter, box)
    op 1 crop         4 x i32 (left, top, right, bottom)                -> img.crop(box)
    op 2 flip left-right                                                -> img.transpose(FLIP_LEFT_RIGHT)
    op 3 flip top-bottom                                                -> img.transpose(FLIP_TOP_BOTTOM)
    op 4 crop+resize  4 x i32 crop box | u8 filter | u16 out_w | u16 out_h
                      -> img.crop(box).resize(size, filter)  (torchvision's resized_crop)
  filter: Pillow's numbers: 0 NEAREST, 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, 5 HAMMING.
"""

import io
import struct
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

SEED = 20240607
FILTERS = [0, 1, 2, 3, 4, 5]
OUT = Path(__file__).with_name("pillow_cases.bin")

rng = np.random.default_rng(SEED)
images: list[Image.Image] = []
blob = io.BytesIO()
n_cases = 0


def make_image(w: int, h: int, mode: str, kind: str) -> int:
    bands = 3 if mode == "RGB" else 1
    shape = (h, w, bands)
    if kind == "noise":
        a = rng.integers(0, 256, size=shape, dtype=np.uint8)
    elif kind == "extreme":  # only 0 and 255: overshooting filters clip
        a = (rng.integers(0, 2, size=shape, dtype=np.uint8) * 255).astype(np.uint8)
    else:  # smooth gradient plus a little noise
        yy, xx = np.mgrid[0:h, 0:w]
        base = (xx * 255.0 / max(w - 1, 1) * 0.6 + yy * 255.0 / max(h - 1, 1) * 0.4)[..., None]
        a = np.clip(base + rng.normal(0, 6, size=shape), 0, 255).astype(np.uint8)
    if bands == 1:
        a = a[..., 0]
    images.append(Image.fromarray(a, mode))
    return len(images) - 1


def write_image(out: io.BytesIO, im: Image.Image) -> None:
    bands = len(im.getbands())
    assert im.mode in ("L", "RGB")
    out.write(struct.pack("<HHB", im.width, im.height, bands))
    out.write(im.tobytes())


def case(op: int, idx: int, params: bytes, expected: Image.Image) -> None:
    global n_cases
    blob.write(struct.pack("<BI", op, idx))
    blob.write(params)
    write_image(blob, expected)
    n_cases += 1


def resize(idx: int, size: tuple[int, int], flt: int, box=None) -> None:
    im = images[idx]
    if box is None:
        box = (0.0, 0.0, float(im.width), float(im.height))
    box = tuple(float(v) for v in box)
    out = im.resize(size, flt, box)
    case(0, idx, struct.pack("<BHH4d", flt, size[0], size[1], *box), out)


def crop(idx: int, box: tuple[int, int, int, int]) -> None:
    case(1, idx, struct.pack("<4i", *box), images[idx].crop(box))


def crop_resize(idx: int, box, size, flt: int) -> None:
    out = images[idx].crop(box).resize(size, flt)
    case(4, idx, struct.pack("<4iBHH", *box, flt, size[0], size[1]), out)


def rand_box(w: int, h: int) -> tuple[float, float, float, float]:
    """A box inside the image with fractional edges (sometimes whole, sometimes empty-ish)."""
    x0 = float(rng.uniform(0, w * 0.6))
    y0 = float(rng.uniform(0, h * 0.6))
    x1 = float(rng.uniform(x0, w))
    y1 = float(rng.uniform(y0, h))
    if rng.random() < 0.2:
        x0, y0 = float(int(x0)), float(int(y0))
    if rng.random() < 0.2:
        x1, y1 = float(w), float(h)
    return x0, y0, x1, y1


# Random images, every filter, random sizes up and down.
for i in range(48):
    w, h = int(rng.integers(1, 81)), int(rng.integers(1, 65))
    mode = "RGB" if i % 3 else "L"
    kind = ["noise", "smooth", "extreme"][i % 3 if i % 5 else 0]
    idx = make_image(w, h, mode, kind)
    for flt in FILTERS:
        ow, oh = int(rng.integers(1, 41)), int(rng.integers(1, 41))
        resize(idx, (ow, oh), flt)
    # odd factors: /3, /5, x3, x7 (capped)
    flt = FILTERS[i % 6]
    resize(idx, (max(1, w // 3), max(1, h // 5)), flt)
    resize(idx, (min(w * 3, 64), min(h * 7, 64)), FILTERS[(i + 1) % 6])
    # boxes with fractional edges
    for _ in range(2):
        flt = FILTERS[int(rng.integers(0, 6))]
        ow, oh = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        resize(idx, (ow, oh), flt, rand_box(w, h))
    # crops partly or wholly outside, then their resize
    x0, y0 = int(rng.integers(-10, w)), int(rng.integers(-10, h))
    x1, y1 = int(rng.integers(x0, w + 10)), int(rng.integers(y0, h + 10))
    crop(idx, (x0, y0, x1, y1))
    flt = FILTERS[int(rng.integers(0, 6))]
    if x1 > x0 and y1 > y0:
        crop_resize(idx, (x0, y0, x1, y1), (int(rng.integers(1, 50)), int(rng.integers(1, 50))), flt)
    # crops inside, then their resize (the fused path)
    if w > 1 and h > 1:
        x0, y0 = int(rng.integers(0, w - 1)), int(rng.integers(0, h - 1))
        x1, y1 = int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))
        for flt in (FILTERS[i % 6], FILTERS[(i + 3) % 6]):
            size = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
            crop_resize(idx, (x0, y0, x1, y1), size, flt)
    if i % 4 == 0:
        case(2, idx, b"", images[idx].transpose(Image.Transpose.FLIP_LEFT_RIGHT))
        case(3, idx, b"", images[idx].transpose(Image.Transpose.FLIP_TOP_BOTTOM))

# Extreme ratios and degenerate sizes.
wide = make_image(1000, 1, "RGB", "noise")
tall = make_image(1, 700, "L", "noise")
dot = make_image(1, 1, "RGB", "noise")
dot_l = make_image(1, 1, "L", "noise")
for flt in FILTERS:
    resize(wide, (3, 1), flt)
    resize(wide, (1, 1), flt)
    resize(wide, (7, 4), flt)
    resize(tall, (1, 5), flt)
    resize(tall, (9, 2), flt)
    resize(dot, (50, 50), flt)
    resize(dot_l, (13, 1), flt)
    resize(wide, (5, 1), flt, (123.25, 0.0, 640.75, 1.0))
    resize(wide, (4, 3), flt, (999.5, 0.0, 1000.0, 0.5))
    # an empty box (x1 == x0) is allowed by Pillow
    resize(wide, (3, 1), flt, (10.0, 0.0, 10.0, 1.0))

# The shortcuts: same size and full box (copy); whole box of the output size (crop).
sq = make_image(37, 29, "RGB", "noise")
for flt in FILTERS:
    resize(sq, (37, 29), flt)
    resize(sq, (10, 8), flt, (5.0, 6.0, 15.0, 14.0))
    resize(sq, (37, 29), flt, (0.0, 0.0, 37.0, 28.999))  # same size, box not full
    resize(sq, (37, 20), flt)  # vertical pass only
    resize(sq, (20, 29), flt)  # horizontal pass only
    resize(sq, (37, 29), flt, (0.5, 0.0, 37.0, 29.0))
    # box edges that f32 rounds (Pillow parses the box as C floats)
    resize(sq, (11, 7), flt, (1.0000000001, 2.9999999999, 30.1, 27.3))

# Pillow 13's pass order: vertical first iff out_h < in_h and in_h - out_h > 2 * (in_w - out_w).
# Boundary both ways (60x61 source: h shrinks by 21 vs 2 * 10 = 20, then by 20), width growing,
# and a box (the rule reads the image's size, not the box's).
order = make_image(60, 61, "RGB", "noise")
for flt in (1, 2, 3, 4, 5):
    resize(order, (50, 40), flt)  # 21 > 20: vertical first
    resize(order, (50, 41), flt)  # 20: horizontal first
    resize(order, (70, 60), flt)  # width grows, height shrinks by 1: vertical first
    resize(order, (50, 40), flt, (0.5, 1.25, 59.5, 50.0))

# A larger pair at the sizes the data loaders use (kept few: they weigh the most).
big = make_image(160, 120, "RGB", "smooth")
for flt in (2, 3, 1):
    resize(big, (56, 56), flt)
    crop_resize(big, (17, 9, 150, 111), (64, 64), flt)
resize(big, (85, 64), 2)  # Resize(64): short side to 64

header = io.BytesIO()
version = PIL.__version__.encode()
header.write(b"RLPC" + struct.pack("<IB", 1, len(version)) + version)
header.write(struct.pack("<II", len(images), n_cases))
for im in images:
    write_image(header, im)
OUT.write_bytes(header.getvalue() + blob.getvalue())
print(f"{OUT.name}: {len(images)} images, {n_cases} cases, {OUT.stat().st_size} bytes, Pillow {PIL.__version__}")
