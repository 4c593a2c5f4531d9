"""rloader.vision's folders resumed mid-epoch by a DataLoader: every sample, random crops and
flips included, is the uninterrupted run's, on worker processes and threads (each worker's
draws are saved through the dataset's ``state_dict``)."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
import torch
from _resume_helpers import restarted
from PIL import Image
from torch.utils.data import random_split
from torchvision import transforms as T
from torchvision.transforms import v2

import rloader
import rloader.vision as RV

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

NORM = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
TRAIN = T.Compose(
    [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*NORM)]
)
# Python's random (v1's RandomChoice) and a transform Rust does not run (ColorJitter draws too).
# Thread workers share Python's random (their own is torch's generator), so theirs is v2's.
CHOICES = [T.RandomResizedCrop(24), T.Compose([T.Resize(30), T.RandomCrop(24)])]
MIXED = T.Compose(
    [T.RandomChoice(CHOICES), T.ColorJitter(0.4, 0.4), T.RandomHorizontalFlip(), T.PILToTensor()]
)
MIXED_V2 = T.Compose(
    [v2.RandomChoice(CHOICES), T.ColorJitter(0.4, 0.4), T.RandomHorizontalFlip(), T.PILToTensor()]
)
CASES = {
    "train-process": (TRAIN, "process"),
    "train-thread": (TRAIN, "thread"),
    "mixed-process": (MIXED, "process"),
    "mixed-thread": (MIXED_V2, "thread"),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("folder")
    g = torch.Generator().manual_seed(0)
    for i in range(22):
        os.makedirs(root / f"c{i % 2}", exist_ok=True)
        w, h = 40 + i, 36 + 2 * i
        pixels = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g).numpy()
        Image.fromarray(pixels).save(root / f"c{i % 2}" / f"{i}.jpg", quality=90)
    return str(root)


def digest(batch) -> tuple:
    x, y = batch
    return hashlib.sha256(x.contiguous().numpy().tobytes()).hexdigest(), y.tolist()


def make(root, transform, workers, worker_type, persistent, seed, split=False):
    dataset = RV.ImageFolder(root, transform)
    if split:  # a training part, as random_split gives it (a Subset)
        dataset = random_split(dataset, [0.7, 0.3], generator=torch.Generator().manual_seed(5))[0]
    return rloader.DataLoader(
        dataset,
        batch_size=3,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=workers,
        worker_type=worker_type,
        persistent_workers=persistent,
    )


def run(root, transform, worker_type, persistent, stop=None, epochs=2, split=False, leave=None):
    """Each epoch's batches (digests); with ``stop=(epoch, batches)`` the loader is saved
    there and a new one, loaded from the checkpoint, goes on. ``leave``: the first epoch is
    left (``break``) after so many batches."""
    torch.manual_seed(3)
    loader = make(root, transform, 2, worker_type, persistent, 11, split)
    seen = []
    for epoch in range(epochs):
        it = iter(loader)
        batches = []
        while (batch := next(it, None)) is not None:  # (`it` is replaced on resuming)
            batches.append(digest(batch))
            if epoch == 0 and len(batches) == leave:
                break
            if stop == (epoch, len(batches)):
                loader = restarted(
                    loader, lambda: make(root, transform, 2, worker_type, persistent, 99, split)
                )
                del it
                it = iter(loader)
        seen.append(batches)
    return seen


@pytest.mark.parametrize("stop", [(0, 3), (1, 1)], ids=["middle", "second epoch's first batch"])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("case", CASES)
def test_a_resumed_epoch_gives_the_uninterrupted_samples(folder, case, persistent, stop):
    transform, worker_type = CASES[case]
    expected = run(folder, transform, worker_type, persistent)
    assert run(folder, transform, worker_type, persistent, stop) == expected


@pytest.mark.parametrize("case", CASES)
def test_a_resume_after_an_epoch_left_early_gives_the_uninterrupted_samples(folder, case):
    # Persistent workers' crops and flips go on from the samples they made for batches that
    # were never taken.
    transform, worker_type = CASES[case]
    expected = run(folder, transform, worker_type, True, leave=2)
    assert run(folder, transform, worker_type, True, (1, 1), leave=2) == expected


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_resumed_random_split_gives_the_uninterrupted_samples(folder, worker_type):
    # A Subset draws nothing itself: its workers' states are the folder's.
    expected = run(folder, TRAIN, worker_type, False, split=True)
    assert run(folder, TRAIN, worker_type, False, stop=(0, 2), split=True) == expected


def test_the_state_is_each_workers_draws(folder):
    ds = RV.ImageFolder(folder, TRAIN)
    assert ds.state_dict() == {}  # the main process's generators are the user's
    loader = make(folder, TRAIN, 2, "process", False, 1)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()["workers"]["states"][0]
    assert set(saved) == {"torch", "random"}
    buffer = io.BytesIO()
    torch.save(saved, buffer)  # a checkpoint's plain contents
    threads = make(folder, TRAIN, 2, "thread", False, 1)
    it = iter(threads)
    next(it)
    assert set(threads.state_dict()["workers"]["states"][0]) == {"torch"}


def test_a_state_that_is_not_a_folders_says_so(folder):
    ds = RV.ImageFolder(folder, TRAIN)
    for bad in ([1, 2], {"torch": None, "other": 1}):
        with pytest.raises(ValueError, match="state_dict"):
            ds.load_state_dict(bad)
