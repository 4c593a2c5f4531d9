"""rloader.vision against torchvision + Pillow: the same files, transforms and seeds give the
same samples bit for bit (values, dtype, tensor type), the same errors, and leave torch's
generator in the same state."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from _datasets import CachedBatch, LoaderInGetitems, ReversedBatch
from _vision_datasets import OwnGetitem
from PIL import Image
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

import rloader
import rloader.vision as RV
from rloader import _rloader

import _vision_corpus

NORM = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
M = T.InterpolationMode
INTERPOLATIONS = [M.NEAREST, M.BILINEAR, M.BICUBIC, M.BOX, M.HAMMING, M.LANCZOS]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return _vision_corpus.write(str(tmp_path_factory.mktemp("corpus")))


def _as_tensor(x):
    return torch.from_numpy(np.array(x)) if isinstance(x, Image.Image) else x


def assert_same_samples(transform, root, *, seeds=range(2), indices=None, **kw):
    """Every sample of rloader.vision's ImageFolder equals torchvision's for each seed: value,
    dtype, type (PIL image, tensor, tv_tensors.Image), target; and torch's generator ends in
    the same state."""
    ours, theirs = (
        RV.ImageFolder(root, transform, **kw),
        datasets.ImageFolder(root, transform, **kw),
    )
    for i in indices if indices is not None else range(len(theirs)):
        for seed in seeds:
            torch.manual_seed(seed * 1000 + i)
            want, want_target = theirs[i]
            want_rng = torch.get_rng_state()
            torch.manual_seed(seed * 1000 + i)
            got, got_target = ours[i]
            where = f"{theirs.samples[i][0]} seed {seed}"
            assert type(got) is type(want), where
            assert got_target == want_target, where
            if isinstance(want, Image.Image):
                assert (got.mode, got.size) == (want.mode, want.size), where
            got, want = _as_tensor(got), _as_tensor(want)
            assert got.dtype == want.dtype and got.shape == want.shape, where
            assert torch.equal(got, want), (
                f"{where}: max diff {(got.double() - want.double()).abs().max()}"
            )
            assert torch.equal(torch.get_rng_state(), want_rng), f"{where}: generator state"


def test_every_file_decodes_to_pillows_pixels(corpus):
    assert_same_samples(T.PILToTensor(), corpus, seeds=[0])


def test_the_rust_path_takes_jpegs_and_pngs_and_leaves_the_rest_to_pillow(corpus):
    kinds = {}
    for path, _ in datasets.ImageFolder(corpus).samples:
        encoded, why = _rloader.vision_open(path)
        kinds.setdefault(os.path.basename(os.path.dirname(path)), set()).add(encoded is not None)
    rust = {"jpeg", "gray", "png", "jpeg_cmyk", "png_depths"}
    assert kinds == {**{kind: {True} for kind in rust}, "other": {False}}


@pytest.mark.parametrize(
    "make",
    [
        lambda m: T.Resize(37, interpolation=m),
        lambda m: T.Resize((20, 300), interpolation=m),
        lambda m: T.Resize(50, interpolation=m, max_size=60),
        lambda m: T.RandomResizedCrop(41, interpolation=m),
        lambda m: T.RandomResizedCrop(
            (17, 90), scale=(0.01, 1.0), ratio=(0.2, 5.0), interpolation=m
        ),
        lambda m: v2.Resize(37, interpolation=m),
        lambda m: v2.RandomResizedCrop(41, interpolation=m),
    ],
    ids=["resize", "resize-hw", "resize-max", "rrc", "rrc-wild", "v2-resize", "v2-rrc"],
)
@pytest.mark.parametrize("mode", INTERPOLATIONS, ids=lambda m: m.value)
def test_resizing_transforms_alone_for_every_interpolation(corpus, make, mode):
    assert_same_samples(make(mode), corpus, indices=range(0, 40, 3))


@pytest.mark.parametrize(
    "transform",
    [
        T.CenterCrop(30),
        T.CenterCrop((400, 13)),
        T.CenterCrop(2000),
        T.RandomCrop(1),
        T.RandomCrop((5, 3)),
        T.RandomHorizontalFlip(),
        T.RandomVerticalFlip(p=0.7),
        v2.CenterCrop(30),
        v2.RandomCrop(5),
        v2.RandomHorizontalFlip(),
        v2.RandomVerticalFlip(),
    ],
    ids=repr,
)
def test_crops_and_flips_alone(corpus, transform):
    samples = datasets.ImageFolder(corpus).samples
    big_enough = [i for i, (p, _) in enumerate(samples) if min(Image.open(p).size) >= 5]
    assert_same_samples(transform, corpus, seeds=range(3), indices=big_enough)


def test_random_crop_larger_than_the_image_raises_torchvisions_error(corpus):
    ours, theirs = (
        RV.ImageFolder(corpus, T.RandomCrop(100)),
        datasets.ImageFolder(corpus, T.RandomCrop(100)),
    )
    small = next(i for i, (p, _) in enumerate(theirs.samples) if "s2x3" in p)
    with pytest.raises(ValueError) as want:
        theirs[small]
    with pytest.raises(ValueError) as got:
        ours[small]
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*NORM)]
        ),
        T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(*NORM)]),
        v2.Compose(
            [
                v2.RandomResizedCrop(224),
                v2.RandomHorizontalFlip(),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(*NORM),
            ]
        ),
        v2.Compose(
            [
                v2.Resize(256),
                v2.CenterCrop(224),
                v2.PILToTensor(),
                v2.ToDtype(torch.float16, scale=True),
            ]
        ),
        T.Compose(
            [T.Resize(64), T.PILToTensor(), T.ConvertImageDtype(torch.float64), T.Normalize(*NORM)]
        ),
        T.Compose([T.RandomCrop(1), T.ToTensor()]),
        T.ToTensor(),
        v2.ToImage(),
    ],
    ids=[
        "train",
        "eval",
        "v2-train",
        "v2-eval-half",
        "double",
        "one-pixel",
        "to-tensor",
        "to-image",
    ],
)
def test_composed_pipelines(corpus, transform):
    assert_same_samples(transform, corpus)


@pytest.mark.parametrize(
    "transform",
    [
        # An unsupported transform in the middle: torchvision goes on from the same PIL image.
        T.Compose(
            [
                T.RandomResizedCrop(64),
                T.ColorJitter(0.4, 0.4, 0.4),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(*NORM),
            ]
        ),
        T.Compose(
            [T.RandomResizedCrop(64), T.ToTensor(), T.RandomErasing(p=0.9), T.Normalize(*NORM)]
        ),
        v2.Compose(
            [
                v2.RandomResizedCrop(64),
                v2.RandomRotation(30),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
            ]
        ),
        # torchvision's classification reference's training preset with an auto-augment
        T.Compose(
            [
                T.RandomResizedCrop(64),
                T.RandomHorizontalFlip(),
                T.TrivialAugmentWide(),
                T.PILToTensor(),
                T.ConvertImageDtype(torch.float),
                T.Normalize(*NORM),
            ]
        ),
        v2.Compose(
            [
                v2.RandomResizedCrop(64),
                v2.ColorJitter(0.4, 0.4, 0.4),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(*NORM),
            ]
        ),
        T.Compose([T.Grayscale(), T.Resize(32), T.ToTensor()]),
        T.Compose([T.Resize(32), T.Lambda(lambda img: img.rotate(10)), T.ToTensor()]),
        T.Compose([T.RandomCrop(4, padding=2), T.ToTensor()]),
        T.Compose(
            [T.Resize(32), T.CenterCrop(48), T.ToTensor()]
        ),  # CenterCrop pads: in torchvision
    ],
    ids=[
        "jitter",
        "erasing",
        "v2-rotation",
        "trivial-augment",
        "v2-jitter",
        "grayscale-first",
        "lambda",
        "padded-crop",
        "center-pad",
    ],
)
def test_an_unsupported_transform_hands_its_image_on(corpus, transform):
    assert_same_samples(transform, corpus, indices=range(0, 45, 2))


def test_the_conversion_after_an_unsupported_transform_is_rusts(corpus):
    # (whose samples the test above compares with torchvision's)
    from rloader.vision._plan import Plan

    jitter = T.ColorJitter(0.4)
    plan = Plan(T.Compose([T.RandomResizedCrop(8), jitter, T.ToTensor(), T.Normalize(*NORM)]))
    assert plan.rest == [jitter] and plan.tail is not None
    assert [type(t) for t in plan.tail.transforms] == [T.ToTensor, T.Normalize]
    erasing = T.RandomErasing()  # a tensor transform between: nothing for Rust after it
    plan = Plan(T.Compose([T.RandomResizedCrop(8), T.ToTensor(), erasing, T.Normalize(*NORM)]))
    assert plan.rest[0] is erasing and plan.tail is None


def test_attributes_and_files_found_are_torchvisions(corpus):
    def valid(p):
        return not p.endswith(".gif")

    for kw in [{}, {"is_valid_file": valid}]:
        ours, theirs = RV.ImageFolder(corpus, **kw), datasets.ImageFolder(corpus, **kw)
        assert isinstance(ours, datasets.ImageFolder) and isinstance(ours, datasets.DatasetFolder)
        for name in ("classes", "class_to_idx", "samples", "targets", "imgs", "root"):
            assert getattr(ours, name) == getattr(theirs, name), name
        assert len(ours) == len(theirs)


def test_empty_class_folder_is_refused_as_torchvision_does(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(FileNotFoundError) as want:
        datasets.ImageFolder(str(tmp_path))
    with pytest.raises(FileNotFoundError) as got:
        RV.ImageFolder(str(tmp_path))
    assert str(got.value) == str(want.value)
    assert len(RV.ImageFolder(str(tmp_path), allow_empty=True)) == 0


def test_dataset_folder_and_a_custom_loader(corpus):
    def loader(path):
        return Image.open(path).convert("L")

    tf = T.Compose([T.Resize(20), T.PILToTensor()])
    ours = RV.DatasetFolder(corpus, loader, extensions=(".jpg", ".png"), transform=tf)
    theirs = datasets.DatasetFolder(corpus, loader, extensions=(".jpg", ".png"), transform=tf)
    assert ours.samples == theirs.samples
    for i in range(0, len(theirs), 5):
        assert torch.equal(ours[i][0], theirs[i][0])  # a custom loader: torchvision's path, L


def test_a_replaced_transform_is_read_again(corpus):
    ds = RV.ImageFolder(corpus, T.Compose([T.Resize(10), T.PILToTensor()]))
    assert ds[0][0].shape[-2:].numel() and min(ds[0][0].shape[-2:]) == 10
    ds.transform = T.Compose([T.Resize(12), T.PILToTensor()])
    assert min(ds[0][0].shape[-2:]) == 12
    ds.transform.transforms[0] = T.Resize(14)  # progressive resizing, in place
    assert min(ds[0][0].shape[-2:]) == 14


def test_a_file_rust_cannot_decode_leaves_the_generator_as_torchvision_does(tmp_path):
    root = _bad_files(str(tmp_path))
    transform = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    ours, theirs = RV.ImageFolder(root, transform), datasets.ImageFolder(root, transform)
    for i in range(len(theirs)):
        states = []
        for ds in (theirs, ours):
            torch.manual_seed(i)
            try:
                ds[i]
            except Exception:  # noqa: BLE001 - which error is the test above's
                pass
            states.append(torch.get_rng_state())
        assert torch.equal(*states), theirs.samples[i][0]


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose([T.CenterCrop((0, 10)), T.PILToTensor()]),
        T.CenterCrop((5, 0)),
    ],
    ids=["empty-tensor", "empty-image"],
)
def test_an_empty_output_is_torchvisions(corpus, transform):
    assert_same_samples(transform, corpus, indices=range(0, 40, 9), seeds=[0])


def _bad_files(root):
    good = os.path.join(root, "good.jpg")
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(good, quality=90)
    data = open(good, "rb").read()
    bad = {
        "empty.jpg": b"",
        "text.jpg": b"this is not an image\n" * 10,
        "truncated.jpg": data[: len(data) // 2],
        "header_only.jpg": data[:200],
        "corrupt.jpg": data[:300] + bytes(b ^ 0x5A for b in data[300:400]) + data[400:],
        "truncated.png": None,
    }
    png = os.path.join(root, "tmp.png")
    Image.fromarray(np.full((40, 50, 3), 7, np.uint8)).save(png)
    bad["truncated.png"] = open(png, "rb").read()[:60]
    os.remove(png)
    os.remove(good)
    os.makedirs(os.path.join(root, "c"))
    for name, blob in bad.items():
        with open(os.path.join(root, "c", name), "wb") as f:
            f.write(blob)
    return root


@pytest.mark.parametrize(
    "transform",
    [T.PILToTensor(), T.Compose([T.RandomResizedCrop(16), T.ToTensor()])],
    ids=["to-tensor", "rrc"],
)
def test_bad_files_raise_what_torchvision_raises(tmp_path, transform):
    root = _bad_files(str(tmp_path))
    ours, theirs = RV.ImageFolder(root, transform), datasets.ImageFolder(root, transform)
    for i, (path, _) in enumerate(theirs.samples):
        try:
            want = theirs[i][0]
        except Exception as e:  # noqa: BLE001 - whichever Pillow raises is the expectation
            with pytest.raises(type(e)) as got:
                ours[i]
            assert str(got.value) == str(e), path
        else:  # Pillow decodes some damaged files: so must we, to the same pixels
            torch.manual_seed(0)
            want = theirs[i][0]
            torch.manual_seed(0)
            assert torch.equal(ours[i][0], want), path


def test_the_decompression_bomb_limit_is_pillows(corpus, monkeypatch):
    big = next(p for p, _ in datasets.ImageFolder(corpus).samples if "3840x2160" in p)
    root = os.path.join(os.path.dirname(os.path.dirname(big)), "..", "bomb")
    os.makedirs(os.path.join(root, "c"), exist_ok=True)
    shutil.copy(big, os.path.join(root, "c", "big.jpg"))
    ours, theirs = (
        RV.ImageFolder(root, T.PILToTensor()),
        datasets.ImageFolder(root, T.PILToTensor()),
    )
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3840 * 2160 // 2 + 1)
    with pytest.warns(Image.DecompressionBombWarning):
        assert torch.equal(ours[0][0], theirs[0][0])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3840 * 2160 // 3)
    for ds in (theirs, ours):
        with pytest.raises(Image.DecompressionBombError):
            ds[0]


def test_a_dataset_pickles_without_its_plan(corpus):
    ds = RV.ImageFolder(corpus, T.Compose([T.Resize(16), T.PILToTensor()]))
    first = ds[0][0]
    again = pickle.loads(pickle.dumps(ds))
    assert "_rloader_plan" not in again.__dict__
    assert torch.equal(again[0][0], first)


TRAIN = T.Compose(
    [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*NORM)]
)
EVAL = T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor(), T.Normalize(*NORM)])


V2_TRAIN = v2.Compose(
    [v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.ToImage(),
     v2.ToDtype(torch.float32, scale=True), v2.Normalize(*NORM)]
)  # fmt: skip


@pytest.mark.parametrize("transform", [TRAIN, EVAL, V2_TRAIN], ids=["train", "eval", "v2-train"])
def test_loaders_give_torchs_batches(corpus, engine, transform):
    # Thread workers draw from their own generators: torch's process workers' batches.
    root = os.path.join(corpus, "..", "loader")
    if not os.path.exists(root):
        shutil.copytree(corpus, root, ignore=shutil.ignore_patterns("*3840x2160*", "other"))
    theirs, ours = datasets.ImageFolder(root, transform), RV.ImageFolder(root, transform)

    def order():  # torch's sampler in both: rloader's own random orders are not torch's
        return torch.utils.data.RandomSampler(theirs, generator=torch.Generator().manual_seed(3))

    torch.manual_seed(5)  # the workers' seeds and the main process's draws
    want = list(
        torch.utils.data.DataLoader(theirs, **engine.torch_kwargs(batch_size=5, sampler=order()))
    )
    torch.manual_seed(5)
    got = list(rloader.DataLoader(ours, **engine.kwargs(batch_size=5, sampler=order())))
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert type(gx) is type(wx) and torch.equal(gx, wx) and torch.equal(gy, wy)


def test_a_file_after_a_corrupt_one_decodes_as_pillow_does(tmp_path):
    # A TurboJPEG handle that had failed once misread the next file through it.
    root = _bad_files(str(tmp_path))
    good = os.path.join(root, "d")
    os.makedirs(good)
    for k in range(3):
        _vision_corpus._picture(np.random.default_rng(k), 61 + k, 47).save(
            f"{good}/{k}.jpg", quality=80
        )
    ours, theirs = (
        RV.ImageFolder(root, T.PILToTensor()),
        datasets.ImageFolder(root, T.PILToTensor()),
    )
    for i, (path, _) in enumerate(theirs.samples):
        try:
            want = theirs[i][0]
        except Exception:  # noqa: BLE001 - the bad ones: their errors are the test above's
            with pytest.raises(Exception):  # noqa: B017
                ours[i]
            continue
        assert torch.equal(ours[i][0], want), path


DRAFTED = {
    # RandomResizedCrop to a quarter of the picture's side or less: crops draft at 1/2 to 1/8.
    "train": lambda: T.Compose(
        [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()]
    ),
    "eval": lambda: T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]),
}


@pytest.mark.parametrize("name", list(DRAFTED))
def test_draft_is_close_to_exact_same_shapes_and_draws(corpus, name):
    transform = DRAFTED[name]()
    exact = RV.ImageFolder(corpus, transform)
    draft = RV.ImageFolder(corpus, transform, draft=True)
    assert exact.draft is False and draft.draft is True
    # The corpus's pictures are noisier than photos; the lowest here is ~25 dB (4:2:2 at q57,
    # decoded at 1/8), photos' in benches/vision_draft.py.
    values = []
    for i, (path, _) in enumerate(exact.samples):
        torch.manual_seed(i)
        want, want_target = exact[i]
        want_rng = torch.get_rng_state()
        torch.manual_seed(i)
        got, got_target = draft[i]
        assert torch.equal(torch.get_rng_state(), want_rng), path  # the same draws
        assert (got.shape, got.dtype, got_target) == (want.shape, want.dtype, want_target), path
        torch.manual_seed(i)
        assert torch.equal(draft[i][0], got), f"{path}: not deterministic"
        mse = (got.double() - want.double()).pow(2).mean().item()
        if mse:
            values.append(10 * np.log10(255**2 / mse))
            assert values[-1] > 22, f"{path}: {values[-1]:.1f} dB"
        if not path.endswith((".jpg", ".jpeg")):
            assert mse == 0, f"{path}: drafted, not a JPEG"
    assert len(values) > 5  # the large JPEGs were drafted
    assert np.mean(values) > 30, values


def test_draft_false_is_exact(corpus):
    transform = DRAFTED["train"]()
    ours, theirs = (
        RV.ImageFolder(corpus, transform, draft=False),
        datasets.ImageFolder(corpus, transform),
    )
    for i, (path, _) in enumerate(theirs.samples):
        torch.manual_seed(i)
        want = theirs[i][0]
        torch.manual_seed(i)
        assert torch.equal(ours[i][0], want), path


def test_stats_show_decoding_and_transforms_where_rust_made_the_samples(corpus, engine):
    ds = RV.ImageFolder(corpus, T.Compose([T.Resize((20, 30)), T.PILToTensor()]))
    jpegs = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(".jpg") and "other" not in p]
    loader = rloader.DataLoader(torch.utils.data.Subset(ds, jpegs[:8]), batch_size=2,
                                **engine.kwargs())  # fmt: skip
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats["decode_s"] > 0 and stats["transform_s"] > 0
    assert stats["decode_s"] + stats["transform_s"] <= stats["fetch_s"]
    plain = rloader.DataLoader(list(range(8)), batch_size=2, **engine.kwargs())
    for _ in plain:
        pass
    assert "decode_s" not in plain.stats()


def _drawing_target(target):  # a target_transform that draws from torch's generator
    return target * 100 + int(torch.randint(0, 100, ()))


GETITEMS = {
    "train": TRAIN,
    "eval": EVAL,
    "sizes-vary": T.Compose([T.Resize(16), T.ToTensor()]),
    "pil-out": T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip()]),
    "unsupported-after": T.Compose([T.RandomResizedCrop(16), T.ToTensor(), T.RandomErasing()]),
    "v2": v2.Compose([v2.RandomResizedCrop(16), v2.ToImage(), v2.ToDtype(torch.float32, True)]),
}


@pytest.mark.parametrize("name", list(GETITEMS))
def test_getitems_gives_torchvisions_samples_in_order(corpus, name):
    # Shuffled batches of every kind of file (those left to Pillow among them), with a
    # target_transform that draws too: the samples, and the generator after them, are those of
    # torchvision's ImageFolder sample by sample.
    transform = GETITEMS[name]
    ours = RV.ImageFolder(corpus, transform, target_transform=_drawing_target)
    theirs = datasets.ImageFolder(corpus, transform, target_transform=_drawing_target)
    order = torch.randperm(len(theirs), generator=torch.Generator().manual_seed(1)).tolist()
    for start in range(0, len(order), 6):
        batch = order[start : start + 6]
        torch.manual_seed(start)
        want = [theirs[i] for i in batch]
        want_rng = torch.get_rng_state()
        torch.manual_seed(start)
        got = ours.__getitems__(batch)
        assert torch.equal(torch.get_rng_state(), want_rng), batch
        assert len(got) == len(want)
        for (gx, gy), (wx, wy), i in zip(got, want, batch):
            assert type(gx) is type(wx) and gy == wy, theirs.samples[i][0]
            assert torch.equal(_as_tensor(gx), _as_tensor(wx)), theirs.samples[i][0]


def _bad_root_with_a_picture(tmp_path, width, height) -> str:
    """_bad_files' folder, with one good picture last (class "d")."""
    root = _bad_files(str(tmp_path))
    os.makedirs(os.path.join(root, "d"))
    _vision_corpus._picture(np.random.default_rng(0), width, height).save(f"{root}/d/0.jpg")
    return root


def _one_by_one_and_getitems(ours, theirs, batch, seed) -> list:
    """What ``[theirs[j] for j in batch]`` and ``ours.__getitems__(batch)`` give from one seed:
    the samples stacked, or the error's type and words; and the generator after them."""
    outcomes = []
    for getitems in (lambda b: [theirs[j] for j in b], ours.__getitems__):
        torch.manual_seed(seed)
        try:
            samples = getitems(batch)
        except Exception as e:  # noqa: BLE001 - whichever torchvision raises is the expectation
            outcomes.append(((type(e), str(e)), torch.get_rng_state()))
        else:  # Pillow decodes some damaged files: so must we, to the same pixels
            outcomes.append((torch.stack([x for x, _ in samples]), torch.get_rng_state()))
    return outcomes


@pytest.mark.parametrize("case", ["between good pictures", "before a picture its crop refuses"])
def test_getitems_raises_what_torchvision_raises_first_for_a_bad_file(tmp_path, case):
    # One by one, a bad file's error (or, where Pillow decodes it, the next sample's) comes
    # first; so it does from __getitems__, with the generator where torchvision leaves it.
    refused = case.endswith("refuses")
    root = _bad_root_with_a_picture(tmp_path, *((20, 20) if refused else (61, 47)))
    crop = T.RandomCrop(32) if refused else T.RandomResizedCrop(16)
    transform = T.Compose([crop, T.ToTensor()])
    ours, theirs = RV.ImageFolder(root, transform), datasets.ImageFolder(root, transform)
    last = len(theirs) - 1
    for i, (path, _) in enumerate(theirs.samples[:-1]):
        batch = [i, last] if refused else [last, i, last]
        (want, want_rng), (got, got_rng) = _one_by_one_and_getitems(ours, theirs, batch, i)
        assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want, path
        assert torch.equal(got_rng, want_rng), f"{path}: generator state"


def test_getitems_calls_target_transform_once_per_sample_past_a_file_rust_fails_on(tmp_path):
    # Pillow decodes some files libjpeg-turbo warns on: from __getitems__ those are made by
    # torchvision in their place, and the samples after them stay Rust's, each target
    # transformed once, as one by one.
    root = _bad_root_with_a_picture(tmp_path, 61, 47)
    data = open(f"{root}/d/0.jpg", "rb").read()
    scan = data.find(b"\xff\xda") + 40  # damaged entropy-coded data: a header Rust reads
    for at in range(scan, len(data) - 20, 60):
        with open(f"{root}/c/scan-{at}.jpg", "wb") as f:
            f.write(data[:at] + bytes(b ^ 0x33 for b in data[at : at + 8]) + data[at + 8 :])
    transform = T.Compose([T.RandomResizedCrop(16), T.ToTensor()])
    calls = {"ours": [], "theirs": []}

    def counting(name):
        return lambda target: calls[name].append(target) or _drawing_target(target)

    ours = RV.ImageFolder(root, transform, target_transform=counting("ours"))
    theirs = datasets.ImageFolder(root, transform, target_transform=counting("theirs"))
    last, decoded = len(theirs) - 1, 0
    for i, (path, _) in enumerate(theirs.samples[:-1]):
        calls["ours"].clear(), calls["theirs"].clear()
        batch = [last, i, last, last]
        (want, want_rng), (got, got_rng) = _one_by_one_and_getitems(ours, theirs, batch, i)
        if isinstance(want, torch.Tensor):
            decoded += 1
            assert torch.equal(got, want) and torch.equal(got_rng, want_rng), path
            assert calls["ours"] == calls["theirs"] == [theirs.targets[j] for j in batch], path
    assert decoded  # (the corpus has a damaged file Pillow decodes)


def test_getitems_uses_a_subclasss_own_getitem(corpus):
    ds = OwnGetitem(corpus, T.Compose([T.CenterCrop(8), T.PILToTensor()]))
    got = ds.__getitems__([0, 1])
    assert [sorted(x) for x in got] == [["image", "label"]] * 2
    assert torch.equal(got[1]["image"], ds[1]["image"])


@pytest.mark.parametrize("kind", ["none", "thread"])
def test_loaders_collate_the_samples_where_getitems_wrote_them(corpus, monkeypatch, kind):
    # With the default collate, rloader's loops lend __getitems__ the batch's memory: the batch
    # is the tensor the samples were written into (no copy); a custom collate_fn borrows none.
    blocks = []
    real = _rloader.batch_empty

    def recording(shape, dtype):
        block = real(shape, dtype)
        blocks.append(block)
        return block

    monkeypatch.setattr(_rloader, "batch_empty", recording)
    assert real([2, 3], torch.float32) is None  # nothing lent outside a loader's fetch
    # (batches of 4 samples of 1.2 MB: the default collate stacks them into recycled memory)
    ds = RV.ImageFolder(corpus, T.Compose([T.Resize((160, 160)), T.ToTensor()]))
    jpegs = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(".jpg") and "other" not in p]
    # (and in each batch a file Pillow decodes: made one by one, copied into its row)
    pillows = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(("img.bmp", "img.webp"))]
    assert len(pillows) == 2
    subset = torch.utils.data.Subset(ds, jpegs[:3] + pillows[:1] + jpegs[3:6] + pillows[1:2])
    workers = {"none": {}, "thread": {"num_workers": 2, "worker_type": "thread"}}[kind]
    want = list(torch.utils.data.DataLoader(subset, batch_size=4))
    assert blocks == [None, None]  # torch's loops lend nothing
    blocks.clear()
    got = list(rloader.DataLoader(subset, batch_size=4, **workers))
    assert len(blocks) == 2 and all(b is not None for b in blocks)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)
    assert {b.data_ptr() for b in blocks} == {x.data_ptr() for x, _ in got}
    blocks.clear()
    custom = list(rloader.DataLoader(subset, batch_size=4, collate_fn=list, **workers))
    assert blocks == [None, None] and all(type(b) is list for b in custom)


def test_getitems_of_an_index_out_of_range_raises_as_torchvision_does(corpus):
    transform = T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    ours, theirs = RV.ImageFolder(corpus, transform), datasets.ImageFolder(corpus, transform)
    errors = []
    for getitems in (lambda b: [theirs[j] for j in b], ours.__getitems__):
        torch.manual_seed(0)
        with pytest.raises(IndexError) as e:
            getitems([0, len(theirs)])
        errors.append((str(e.value), torch.get_rng_state()))
    assert errors[0][0] == errors[1][0] and torch.equal(errors[0][1], errors[1][1])


def test_auto_is_told_the_loading_runs_without_the_gil_where_rust_makes_whole_batches(corpus):
    from rloader._auto.kind import loads_without_gil

    whole = RV.ImageFolder(corpus, TRAIN)
    assert loads_without_gil(whole) and loads_without_gil(torch.utils.data.Subset(whole, [0]))
    tail = RV.ImageFolder(
        corpus, T.Compose([T.RandomResizedCrop(8), T.ToTensor(), T.RandomErasing()])
    )
    assert not loads_without_gil(tail)  # RandomErasing runs in Python, holding the GIL
    assert not loads_without_gil(datasets.ImageFolder(corpus, TRAIN))


BIG = T.Compose([T.Resize((160, 160)), T.ToTensor()])  # (batches the collate stacks into blocks)


def _jpegs(ds, n=8):
    return [i for i, (p, _) in enumerate(ds.samples) if p.endswith(".jpg") and "other" not in p][:n]


def test_a_batch_changed_or_kept_after_getitems_is_collated_as_torch_does(corpus):
    ds = torch.utils.data.Subset(RV.ImageFolder(corpus, BIG), _jpegs(RV.ImageFolder(corpus)))
    want = list(torch.utils.data.DataLoader(ReversedBatch(ds), batch_size=4))
    got = list(rloader.DataLoader(ReversedBatch(ds), batch_size=4))
    for (gx, gy), (wx, wy) in zip(got, want):  # images stay beside their labels
        assert torch.equal(gx, wx) and torch.equal(gy, wy)
    cached = rloader.DataLoader(CachedBatch(ds), batch_size=4)
    first, second = next(iter(cached))[0], next(iter(cached))[0]
    assert first.data_ptr() != second.data_ptr()  # two batches, not one tensor twice
    first.zero_()
    assert second.any()


def test_batch_types_follow_torchvisions_return_type_setting(corpus):
    from torchvision import tv_tensors

    transform = v2.Compose([v2.Resize((160, 160)), v2.ToImage(), v2.ToDtype(torch.float32, True)])
    ours, theirs = RV.ImageFolder(corpus, transform), datasets.ImageFolder(corpus, transform)
    idx = _jpegs(theirs)
    for setting in ("Tensor", "TVTensor"):
        with tv_tensors.set_return_type(setting):
            want = next(iter(torch.utils.data.DataLoader(torch.utils.data.Subset(theirs, idx), 4)))
            got = next(iter(rloader.DataLoader(torch.utils.data.Subset(ours, idx), 4)))
        assert type(got[0]) is type(want[0]) and torch.equal(got[0], want[0]), setting


@pytest.mark.parametrize("loader_type", [rloader.DataLoader, torch.utils.data.DataLoader])
def test_a_loader_inside_a_getitems_borrows_nothing_of_the_outer_batch(corpus, loader_type):
    ds = torch.utils.data.Subset(RV.ImageFolder(corpus, BIG), _jpegs(RV.ImageFolder(corpus), 4))
    nested = LoaderInGetitems(ds, loader_type)
    assert len(list(rloader.DataLoader(nested, batch_size=4))) == 1
    assert nested.inner == [list, list]  # plain lists: no batch memory of the outer loop
