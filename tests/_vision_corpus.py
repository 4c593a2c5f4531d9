"""A generated corpus of image files for rloader.vision's tests: every kind the Rust path
decodes (JPEG subsamplings, progressive, qualities, grayscale, sizes from 1x1 up, CMYK and
YCCK; PNG modes, 1 to 16 bits, tRNS) and the kinds left to Pillow (BMP, GIF, WebP)."""

from __future__ import annotations

import io
import os
import struct
import zlib

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


def _cmyk_jpeg(img, path, adobe_transform=0, **kw):
    """A four-component JPEG: Pillow's CMYK (an Adobe marker of transform 0, the bytes
    inverted), with the marker's transform set to `adobe_transform` (2: libjpeg reads the
    components as YCCK) or, for None, without the marker (libjpeg reads them as CMYK)."""
    buf = io.BytesIO()
    img.convert("CMYK").save(buf, "JPEG", **kw)
    data = buf.getvalue()
    at = data.index(b"\xff\xee\x00\x0eAdobe")  # APP14, 14 bytes after its marker
    if adobe_transform is None:
        data = data[:at] + data[at + 16 :]
    else:
        data = data[: at + 15] + bytes([adobe_transform]) + data[at + 16 :]
    with open(path, "wb") as f:
        f.write(data)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(path, values, depth, color_type, palette=None, trns=None):
    """Writes `values` (rows x columns x samples, ints below 2**depth) as a PNG chunk by chunk:
    the depths Pillow does not save (16-bit RGB, RGBA, LA; 2 and 4-bit gray), and tRNS."""
    values = np.asarray(values)
    height, width = values.shape[:2]
    flat = values.reshape(height, -1).astype(np.uint32)
    if depth == 16:
        rows = flat.astype(">u2").view(np.uint8).reshape(height, -1)
    elif depth == 8:
        rows = flat.astype(np.uint8)
    else:  # pack 8 // depth values a byte, the first in the high bits
        per = 8 // depth
        padded = np.zeros((height, -(-flat.shape[1] // per) * per), np.uint32)
        padded[:, : flat.shape[1]] = flat
        shifts = depth * np.arange(per - 1, -1, -1, dtype=np.uint32)
        rows = (padded.reshape(height, -1, per) << shifts).sum(axis=2).astype(np.uint8)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
    if palette is not None:
        out += _png_chunk(b"PLTE", bytes(palette))
    if trns is not None:
        out += _png_chunk(b"tRNS", bytes(trns))
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    out += _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(out)


def _depth_pngs(rng: np.random.Generator, add) -> None:
    """PNGs of 16 bits and of fewer than 8, and with tRNS, in Pillow's every mode for them
    (class "png_depths")."""
    w, h = 53, 37
    wide = rng.integers(0, 65536, (h, w, 4))
    wide[: h // 2, :, 0] %= 256  # 16-bit gray under 256 too: "I;16" clips at 255
    wide[0, :8, :] = np.array([0, 1, 255, 256, 257, 65280, 65534, 65535])[:, None]
    gray16 = wide[..., :1]
    add("png_depths", "L16.png", lambda p: _png(p, gray16, 16, 0))
    add("png_depths", "L16_trns.png", lambda p: _png(p, gray16, 16, 0, trns=b"\x01\x00"))
    add("png_depths", "LA16.png", lambda p: _png(p, wide[..., :2], 16, 4))
    add("png_depths", "RGB16.png", lambda p: _png(p, wide[..., :3], 16, 2))
    rgb_trns = struct.pack(">HHH", *wide[3, 3, :3])
    add("png_depths", "RGB16_trns.png", lambda p: _png(p, wide[..., :3], 16, 2, trns=rgb_trns))
    add("png_depths", "RGBA16.png", lambda p: _png(p, wide, 16, 6))
    add("png_depths", "s5x3_RGB16.png", lambda p: _png(p, wide[:3, :5, :3], 16, 2))
    for depth in (1, 2, 4):
        n = 1 << depth
        gray = rng.integers(0, n, (h, w, 1))
        add("png_depths", f"L{depth}.png", lambda p, g=gray, d=depth: _png(p, g, d, 0))
        trns = struct.pack(">H", n - 1)
        add(
            "png_depths",
            f"L{depth}_trns.png",
            lambda p, g=gray, d=depth, t=trns: _png(p, g, d, 0, trns=t),
        )
        index = rng.integers(0, n, (h, w, 1))
        palette = rng.integers(0, 256, 3 * n).tolist()
        add(
            "png_depths",
            f"P{depth}.png",
            lambda p, i=index, d=depth, c=palette: _png(p, i, d, 3, c),
        )
        # Entries past a short palette's end are black; one transparent index.
        short, trns = palette[: 3 * max(1, n // 2)], b"\xff" * (n // 2 - 1) + b"\x00"
        add(
            "png_depths",
            f"P{depth}_short_trns.png",
            lambda p, i=index, d=depth, c=short, t=trns: _png(p, i, d, 3, c, t),
        )
    rgb8 = rng.integers(0, 256, (h, w, 3))
    add("png_depths", "RGB8_trns.png", lambda p: _png(p, rgb8, 8, 2, trns=b"\x00\x07" * 3))
    add("png_depths", "L8_trns.png", lambda p: _png(p, rgb8[..., :1], 8, 0, trns=b"\x00\x07"))


def _cmyk_jpegs(rng: np.random.Generator, add) -> None:
    """Four-component JPEGs: Adobe CMYK, CMYK without the marker, YCCK (class "jpeg_cmyk")."""
    for (w, h), sub in (((1, 1), 0), ((17, 9), 2), ((333, 251), 2), ((96, 64), 0)):
        img = _picture(rng, w, h)
        for how, transform in (("adobe", 0), ("plain", None), ("ycck", 2)):
            add(
                "jpeg_cmyk",
                f"s{w}x{h}_{how}_sub{sub}.jpg",
                lambda p, img=img, t=transform, s=sub: _cmyk_jpeg(
                    img, p, t, quality=90, subsampling=s
                ),
            )
    img = _picture(rng, 75, 50)
    add(
        "jpeg_cmyk",
        "s75x50_ycck_progressive.jpg",
        lambda p: _cmyk_jpeg(img, p, 2, quality=80, progressive=True),
    )


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
    out += other_modes(seed)
    # Left to Pillow: BMP, GIF, WebP.
    add("other", "img.bmp", lambda p: img.save(p))
    add("other", "img.gif", lambda p: img.save(p))
    add("other", "img.webp", lambda p: img.save(p, lossless=True))
    # libjpeg warns of an unknown Adobe transform: Pillow decodes it.
    add("other", "adobe_transform1.jpg", lambda p: _cmyk_jpeg(img, p, 1, quality=90))
    return out


def other_modes(seed: int = 0):
    """`files` of the classes "jpeg_cmyk" and "png_depths" only: files Pillow opens in modes
    other than RGB and L (CMYK, "1", "I;16", 16-bit RGB, transparency), from their own draws."""
    rng = np.random.default_rng([seed, 1])
    out = []

    def add(folder, name, write):
        out.append((folder, name, write))

    img = _picture(rng, 97, 61)
    # Pillow's own writing of some of the kinds made by hand below.
    add(
        "png_depths",
        "i16.png",
        lambda p: Image.fromarray((np.asarray(img.convert("L")).astype(np.uint16) * 257)).save(p),
    )
    add("png_depths", "bits1.png", lambda p: img.convert("1").save(p))
    add("png_depths", "trns.png", lambda p: img.convert("P").save(p, transparency=0))
    add("jpeg_cmyk", "cmyk.jpg", lambda p: _jpeg(img.convert("CMYK"), p, quality=90))
    _depth_pngs(rng, add)
    _cmyk_jpegs(rng, add)
    return out


def write(root: str, seed: int = 0, *, which=files) -> str:
    """Writes the corpus (or `which`'s part of it) under `root`: a folder per kind,
    ImageFolder's classes."""
    for folder, name, writer in which(seed):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        writer(os.path.join(root, folder, name))
    return root
