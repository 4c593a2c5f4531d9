"""The loader's recycled batch memory, kept across its epochs: what the single-process loop
and worker threads collate large batches into (NOTE [Batch memory])."""

from __future__ import annotations

from .. import _rloader
from .._loader_record import record_of
from .._pinning import cuda_host


def batch_buffers(loader, pin) -> _rloader.BatchBuffers:
    """The loader's recycled batch memory (``LoaderRecord.buffers``), kept across its epochs.
    When batches are pinned (``pin``: ``_pinning.policy.pin_plan``'s) on CUDA, its blocks are
    registered with the driver, so a batch is pinned where it was collated (NOTE [Pinned
    blocks]); a loader whose ``pin_memory`` changed gets new memory."""
    pinning = cuda_host.slot_pinning() if pin is not None else None
    record = record_of(getattr(loader, "_rloader_owner", loader))  # an auto engine's: its loader
    buffers = record.buffers
    if buffers is None or buffers._pinned != (pinning is not None):
        buffers = record.buffers = _rloader.BatchBuffers()
        if pinning is not None:
            buffers._pin_blocks(*pinning)
    return buffers
