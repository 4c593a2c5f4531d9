"""rloader.vision's random draws naming the generator (`_plan.py`): equal to torchvision's own
`get_params` draws and generator state, used without `WorkerDraws`' dispatch where they are,
and left for torchvision's own where they are not."""

from __future__ import annotations

import os
import random
import re
import shutil
import threading

import numpy as np
import pytest
import torch
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

import rloader
import rloader.vision as RV
from rloader import _thread_info
from rloader.vision import _draws, _plan

import _vision_corpus

NORM = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    # (without the 4K pictures and other formats: loaders over it in a few seconds)
    whole = _vision_corpus.write(str(tmp_path_factory.mktemp("corpus")))
    root = os.path.join(str(tmp_path_factory.mktemp("draws")), "loader")
    shutil.copytree(whole, root, ignore=shutil.ignore_patterns("*3840x2160*", "other"))
    return root


RANDOM = {
    "rrc": T.RandomResizedCrop(224),
    "rrc-narrow": T.RandomResizedCrop(64, scale=(0.01, 0.02), ratio=(0.2, 5.0)),
    "rrc-square": T.RandomResizedCrop((32, 48), scale=(0.9, 1.0), ratio=(1.0, 1.0)),
    "crop": T.RandomCrop(16),
    "crop-wide": T.RandomCrop((8, 40)),
    "hflip": T.RandomHorizontalFlip(),
    "vflip-0.3": T.RandomVerticalFlip(p=0.3),
    "v2-rrc": v2.RandomResizedCrop(224),
    "v2-rrc-narrow": v2.RandomResizedCrop(64, scale=(0.01, 0.02), ratio=(0.2, 5.0)),
    "v2-rrc-nearest": v2.RandomResizedCrop(
        (32, 48), ratio=(1.0, 1.0), interpolation=v2.InterpolationMode.NEAREST
    ),
    "v2-hflip": v2.RandomHorizontalFlip(),
    "v2-vflip-0.3": v2.RandomVerticalFlip(p=0.3),
}


def _sizes(n: int, seed: int) -> list:
    rng = random.Random(seed)
    sizes = [(1, 1), (2, 3), (3, 900), (900, 3), (16, 8), (40, 8), (224, 224), (4000, 3000)]
    return sizes + [(rng.randint(1, 2000), rng.randint(1, 2000)) for _ in range(n)]


@pytest.mark.parametrize("name", list(RANDOM))
def test_draws_naming_the_generator_are_torchvisions(name):
    # torchvision's own forward on the recorder, from torch's global generator, against the
    # written-out draws from a generator of the same seed: steps, errors and states equal.
    t = RANDOM[name]
    fast = _plan._FORWARD[type(t)]
    mine = torch.Generator()
    torch.manual_seed(11)
    mine.manual_seed(11)
    for size in _sizes(300, seed=len(name)):
        want, got = [], []
        try:
            t(_plan._Recorder(size, want))
        except ValueError as e:  # RandomCrop larger than the image
            with pytest.raises(ValueError, match=re.escape(str(e))):
                fast(t, _plan._Recorder(size, got), mine)
        else:
            fast(t, _plan._Recorder(size, got), mine)
        assert got == want, size
        assert torch.equal(mine.get_state(), torch.get_rng_state()), size


@pytest.mark.parametrize(
    "transform",
    [
        T.Compose([T.Resize(40), T.RandomResizedCrop(24), T.RandomHorizontalFlip()]),
        v2.Compose([v2.Resize(40), v2.RandomResizedCrop(24), v2.RandomVerticalFlip()]),
        v2.Compose([v2.CenterCrop(30), v2.RandomHorizontalFlip()]),
    ],
    ids=["v1", "v2", "v2-center"],
)
def test_a_plan_of_supported_transforms_draws_by_name(transform):
    plan = _plan.Plan(transform)
    plan.record((50, 40))
    assert plan._explicit is True


def test_a_plan_with_a_random_crop_of_v2_draws_through_torchvision():
    plan = _plan.Plan(v2.Compose([v2.RandomCrop(16), v2.RandomHorizontalFlip()]))
    plan.record((50, 40))
    assert plan._explicit is False


def _counting_dispatch(monkeypatch) -> list:
    """The torch calls dispatched by `WorkerDraws` to a thread worker's own generator (not
    those of the plan's one check of its draws, which has a generator of its own)."""
    calls = []
    original = _draws.WorkerDraws.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        info = _thread_info.info()
        if info is not None and self.generator is info.rng.torch_generator:
            calls.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(_draws.WorkerDraws, "__torch_function__", counted)
    return calls


TRAIN = T.Compose(
    [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*NORM)]
)


def test_a_flip_unlike_torchvisions_is_left_to_torchvisions_own(monkeypatch):
    # The check runs torchvision's own forward, not the written-out draw again.
    def flip_drawing_two(self, img):
        return T.functional.hflip(img) if torch.rand(2)[1] < self.p else img

    monkeypatch.setattr(T.RandomHorizontalFlip, "forward", flip_drawing_two)
    plan = _plan.Plan(T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    plan.record((50, 40))
    assert plan._explicit is False


def test_the_log_ratio_is_computed_in_the_ratios_own_dtype():
    # numpy's float64s make a float64 tensor, floats one of the default dtype: a cache keyed
    # on equal values alone handed one the other's bounds.
    ratio = (0.2077, 4.8145)
    for r in (ratio, tuple(np.float64(x) for x in ratio), ratio):
        want = torch.log(torch.tensor(r))
        assert _plan._log_ratio(r) == (want[0].item(), want[1].item())


def test_module_hooks_run_once_per_sample_as_in_torchvision(corpus):
    counts = []
    for dataset_type in (datasets.ImageFolder, RV.ImageFolder):
        t = v2.RandomResizedCrop(16)
        calls = []
        t.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        ds = dataset_type(corpus, v2.Compose([t, v2.ToImage()]))
        for i in range(3):
            ds[i]
        counts.append(len(calls))
    assert counts == [3, 3]


def test_under_another_default_device_the_samples_are_torchvisions(corpus):
    # torch.set_default_device makes torch's factories (torch.empty, torch.rand) give tensors
    # there; torchvision's samples still come out on the CPU ("meta" stands in for "cuda").
    # The default device is the thread's: set on a thread of the test's own, it leaves the
    # process as it was (torch 2.6 cannot quite unset it).
    transform = T.Compose([T.Resize(8), T.ToTensor()])
    theirs, ours = datasets.ImageFolder(corpus, transform), RV.ImageFolder(corpus, transform)
    made = []

    def on_meta():
        torch.set_default_device("meta")
        made.extend([theirs[3], ours[3]])

    thread = threading.Thread(target=on_meta)
    thread.start()
    thread.join()
    want, got = made
    assert got[0].device == want[0].device and torch.equal(got[0], want[0])


def _batches(dataset_type, root, transform, **kw) -> list:
    torch.manual_seed(7)
    loader = rloader.DataLoader(
        dataset_type(root, transform), batch_size=4, shuffle=True, num_workers=2, **kw
    )
    return list(loader)


V2_TRAIN = v2.Compose(
    [v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.ToImage(),
     v2.ToDtype(torch.float32, scale=True), v2.Normalize(*NORM)]
)  # fmt: skip


@pytest.mark.parametrize("transform", [TRAIN, V2_TRAIN], ids=["v1", "v2"])
def test_thread_workers_draw_without_the_dispatch_mode(corpus, monkeypatch, transform):
    # The dispatch is what most of a sample's GIL time went to: none now, and still the
    # batches torch's worker processes give.
    calls = _counting_dispatch(monkeypatch)
    got = _batches(RV.ImageFolder, corpus, transform, worker_type="thread")
    assert calls == []
    want = _batches(datasets.ImageFolder, corpus, transform)
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert type(gx) is type(wx) and torch.equal(gx, wx) and torch.equal(gy, wy)


def test_thread_workers_draw_v2s_random_crop_through_the_dispatch_mode(corpus, monkeypatch):
    calls = _counting_dispatch(monkeypatch)
    transform = v2.Compose([v2.RandomCrop(1), v2.RandomHorizontalFlip(), v2.ToImage()])
    _batches(RV.ImageFolder, corpus, transform, worker_type="thread")
    assert torch.randint in calls


def test_draws_unlike_torchvisions_are_left_to_torchvisions_own(corpus, monkeypatch):
    # As if torchvision changed its arithmetic: the written-out draws no longer agree, so
    # torchvision's own get_params draws (under the dispatch mode), and the samples stay its.
    original = T.RandomResizedCrop.get_params

    def drawing_one_more(img, scale, ratio):
        torch.rand(1)
        return original(img, scale, ratio)

    monkeypatch.setattr(T.RandomResizedCrop, "get_params", staticmethod(drawing_one_more))
    plan = _plan.Plan(TRAIN)
    plan.record((50, 40))
    assert plan._explicit is False
    calls = _counting_dispatch(monkeypatch)
    got = _batches(RV.ImageFolder, corpus, TRAIN, worker_type="thread")
    assert calls
    # (processes forked: the patched get_params is theirs too)
    want = _batches(datasets.ImageFolder, corpus, TRAIN, multiprocessing_context="fork")
    for (gx, _), (wx, _) in zip(got, want):
        assert torch.equal(gx, wx)
