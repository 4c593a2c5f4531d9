"""Pinning in place on CUDA: registering host memory with the driver, and fences.

``slot_pinning`` gives the Rust side the three driver calls it needs to pin batches where they
already lie instead of copying them (``cudaHostRegister`` and ``cudaHostUnregister`` through
torch's ``cudart()``, and events on the devices' streams): worker processes' batch slots
(``PoolIter._pin_slots``, NOTE [Pinned slots]) and the loader's recycled batch blocks
(``BatchBuffers._pin_blocks``, NOTE [Pinned blocks]). The Rust side decides when to register,
reuse and unregister; only this module touches the CUDA runtime.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["slot_pinning"]


def slot_pinning() -> Optional[tuple]:
    """``(register, unregister, fence)`` (``_HostRegister``, ``_HostUnregister`` and
    ``_RecordFence`` in ``_rloader.pyi``) for pinning worker processes' batches where they
    arrive (``PoolIter._pin_slots``, NOTE [Pinned slots] in rloader-workers' pinned.rs), and
    thread workers' and the single-process loop's where they are collated
    (``BatchBuffers._pin_blocks``, NOTE [Pinned blocks] in rloader-memory), or
    None where the accelerator is not CUDA (batches are then copied into pinned memory, as
    torch's are). Nothing here touches CUDA until the first batch arrives, on the
    pin thread, after the workers have started (as torch's pin thread is the first to).

    ``fence()`` records an event on the current stream of every device in use when a batch is
    dropped: the slot it lies in goes back to its worker once they have all completed, so a
    batch moved with ``non_blocking=True`` (to any device, or scattered by ``DataParallel``,
    whose copy streams the devices' current streams wait for) and dropped at once is read
    before it is overwritten.
    """
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    portable = 1  # cudaHostRegisterPortable: pinned for every device, as torch's pinned memory

    def register(addr: int, length: int) -> None:
        cudart = torch.cuda.cudart()
        error = cudart.cudaHostRegister(addr, length, portable)
        if error != cudart.cudaError.success:
            _clear_cuda_error()
            raise RuntimeError(f"cudaHostRegister of {length} bytes failed: {error}")

    def unregister(addr: int) -> None:
        cudart = torch.cuda.cudart()
        if cudart.cudaHostUnregister(addr) != cudart.cudaError.success:
            _clear_cuda_error()

    def fence() -> "_Events":
        return _Events([_recorded(d) for d in _devices_in_use()])

    return register, unregister, fence


def _devices_in_use() -> list:
    """The CUDA devices this process has a context on (a copy to a device needs one)."""
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    if has_context is None:
        return [torch.cuda.current_device()]
    return [d for d in range(torch.cuda.device_count()) if has_context(d)]


def _recorded(device: int):
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class _Events:
    """Events on several devices' streams, done when all are."""

    __slots__ = ("events",)

    def __init__(self, events: list) -> None:
        self.events = events

    def query(self) -> bool:
        return all(event.query() for event in self.events)

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()


def _clear_cuda_error() -> None:
    """Resets the CUDA runtime's last error after a refused call, which torch would otherwise
    report at its next unrelated check (torch's ``cudart()`` has no ``cudaGetLastError``)."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
    except (OSError, AttributeError):
        pass
