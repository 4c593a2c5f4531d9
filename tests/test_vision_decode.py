"""rloader.vision's decoding of the files Pillow opens in modes other than RGB and L: CMYK and
YCCK JPEGs, PNGs of 16 bits and of fewer than 8, and with a tRNS chunk. Each is made in Rust
(Pillow never opens it) and equals `Image.open(f).convert("RGB")` and torchvision's samples
bit for bit, on every Pillow the project supports; what Pillow warns about stays Pillow's."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision import datasets
from torchvision import transforms as T

import rloader.vision as RV
from rloader import _rloader

import _vision_corpus

KINDS = ("jpeg_cmyk", "png_depths")


@pytest.fixture(scope="module")
def kinds_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("kinds")
    return _vision_corpus.write(str(root), which=_vision_corpus.other_modes)


def _pillows_rgb(path: str) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow warns over none of these
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))


def test_cmyk_jpegs_and_png_depths_decode_in_rust_to_pillows_rgb(kinds_root):
    paths = [p for p, _ in datasets.ImageFolder(kinds_root).samples]
    assert {os.path.basename(os.path.dirname(p)) for p in paths} == set(KINDS)
    for path in paths:
        want = _pillows_rgb(path)
        encoded, why = _rloader.vision_open(path)
        assert encoded is not None, f"{path}: {why}"
        got = torch.empty(want.shape, dtype=torch.uint8)
        assert encoded.run(encoded.steps(1, []), got.data_ptr(), got.nbytes), path
        assert np.array_equal(got.numpy(), want), path


@pytest.fixture
def pillow_opens(monkeypatch) -> list:
    """The paths `PIL.Image.open` is given (torchvision's loader opens each file with it)."""
    opened = []
    real = Image.open

    def spy(fp, *args, **kwargs):
        opened.append(fp)
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", spy)
    return opened


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()]),
        T.Compose(
            [T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize([0.5] * 3, [0.2] * 3)]
        ),
    ],
    ids=["uint8", "float32"],
)
def test_cmyk_jpegs_and_png_depths_are_made_in_rust_by_image_folder(
    kinds_root, pillow_opens, transform
):
    theirs = datasets.ImageFolder(kinds_root, transform)
    ours = RV.ImageFolder(kinds_root, transform)
    indices = list(range(len(theirs)))
    torch.manual_seed(0)
    want = [theirs[i] for i in indices]
    want_rng = torch.get_rng_state()
    pillow_opens.clear()
    torch.manual_seed(0)
    one_by_one = [ours[i] for i in indices]
    assert torch.equal(torch.get_rng_state(), want_rng)
    torch.manual_seed(0)
    batch = ours.__getitems__(indices)
    assert torch.equal(torch.get_rng_state(), want_rng)
    assert pillow_opens == []  # every sample was decoded by Rust, none by the fallback
    for i, (wx, wy), (ox, oy), (bx, by) in zip(indices, want, one_by_one, batch):
        for got in (ox, bx):
            assert got.dtype == wx.dtype and torch.equal(got, wx), theirs.samples[i][0]
        assert oy == by == wy


def test_a_palette_png_whose_trns_pillow_warns_about_is_left_to_pillow(tmp_path):
    # Partial alphas: Pillow keeps the tRNS as bytes, and convert("RGB") warns.
    os.makedirs(tmp_path / "c")
    path = str(tmp_path / "c" / "alphas.png")
    index = np.random.default_rng(0).integers(0, 4, (9, 11, 1))
    _vision_corpus._png(path, index, 2, 3, palette=range(12), trns=b"\x00\x80\xff")
    encoded, why = _rloader.vision_open(path)
    assert encoded is None and "tRNS" in why
    samples = []
    for folder in (datasets.ImageFolder, RV.ImageFolder):
        with pytest.warns(UserWarning, match="Transparency expressed in bytes") as record:
            samples.append(folder(str(tmp_path), T.PILToTensor())[0][0])
        assert len(record) == 1, folder
    assert torch.equal(*samples)


def test_steps_parsed_for_another_image_size_are_refused(kinds_root):
    small, large = (
        _rloader.vision_open(os.path.join(kinds_root, "jpeg_cmyk", name))[0]
        for name in ("s17x9_adobe_sub2.jpg", "s96x64_adobe_sub0.jpg")
    )
    steps = small.steps(1, [("flip_lr",)])
    assert steps.size == (17, 9)
    out = torch.empty((9, 17, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="another size"):
        large.run(steps, out.data_ptr(), out.nbytes)
    with pytest.raises(ValueError, match="another size"):
        _rloader.vision_run_many([large], [steps], [(out.data_ptr(), out.nbytes)])
    assert small.run(steps, out.data_ptr(), out.nbytes)


def _exif_jpeg(path: str, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    pixels = np.random.default_rng(0).integers(0, 256, (80, 120, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, exif=exif.tobytes(), dpi=(300, 300))


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose([T.Resize(40), T.Lambda(ImageOps.exif_transpose), T.PILToTensor()]),
        T.Compose([T.Lambda(ImageOps.exif_transpose), T.Resize(40), T.PILToTensor()]),
        T.Resize(9),
        T.RandomResizedCrop(16),
    ],
    ids=["resize-exif-transpose", "exif-transpose-first", "resize-alone", "crop-alone"],
)
def test_a_pil_image_handed_on_carries_pillows_info(tmp_path, transform):
    # A transform after the Rust steps (or the caller, where they end on a PIL image) sees the
    # image torchvision's loader gives: EXIF, DPI and all; a PNG's go through Pillow.
    os.makedirs(tmp_path / "a")
    _exif_jpeg(str(tmp_path / "a" / "rotated.jpg"), orientation=6)
    palette = Image.new("P", (30, 20))
    palette.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    palette.save(tmp_path / "a" / "trns.png", transparency=0)
    theirs = datasets.ImageFolder(str(tmp_path), transform)
    ours = RV.ImageFolder(str(tmp_path), transform)
    for i in range(len(theirs)):
        torch.manual_seed(i)
        want, _ = theirs[i]
        torch.manual_seed(i)
        got, _ = ours[i]
        if isinstance(want, Image.Image):
            assert got.info == want.info and np.array_equal(np.asarray(got), np.asarray(want))
        else:
            assert got.shape == want.shape and torch.equal(got, want)
