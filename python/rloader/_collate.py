"""Turning a list of samples into a batch: ``default_collate``, ``collate``, ``default_convert``.

The output (types, dtypes, container types, errors) is torch's, element for element. Dispatch
works like this: ``collate(batch, collate_fn_map=...)`` looks at ``batch[0]`` only. Its exact
type is looked up in the map first; failing that, the map's keys are tried with ``isinstance``
in insertion order (so ``bool`` reaches the ``int`` handler). Anything not in the map is walked
structurally: mappings key by key, namedtuples field by field, other sequences position by
position (tuples come back as lists, for backward compatibility with torch).

``default_collate`` is exactly ``collate`` with ``default_collate_fn_map``, plus whatever was
registered on (or changed in) torch's own ``default_collate_fn_map``, which code written for
torch extends. A faster path may be put in front of it; it is only allowed to run while both
maps still equal their snapshots (``_MAPS_SNAPSHOT``), i.e. while nobody has registered their
own handlers: ``CollatePlan`` holds that rule, for this module and for the Rust loops.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import re
from collections.abc import Callable
from typing import Any, NamedTuple, Optional, Union

import torch
import torch.utils.data._utils.collate
from torch.utils.data import get_worker_info

from . import _rloader, _thread_info

__all__ = [
    "collate",
    "collate_float_fn",
    "collate_int_fn",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "default_collate",
    "default_collate_err_msg_format",
    "default_collate_fn_map",
    "default_convert",
]

CollateFnMap = dict[Union[type, tuple[type, ...]], Callable]  # (runtime alias: no `|` on 3.9)

# numpy dtype strings (e.g. "<U3", "|S2", "|O") for strings, bytes and objects: not tensors.
_NP_STR_OR_OBJECT_DTYPE = re.compile(r"[SaUO]")

_SPARSE_LAYOUTS = frozenset(
    {torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}
)

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _rebuild_mapping(template, keys, value_for):
    """A mapping like ``template`` holding ``{key: value_for(key) for key in keys}``.

    A mutable mapping is shallow-copied and updated, which keeps the type and any extra state
    a plain ``type(template)(values)`` would lose. Values are computed inside the attempt, as in
    torch: any ``TypeError`` (from the copy, the constructor, or a value) computes them again
    into a plain dict, so a value's own ``TypeError`` still reaches the caller.
    """
    try:
        if isinstance(template, collections.abc.MutableMapping):
            clone = copy.copy(template)
            clone.update({key: value_for(key) for key in keys})
            return clone
        return type(template)({key: value_for(key) for key in keys})
    except TypeError:
        return {key: value_for(key) for key in keys}


def _rebuild_sequence(template, items, convert):
    """A sequence like ``template`` holding ``convert(item)`` for each item; same fallback
    rule as ``_rebuild_mapping``, to a plain list (e.g. for ``range``)."""
    try:
        if isinstance(template, collections.abc.MutableSequence):
            clone = copy.copy(template)
            for i, item in enumerate(items):
                clone[i] = convert(item)
            return clone
        return type(template)([convert(item) for item in items])
    except TypeError:
        return [convert(item) for item in items]


def default_convert(data):
    """Turn every numpy array or numpy scalar inside ``data`` into a tensor, keeping the rest.

    Containers are rebuilt as ``collate`` rebuilds them (tuples become lists, namedtuples stay).
    numpy arrays of strings, bytes or objects, and ``np.str_`` scalars, are left as they are.
    """
    data_type = type(data)
    if isinstance(data, torch.Tensor):
        return data
    if data_type.__module__ == "numpy" and data_type.__name__ not in ("str_", "string_"):
        if (
            data_type.__name__ == "ndarray"
            and _NP_STR_OR_OBJECT_DTYPE.search(data.dtype.str) is not None
        ):
            return data
        return torch.as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, data, lambda key: default_convert(data[key]))
    if _is_namedtuple(data):
        return data_type(*(default_convert(field) for field in data))
    if isinstance(data, tuple):
        return [default_convert(item) for item in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, data, default_convert)
    return data


def collate(batch, *, collate_fn_map: CollateFnMap | None = None):
    """Collate ``batch`` (a list of samples) into one batch, dispatching on ``batch[0]``.

    ``collate_fn_map`` maps a type (or a tuple of types) to a function called as
    ``fn(batch, collate_fn_map=collate_fn_map)``. Without a map only containers are handled,
    and any leaf raises ``TypeError``.
    """
    elem = batch[0]
    elem_type = type(elem)

    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for key in collate_fn_map:
            if isinstance(elem, key):
                return collate_fn_map[key](batch, collate_fn_map=collate_fn_map)

    def sub(samples):
        return collate(samples, collate_fn_map=collate_fn_map)

    if isinstance(elem, collections.abc.Mapping):
        return _rebuild_mapping(elem, elem, lambda key: sub([sample[key] for sample in batch]))
    if _is_namedtuple(elem):
        return elem_type(*(sub(column) for column in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        samples = iter(batch)
        size = len(next(samples))
        if not all(len(sample) == size for sample in samples):
            raise RuntimeError("each element in list of batch should be of equal size")
        columns = list(zip(*batch))
        if isinstance(elem, tuple):
            return [sub(column) for column in columns]
        return _rebuild_sequence(elem, columns, sub)

    raise TypeError(default_collate_err_msg_format.format(elem_type))


def collate_tensor_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    """Stack same-shaped tensors along a new first dim (into shared memory inside a worker)."""
    elem = batch[0]
    if elem.is_nested:
        raise RuntimeError(
            "Batches of nested tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
    if elem.layout in _SPARSE_LAYOUTS:
        raise RuntimeError(
            "Batches of sparse tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
    out = None
    if get_worker_info() is not None and not _thread_info.in_thread_worker():
        # As torch's collate in a worker: stack into an output of the first element's dtype.
        # In rloader's workers it is in the batch's shared-memory slot when there is one, so the
        # batch reaches the main process without another copy (NOTE [Slots] in
        # rust/rloader-workers/src/slots.rs). In torch's workers it is in shared memory of its
        # own, as torch's collate makes it, which torch's transport passes on without a copy.
        if not all(isinstance(t, torch.Tensor) for t in batch):
            sum(t.numel() for t in batch)  # torch's collate counts elements first: its error
        shape = (len(batch), *elem.size())
        if elem.is_cpu:
            out = _rloader.slot_empty(shape, elem.dtype)
        if out is None and _rloader.in_slot_worker():
            out = elem.new_empty(shape)
        elif out is None:
            numel = sum(t.numel() for t in batch)
            storage = elem._typed_storage()._new_shared(numel, device=elem.device)
            out = elem.new(storage).resize_(shape)
    return torch.stack(batch, 0, out=out)


def collate_numpy_array_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    """Numeric numpy arrays become tensors, then go through the map again (as tensors)."""
    elem = batch[0]
    if _NP_STR_OR_OBJECT_DTYPE.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    return collate([torch.as_tensor(array) for array in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    return torch.as_tensor(batch)


def collate_float_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    return torch.tensor(batch, dtype=torch.float64)


def collate_int_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    return torch.tensor(batch)


def collate_str_fn(batch, *, collate_fn_map: CollateFnMap | None = None):
    return batch


# Insertion order matters: keys are tried with isinstance in this order after the exact-type
# lookup misses (bool is an int, numpy float64 is a float and is caught by the numpy entry).
default_collate_fn_map: CollateFnMap = {torch.Tensor: collate_tensor_fn}
with contextlib.suppress(ImportError):
    import numpy as np

    default_collate_fn_map[np.ndarray] = collate_numpy_array_fn  # np.memmap too
    # numpy scalars except strings and bytes (np.str_ / np.bytes_ are not np.number)
    default_collate_fn_map[(np.bool_, np.number, np.object_)] = collate_numpy_scalar_fn
default_collate_fn_map[float] = collate_float_fn
default_collate_fn_map[int] = collate_int_fn
default_collate_fn_map[str] = collate_str_fn
default_collate_fn_map[bytes] = collate_str_fn

_DEFAULT_MAP_SNAPSHOT = dict(default_collate_fn_map)

# torch's map: code written for torch registers its handlers there, and rloader's
# default_collate honours them too (torch's default_collate reads only that map).
_TORCH_MAP = torch.utils.data._utils.collate.default_collate_fn_map
_TORCH_MAP_SNAPSHOT = dict(_TORCH_MAP)
# Both maps, and both as they were at import: the fast path runs while they are equal.
_MAPS = (default_collate_fn_map, _TORCH_MAP)
_MAPS_SNAPSHOT = (_DEFAULT_MAP_SNAPSHOT, _TORCH_MAP_SNAPSHOT)


def _effective_map() -> CollateFnMap:
    """``default_collate_fn_map`` with what was registered on, or changed in, torch's map."""
    if _TORCH_MAP == _TORCH_MAP_SNAPSHOT:
        return default_collate_fn_map
    merged = dict(default_collate_fn_map)
    for key, fn in _TORCH_MAP.items():
        if _TORCH_MAP_SNAPSHOT.get(key) is not fn:
            merged[key] = fn
    return merged


class StackedSamples(list):
    """A batch of ``(tensor, *rest)`` samples whose tensors are ``stacked[0]``, ``stacked[1]``,
    ... in order, made so by the dataset in the memory the batch is collated into
    (``_rloader.batch_empty``; rloader.vision's ``__getitems__``). The default collate's
    tensor column is then ``stacked`` itself, not a copy of it (``collate_stacked``), once, and
    only while the list holds the samples it was made with; any other collate function, and a
    list changed since, sees a list of samples."""

    __slots__ = ("_rows", "stacked")

    def __init__(self, samples, stacked: torch.Tensor):
        super().__init__(samples)
        self._rows = tuple(self)
        self.stacked: Optional[torch.Tensor] = stacked


def collate_stacked(batch: StackedSamples, general: Callable[[Any], Any]) -> Optional[list]:
    """The default collate of ``batch`` (a list of columns, as for any batch of tuples), its
    other columns collated by ``general``; None where ``batch`` no longer holds the samples it
    was made with, or was collated already (it is then collated as any list). The Rust loops
    call it while the collate maps are pristine (``CollatePlan``) and no torch mode is active,
    so the tensor column is what stacking it would give: its type too (``tv_tensors`` stack to
    plain tensors, unless torchvision is told to return its own)."""
    stacked, rows = batch.stacked, batch._rows
    if stacked is None or len(batch) != len(rows) or any(a is not b for a, b in zip(batch, rows)):
        return None
    batch.stacked = None  # (a batch is collated once: a second time copies)
    kind = type(rows[0][0])
    if kind is not torch.Tensor:  # what torch.stack makes of this kind, as it is set now
        empty = torch.empty(0).as_subclass(kind)
        stacked = stacked.as_subclass(type(torch.stack([empty, empty])))
    return [stacked, *(general(list(column)) for column in list(zip(*rows))[1:])]


class CollatePlan(NamedTuple):
    """How a default collate function collates: the one rule for when the Rust fast path
    (``_rloader.fast_collate``, ``rust/rloader-py/src/collate/``) may run.

    The fast path gives the default collate's results for the batches it handles only while
    nobody has registered handlers on, or changed, the collate maps: while ``live_map`` equals
    ``pristine``, its snapshot at import. Otherwise, and for what the fast path does not handle,
    ``general(batch)`` collates. The Rust loops (``rust/rloader-py/src/fetch.rs``) read a plan
    by its names.
    """

    general: Callable[[Any], Any]
    live_map: Any
    pristine: Any

    def fast_path_may_run(self) -> bool:
        return self.live_map == self.pristine


def _general_default_collate(batch: Any) -> Any:
    return collate(batch, collate_fn_map=_effective_map())


def default_collate(batch):
    """Collate ``batch`` with ``default_collate_fn_map`` (torch's ``default_collate``).

    Common batches go through the Rust fast path (``rust/rloader-py/src/collate/``), which
    returns None for anything it does not handle; it is skipped inside worker processes (where
    tensors are collated into shared memory; worker threads take it) and once the map has
    been changed.
    """
    if _DEFAULT_COLLATE_PLAN.fast_path_may_run() and (
        get_worker_info() is None or _thread_info.in_thread_worker()
    ):
        out = _rloader.fast_collate(batch)
        if out is not None:
            return out
    return collate(batch, collate_fn_map=_effective_map())


_DEFAULT_COLLATE_PLAN = CollatePlan(_general_default_collate, _MAPS, _MAPS_SNAPSHOT)


def _collate_plan(collate_fn: Callable) -> Optional[CollatePlan]:
    """The plan of ``collate_fn`` when it is a default collate, else None: rloader's, or torch's
    own, which may be passed explicitly (Lightning re-creates loaders from their attributes)
    and gets the fast path too while torch's map is unmodified."""
    if collate_fn is default_collate:
        return _DEFAULT_COLLATE_PLAN
    if collate_fn is torch.utils.data._utils.collate.default_collate:
        return CollatePlan(collate_fn, _TORCH_MAP, _TORCH_MAP_SNAPSHOT)
    return None
