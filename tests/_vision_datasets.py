"""Datasets of tests/test_vision.py that build on rloader.vision (so on torchvision, which
`import _datasets` must not need)."""

from __future__ import annotations

import rloader.vision as RV


class OwnGetitem(RV.ImageFolder):
    """A user's ImageFolder with a __getitem__ of its own: a dict per sample."""

    def __getitem__(self, index):
        sample, target = super().__getitem__(index)
        return {"image": sample, "label": target}
