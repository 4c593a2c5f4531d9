"""A batch as bytes and back: how batches (and workers' errors) cross the process boundary.

A worker process pickles its batch with ``dumps``; plain CPU tensors go out of band as raw
buffers, which the Rust side finds already in the worker's shared-memory slot (collated there),
or copies there, or when they do not fit sends inline in the message (``send_batch`` in
rust/rloader-py/src/process/worker.rs). The main
process rebuilds the batch with ``loads`` over its own mapping of the slot and of the message,
without a copy: the tensors keep the slot's ``Lease`` alive, and the slot goes back to its
worker when the last of them is gone (NOTE [Slots]). A worker's exception travels pickled
in torch's ``ExceptionWrapper`` (``dump_error``).

Pickles made here name ``_rebuild_tensor`` by this module's path: worker and main process run
the same installed rloader.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch._utils import ExceptionWrapper

__all__ = ["dump_error", "dumps", "loads"]


def _rebuild_tensor(buffer, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    # As torch's own rebuild of a tensor a worker sent (torch._utils._rebuild_tensor, which
    # set_s an empty tensor onto the storage): no view (`_base` None), contiguous, `_version` 1.
    # resize_ to the buffer's own size keeps its storage and bumps the version as set_ does,
    # in two calls instead of four (the main process pays them for every tensor of a batch);
    # but a resize_ to the shape it has already (1-D) changes nothing, version included.
    if len(buffer) == 0:
        storage = torch.UntypedStorage(0)
        return torch.empty((0,), dtype=dtype, device="cpu").set_(storage, 0, shape)
    tensor = torch.frombuffer(buffer, dtype=dtype)
    if len(shape) == 1:
        return tensor.set_(tensor.untyped_storage(), 0, shape)
    return tensor.resize_(shape)


def _rebuild_storage(buffer) -> torch.UntypedStorage:
    if len(buffer) == 0:
        return torch.UntypedStorage(0)
    return torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()


def _rebuild_strided(storage, dtype: torch.dtype, shape: tuple, stride: tuple, offset: int):
    # torch's rebuild of a tensor a worker sent (torch._utils._rebuild_tensor): its storage,
    # offset and strides as they were; `_version` 1.
    return torch.empty((0,), dtype=dtype, device="cpu").set_(storage, offset, shape, stride)


class _Storage:
    """Bytes of a storage that tensors of one batch share: pickled once (the pickler's memo
    keeps the object), so they share one storage in the main process, as torch's do."""

    __slots__ = ("data",)

    def __init__(self, data) -> None:
        self.data = data


# A tensor that is not its storage's whole (a view, an expanded or channels-last tensor) goes
# with its whole storage, as torch sends it, unless the storage is more than this many bytes
# beyond the span the tensor reaches: then the span alone (a view of a dataset's tensor must
# not send the dataset). Its strides are kept either way.
_STORAGE_SLACK = 1 << 20


class _BatchPickler(pickle.Pickler):
    """Pickles plain CPU tensors as raw out-of-band buffers: no copy into the pickle stream.

    Everything else (nested, sparse and quantized tensors, subclasses, tensors that need
    autograd, numpy arrays, any picklable object) takes its own pickle reduction, whose parts
    come back here: a nested or sparse tensor's component tensors still travel out of band.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._storages: dict = {}  # (data_ptr, nbytes) of a storage sent whole: its _Storage

    def reducer_override(self, obj):
        if type(obj) is _Storage:
            return _rebuild_storage, (pickle.PickleBuffer(obj.data),)
        if (
            type(obj) is torch.Tensor
            and obj.layout == torch.strided
            and obj.device.type == "cpu"
            and not obj.is_nested
            and not obj.requires_grad
            and not obj.is_conj()
            and not obj.is_neg()
            and not obj.is_quantized
        ):
            try:
                return self._reduce_tensor(obj)
            except Exception:  # a kind of tensor this path does not know: the usual reduction
                return NotImplemented
        return NotImplemented

    def _reduce_tensor(self, obj: torch.Tensor):
        storage = obj.untyped_storage()
        nbytes, itemsize = storage.nbytes(), obj.element_size()
        offset, shape = obj.storage_offset(), tuple(obj.shape)
        if obj.is_contiguous() and offset == 0 and nbytes == obj.numel() * itemsize:
            # Its storage's whole, in order (a collated batch): its bytes, by numpy's view
            # (one call), or a uint8 view for a dtype numpy lacks (bfloat16).
            try:
                data = obj.numpy()
            except TypeError:
                data = obj.reshape(-1).view(torch.uint8).numpy()
            return _rebuild_tensor, (pickle.PickleBuffer(data), obj.dtype, shape)
        stride = obj.stride()
        # The elements it reaches: from its offset (strides are never negative) to its last.
        end = (
            offset + 1 + sum(st * (n - 1) for st, n in zip(stride, shape))
            if obj.numel()
            else offset
        )
        span = (end - offset) * itemsize
        whole = torch.empty((0,), dtype=torch.uint8).set_(storage)
        if nbytes <= span + _STORAGE_SLACK:
            key = (storage.data_ptr(), nbytes)
            shared = self._storages.get(key)
            if shared is None:
                shared = self._storages[key] = _Storage(whole.numpy())
            return _rebuild_strided, (shared, obj.dtype, shape, stride, offset)
        part = _Storage(whole[offset * itemsize : end * itemsize].numpy())
        return _rebuild_strided, (part, obj.dtype, shape, stride, 0)


def dumps(batch: Any) -> tuple[bytes, list]:
    """``batch`` as pickle bytes plus out-of-band byte buffers (tensors', arrays')."""
    buffers: list = []
    stream = io.BytesIO()
    _BatchPickler(stream, protocol=5, buffer_callback=buffers.append).dump(batch)
    return stream.getvalue(), [b.raw() for b in buffers]


def loads(message, lease, pickle_range: tuple, buffers: list) -> Any:
    """The inverse of ``dumps``, over one received message and the worker slot it names.

    Each of ``buffers`` is ``(in_slot, start, end)``: bytes of the slot held by ``lease``, or of
    the message. Neither is copied: the tensors are built over them and keep them alive.
    """
    view = memoryview(message)
    slot = memoryview(lease) if lease is not None else None
    start, end = pickle_range
    return pickle.loads(
        view[start:end], buffers=[(slot if in_slot else view)[a:b] for in_slot, a, b in buffers]
    )


def dump_error(worker_id: int, exc: BaseException, traceback=None) -> bytes:
    """An exception raised in a worker, as torch's ExceptionWrapper names it, pickled.

    The wrapper holds the exception's type and its formatted traceback; a type that cannot be
    pickled (a class local to a function, say) travels as a RuntimeError with the same text,
    so the user still reads the worker's error rather than a worker's death.
    """
    where = f"in DataLoader worker process {worker_id}"
    wrapper = ExceptionWrapper(
        exc_info=(type(exc), exc, traceback or exc.__traceback__), where=where
    )
    try:
        return pickle.dumps(wrapper)
    except Exception:
        wrapper.exc_type = RuntimeError  # (its text, the traceback, names the original type)
        return pickle.dumps(wrapper)
