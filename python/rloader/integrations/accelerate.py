"""Hugging Face accelerate: ``Accelerator.prepare()`` keeps rloader's engine.

    from accelerate import Accelerator

    import rloader
    import rloader.integrations.accelerate

    rloader.integrations.accelerate.install()  # once, before prepare()
    accelerator = Accelerator()
    loader = rloader.DataLoader(dataset, batch_size=256, shuffle=True, num_workers=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

Why it is needed: ``prepare()`` does not keep the loader it is given. accelerate's
``prepare_data_loader`` reads the loader's attributes and builds a ``DataLoaderShard`` (or, with
``dispatch_batches``, a ``DataLoaderDispatcher``) around a new ``torch.utils.data.DataLoader``,
its ``base_dataloader``, over the same dataset and the same batch sampler, wrapped in
accelerate's ``BatchSamplerShard`` when there are several processes. An rloader loader comes
back as torch's, at torch's speed.

What ``install()`` does: it wraps accelerate's ``prepare_data_loader`` and
``skip_first_batches`` under every name they are reached by (``accelerate.data_loader``,
``accelerate.accelerator``, which imports them by name, and ``accelerate`` for
``skip_first_batches``). The wrapper calls accelerate's function unchanged; then, only when the
loader passed in is backed by rloader (an ``rloader.DataLoader``, or a loader prepared from one),
it replaces the result's ``base_dataloader``, when that is a plain torch ``DataLoader``, by an
``rloader.DataLoader`` built from its attributes: the same dataset, batch sampler (or sampler,
batch size and ``drop_last``), collate function, workers, pinning, timeout, worker init
function, multiprocessing context, generator, prefetch factor, ``persistent_workers``,
``pin_memory_device`` and ``in_order``. The batch sampler is the same object, so sharding,
``set_epoch``, ``even_batches``, ``split_batches`` and the seedable sampler work as they do for
torch, and each process gets the batches torch's prepared loader would give it. Everything else
(device placement, RNG synchronisation, end-of-epoch tracking, dispatching) stays accelerate's.

- Loaders of torch (or any other class) passed to ``prepare()`` are left exactly as accelerate
  makes them. rloader's classes answer ``isinstance`` as torch's do, so rloader's loaders are
  recognised by their type's MRO instead.
- ``dispatch_batches=True``: the ``DataLoaderDispatcher``'s base loader (iterated on process 0,
  which broadcasts slices of each batch) is rloader's too.
- ``use_stateful_dataloader=True``: the base loader is torchdata's ``StatefulDataLoader``, whose
  point is a ``state_dict()`` that resumes mid-epoch. accelerate reads and adjusts that state
  by torchdata's keys, which rloader's own ``state_dict()`` does not have, so it is left to
  accelerate and torchdata, with a warning that this loader does not run on rloader's engine.
- ``uninstall()`` puts accelerate's functions back; loaders already prepared keep their base.
  ``install()`` and ``uninstall()`` may be called any number of times.

Needs accelerate 1.0 or later (tested with 1.10 and 1.15). Code that imported ``prepare_data_loader`` or
``skip_first_batches`` by name before ``install()`` holds accelerate's own functions: call
``install()`` first (``Accelerator``'s methods look the names up when they are called, so they
are always covered).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any, Callable, Optional

import accelerate.data_loader as _acc_data_loader
import torch.utils.data as tud

from ..dataloader import DataLoader

__all__ = ["install", "is_installed", "uninstall"]

# Where accelerate's functions are reached by name: accelerator.py does
# `from .data_loader import prepare_data_loader, skip_first_batches`, and accelerate/__init__.py
# exports skip_first_batches.
_TARGETS = {
    "prepare_data_loader": ("accelerate.data_loader", "accelerate.accelerator"),
    "skip_first_batches": ("accelerate.data_loader", "accelerate.accelerator", "accelerate"),
}

# torch DataLoader arguments that a rebuilt loader takes as they are; the batching ones
# (sampler, batch_sampler, batch_size, drop_last) are chosen by _batching.
_CARRIED = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)

# rloader's own arguments, which accelerate's torch loader does not have: read from the
# rloader loader that was prepared.
_OURS = ("worker_type",)

_STATEFUL_WARNING = (
    "use_stateful_dataloader=True: this prepared loader runs on torchdata's StatefulDataLoader, "
    "not on rloader's engine (accelerate adjusts torchdata's state format, not rloader's)"
)


def install() -> None:
    """Makes accelerate's ``prepare()`` (and ``skip_first_batches``) keep rloader's engine for
    rloader's loaders. Idempotent."""
    if not hasattr(_acc_data_loader, "DataLoaderAdapter"):
        # Older releases made DataLoaderShard a torch DataLoader subclass, with no base loader.
        raise ImportError(
            "rloader.integrations.accelerate needs accelerate>=1.0, whose prepared loaders wrap "
            f"a base_dataloader (DataLoaderAdapter); accelerate {_acc_version()} is installed"
        )
    for name, modules in _TARGETS.items():
        original = getattr(_acc_data_loader, name)
        if _is_ours(original):
            continue
        wrapper = _wrap(original)
        for module_name in modules:
            module = importlib.import_module(module_name)
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)


def uninstall() -> None:
    """Puts accelerate's own functions back. Idempotent."""
    for name, modules in _TARGETS.items():
        for module_name in modules:
            module = importlib.import_module(module_name)
            current = getattr(module, name, None)
            if _is_ours(current):
                setattr(module, name, current._rloader_original)  # type: ignore[union-attr]


def is_installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _is_ours(_acc_data_loader.prepare_data_loader)


def _acc_version() -> str:
    return getattr(importlib.import_module("accelerate"), "__version__", "?")


def _is_ours(fn: object) -> bool:
    return getattr(fn, "_rloader_original", None) is not None


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(dataloader: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(dataloader, *args, **kwargs)
        if _backed_by_rloader(dataloader):
            result = _keep_engine(result, _own_arguments(dataloader))
        return result

    wrapper._rloader_original = original  # type: ignore[attr-defined]
    return wrapper


def _adapter(obj: Any) -> Optional[Any]:
    """The accelerate DataLoaderAdapter (DataLoaderShard, DataLoaderDispatcher, SkipDataLoader)
    that ``obj`` is or, on XLA, wraps; None for anything else. Checked by type: an adapter's
    ``__class__`` answers as its base loader's."""
    adapter_type = _acc_data_loader.DataLoaderAdapter
    if adapter_type in type(obj).__mro__:
        return obj
    inner = getattr(obj, "_loader", None)  # XLA's MpDeviceLoaderWrapper
    if adapter_type in type(inner).__mro__:
        return inner
    return None


def _base(obj: Any) -> Any:
    adapter = _adapter(obj)
    return obj if adapter is None else adapter.base_dataloader


def _backed_by_rloader(obj: Any) -> bool:
    return DataLoader in type(_base(obj)).__mro__


def _own_arguments(obj: Any) -> dict:
    base = _base(obj)
    return {k: getattr(base, k) for k in _OURS if hasattr(base, k)}


def _keep_engine(result: Any, own: dict) -> Any:
    adapter = _adapter(result)
    if adapter is None:
        # skip_first_batches over a loader that was never prepared returns a torch DataLoader.
        return _rebuild(result, own) if type(result) is tud.DataLoader else result
    base = adapter.base_dataloader
    if type(base) is tud.DataLoader:
        adapter.base_dataloader = _rebuild(base, own)
        # Under several processes accelerate adjusts the base loader's state_dict() by torchdata's
        # keys (_num_yielded, ...), which rloader's state has none of: newer accelerate skips the
        # missing keys, older releases (1.10, the last for Python 3.9) raised KeyError at every
        # batch. The adjustment does nothing for rloader's state, so this adapter skips it.
        adapter.adjust_state_dict_for_prefetch = _no_state_adjustment
    elif getattr(adapter, "use_stateful_dataloader", False):
        warnings.warn(_STATEFUL_WARNING, stacklevel=3)
    return result


def _no_state_adjustment() -> None:
    pass


def _rebuild(loader: tud.DataLoader, own: dict) -> DataLoader:
    """An rloader DataLoader with ``loader``'s arguments (read back from its attributes), and
    rloader's own arguments ``own`` of the loader that was prepared."""
    kwargs = {k: getattr(loader, k) for k in _CARRIED if hasattr(loader, k)}
    return DataLoader(loader.dataset, **_batching(loader), **kwargs, **own)


def _batching(loader: tud.DataLoader) -> dict:
    if isinstance(loader.dataset, tud.IterableDataset):
        return {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    if loader.batch_sampler is not None and loader.batch_size is None:
        return {"batch_sampler": loader.batch_sampler}  # given as batch_sampler
    # given as sampler (accelerate's BatchSamplerShard when the original's sampler was a
    # BatchSampler) with batch_size, or batch_size=None without a batch_sampler
    return {
        "sampler": loader.sampler,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
    }
