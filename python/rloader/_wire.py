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


class _BatchPickler(pickle.Pickler):
    """Pickles plain CPU tensors as raw out-of-band buffers: no copy into the pickle stream.

    Everything else (nested, sparse and quantized tensors, subclasses, tensors that need
    autograd, numpy arrays, any picklable object) takes its own pickle reduction, whose parts
    come back here: a nested or sparse tensor's component tensors still travel out of band.
    """

    def reducer_override(self, obj):
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
                # numpy's view of a contiguous tensor is its bytes (one call: a collated batch
                # is contiguous); else, or for a dtype numpy lacks (bfloat16), a uint8 copy.
                data = obj.numpy() if obj.is_contiguous() else None
            except TypeError:
                data = None
            try:
                if data is None:
                    data = obj.contiguous().reshape(-1).view(torch.uint8).numpy()
            except Exception:  # a kind of tensor this path does not know: the usual reduction
                return NotImplemented
            return _rebuild_tensor, (pickle.PickleBuffer(data), obj.dtype, tuple(obj.shape))
        return NotImplemented


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
