"""Whether and how batches are pinned (``pin_memory=True``): ``pin_plan`` and ``pin_batch``.

``pin_plan`` decides, per iterator, whether batches are pinned, with torch's warnings.
``pin_batch`` pins a batch by copying it into page-locked memory, as torch does; on CUDA most
batches are already pinned where they lie (worker processes' slots and the loader's batch
blocks are registered with the driver, ``cuda_host``), and pinning them copies nothing. Where
it runs: on the pin thread for worker processes (``pin_thread``), on each worker thread, and
in the single-process loop.
"""

from __future__ import annotations

import collections.abc
import copy
import warnings
from typing import Any, Callable, Optional

import torch

from .. import _compat

__all__ = ["pin_batch", "pin_plan"]


def pin_plan(loader) -> Optional[Callable]:
    """``pin_batch`` when batches should be pinned; warns as the user's torch does (its texts
    and conditions differ between versions: ``_compat.pin_memory_warnings``)."""
    if not loader.pin_memory:
        return None
    for category, text in _compat.pin_memory_warnings(loader.pin_memory_device):
        warnings.warn(text, category, stacklevel=4)
    if not torch.accelerator.is_available():
        return None
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == "mps":
        return None
    return pin_batch


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
