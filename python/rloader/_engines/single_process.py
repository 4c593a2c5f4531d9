"""``num_workers=0``: the loop runs in the iterating thread (``LoaderIter``,
rust/rloader-py/src/single_process.rs) over the epoch's keys."""

from __future__ import annotations

from torch.utils.data.dataloader import _DatasetKind

from .. import _resume, _rloader
from .._collate import _collate_plan
from .._pinning import policy
from .._seed import draw_seed
from ..sampler import iter_keys
from .batch_memory import batch_buffers


def start(loader) -> _rloader.LoaderIter:
    """The ``num_workers=0`` iterator: the epoch's draws, then ``LoaderIter`` over its keys."""
    if loader.timeout != 0:
        # torch asserts the same; say what to change.
        raise AssertionError(
            f"timeout={loader.timeout} only applies to worker processes: "
            "set timeout=0 or num_workers > 0"
        )
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    # torch draws a base seed for worker processes with every iterator, workers or not:
    # draw it too, so the generator (or global RNG) advances exactly as with torch.
    draw_seed(loader.generator)
    keys = _resume.epoch_of(loader).keys(keys)
    return loader_iter(loader, keys, _resume.epoch_of(loader).stream_ended)


def loader_iter(loader, keys, exhausted: bool) -> _rloader.LoaderIter:
    """The single-process iterator over ``keys`` (drawn by the caller)."""
    pin = policy.pin_plan(loader)
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    collate_fn = loader.collate_fn
    return _rloader.LoaderIter(
        dataset=loader.dataset,
        keys=keys,
        batch=_rloader.BatchOptions(
            auto_collation=loader._auto_collation,
            batch_size=loader.batch_size if iterable else None,
            drop_last=loader.drop_last,
            collate_fn=collate_fn,
            collate_plan=_collate_plan(collate_fn),
            pin=pin,
            buffers=batch_buffers(loader, pin),
        ),
        length_of=loader._index_sampler,
        reported_len=loader._IterableDataset_len_called if iterable else None,
        exhausted=exhausted,
    )
