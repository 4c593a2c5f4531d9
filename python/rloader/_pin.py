"""Pinning a batch into page-locked memory, for fast copies to the accelerator."""

from __future__ import annotations

import collections.abc
import copy
from typing import Any

import torch

__all__ = ["pin_batch"]


def pin_batch(data: Any) -> Any:
    """A copy of ``data`` with every tensor (and anything with ``.pin_memory()``) pinned.

    Containers keep their type where they can, as torch's DataLoader keeps them.
    """
    if isinstance(data, torch.Tensor) or hasattr(data, "pin_memory"):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {key: pin_batch(value) for key, value in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(pinned)
                return clone
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(pin_batch(item) for item in data))
        return type(data)(pin_batch(item) for item in data)
    if isinstance(data, collections.abc.Sequence):
        items = [pin_batch(item) for item in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, item in enumerate(items):
                    clone[i] = item  # type: ignore[index]
                return clone
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
