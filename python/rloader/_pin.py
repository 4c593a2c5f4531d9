"""Pinning a batch into page-locked memory, for fast copies to the accelerator."""

from __future__ import annotations

import collections.abc
import copy
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch._utils import ExceptionWrapper

from . import _compat, _rloader

__all__ = ["PinnedBatches", "pin_batch", "slot_pinning"]


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


# ---------------------------------------------------------------- the pin_memory thread

# How often a waiting pin thread looks at its stop flag (torch checks every 5 s; shorter here
# because stopping it is how an abandoned iterator shuts its workers down).
_POLL = 0.1


def _len_warning(reported_len) -> "_rloader.LengthWarning | None":
    return None if reported_len is None else _rloader.LengthWarning(*reported_len, True)


class PinnedBatches:
    """Batches from worker processes, pinned on a thread of their own.

    As with torch's ``pin_memory`` thread, the main thread does not spend its time copying
    batches into page-locked memory: a daemon thread takes each batch from ``source`` (the
    Rust ``PoolIter``), pins it and hands it over through a queue of one. (The pool bounds
    the batches in flight at ``prefetch_factor * num_workers``; the hand-off adds one or two.)

    NOTE [Pin thread]: only the thread touches ``source`` while it runs — PyO3 refuses a
    second borrow of it. The sampler is not the thread's: with a map-style dataset the main
    thread draws the keys of the tasks the thread sends into ``feed`` (NOTE [Key feed]),
    keeping torch's account of the tasks in flight. Every other use of ``source``
    (a new epoch, shutting down) first stops the thread (``_halt``), which sees its stop flag
    within ``_POLL`` seconds. Errors travel as items, and the thread goes on after a worker's
    error, as torch's iterator goes on after one; it ends after the epoch's "end" item, or
    after a "fatal" one (a dead worker, the pool's own failure), having stopped the workers.
    Each item goes over in a box the main thread empties, so the thread holds no batch it has
    handed over: the user's thread lets it go, on its own stream (NOTE [Pinned slots]). The
    thread holds nothing of the user's (``source`` is built without the sampler, which the
    feed holds, and without ``length_of``), so a loader whose sampler refers back to it is still
    garbage once dropped.
    """

    def __init__(
        self,
        source,
        pin,
        length_of,
        timeout: float = 0,
        feed=None,
        drawn: int = 0,
        new_feed=None,
        reported_len=None,
    ) -> None:
        self._source = source
        # For (dataset, len(loader)) when that was asked of an IterableDataset's loader: torch
        # warns for each batch beyond it.
        self._len_warning = _len_warning(reported_len)
        self._pin = pin
        self._length_of = length_of
        # As torch's: how long ``__next__`` may wait for the thread (0: as long as it takes).
        self._timeout = timeout
        # The KeyFeed the main thread draws into, with its first ``drawn`` batches of keys, and
        # what makes one for a new epoch's iterator of the sampler (None: tokens, for an
        # iterable dataset); and the tasks whose keys were drawn and whose answers have not
        # been taken yet (torch's ``_tasks_outstanding``).
        self._feed = feed
        self._new_feed = new_feed
        self._in_flight = drawn
        self._rloader_pool = source._rloader_pool
        self._taken, self._finished = 0, False
        # The PoolIter's Stats (its transport; this iterator's waits; the thread's pinning),
        # taken now: while the thread runs, only the thread may touch `source`.
        self._stats = source._stats
        # What reached the user, recorded here as it does (HandOuts: the thread only polls).
        self._handouts = source._handouts
        self._start()

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(1)
        self._stop = threading.Event()
        self._ended = False
        device = (
            torch.accelerator.current_device_index() if torch.accelerator.is_available() else None
        )
        self._thread = threading.Thread(
            target=_pin_loop,
            args=(self._source, self._pin, self._queue, self._stop, device, self._stats),
            name="rloader_pin_memory",
            daemon=True,
        )
        self._thread.start()
        # An abandoned iterator stops its thread; then its PoolIter can stop the workers.
        self._finalizer = weakref.finalize(self, _stop_thread, self._thread, self._stop)

    def __iter__(self) -> "PinnedBatches":
        return self

    def __reduce__(self):
        raise NotImplementedError("{} cannot be pickled", type(self).__name__)

    def __len__(self) -> int:
        return len(self._length_of)

    def __next__(self) -> Any:
        stats = self._stats
        stats.next_called()
        try:
            batch = self._next()
        except BaseException:
            stats.next_returned(False)
            raise
        stats.next_returned(True)
        return batch

    def _next(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._feed is not None and self._in_flight == 0:
            # Nothing in flight: torch ends the epoch here (the sampler is exhausted, or raised).
            self._feed.end()
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _POLL if deadline is None else min(_POLL, max(0.0, deadline - time.monotonic()))
            try:
                kind, value, tag = self._queue.get(timeout=wait).pop()
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} seconds"
                    ) from None
                if self._thread.is_alive():
                    continue
                try:  # it may have queued its last item just before it ended
                    kind, value, tag = self._queue.get_nowait().pop()
                except queue.Empty:
                    self._ended = True
                    raise RuntimeError(
                        "the DataLoader's pin memory thread exited unexpectedly"
                    ) from None
            if tag is not None and self._feed is not None:
                # torch's _try_put_index: the next task's keys, drawn here, before the batch
                # (or the worker's error) is handed out; a sampler's error goes to the user.
                self._in_flight -= 1
                self._in_flight += self._feed.draw(1)
            if tag is not None:  # a batch or a worker's error, in answer to its task
                self._handouts.record(*tag)
            if kind == "batch":
                self._taken += 1
                if self._len_warning is not None:
                    self._len_warning.yielded()
                return value
            if kind == "fatal":  # nothing more comes: the pool is stopped
                self._ended = True
            if kind == "error":
                self._taken += 1  # a batch handed out as its error
            if kind in ("error", "fatal"):
                raise value
            self._ended = self._finished = True
            raise StopIteration

    @property
    def _progress(self) -> tuple:
        """(batches handed out this epoch, whether it ended), as ``PoolIter._progress``."""
        return (self._taken, self._finished)

    def _halt(self) -> None:
        """Stops the thread (again, if need be): afterwards ``source`` is free to use."""
        _stop_thread(self._thread, self._stop)
        self._finalizer.detach()

    def _reset(self, keys, reported_len=None) -> None:
        """A new epoch on persistent workers."""
        self._len_warning = _len_warning(reported_len)
        self._halt()
        self._ended = True  # nothing of the old epoch is handed out, even if the reset fails
        self._taken, self._finished = 0, False
        if self._new_feed is not None:  # keys is None for an iterable dataset: tokens
            self._in_flight = 0
            self._feed, self._in_flight = self._new_feed(keys)
            keys = self._feed
        self._source._reset(keys)
        self._start()

    def _shutdown_workers(self) -> None:
        self._halt()
        self._ended = True
        self._source._shutdown_workers()


def _stop_thread(thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    if thread is not threading.current_thread():
        thread.join()


def _pin_loop(source, pin, out: queue.Queue, stop: threading.Event, device, stats) -> None:
    # As torch's _pin_memory_loop: one intra-op thread, and the main thread's accelerator.
    torch.set_num_threads(1)
    if device is not None:
        torch.accelerator.set_device_index(device)
    while not stop.is_set():
        # Items are (kind, value, tag): a batch or a worker's error answers a task, whose
        # HandOuts record is the tag; the end or the pool's own failure (a dead worker) has None.
        try:
            kind, value, tag = source._poll(_POLL)
            if kind == "none":
                continue
        except StopIteration:
            item = ("end", None, None)
        except Exception as exc:  # a dead worker, the pool's own failure: the epoch is over
            item = ("fatal", exc, None)
        else:
            if kind == "error":
                item = ("error", value, tag)
            else:
                try:
                    started = time.perf_counter()
                    item = ("batch", pin(value), tag)
                    stats.add_seconds("pin", time.perf_counter() - started)
                except Exception:
                    wrapper = ExceptionWrapper(where=f"in pin memory thread for device {device}")
                    item = ("error", _reraised(wrapper), tag)
            del value
        # The item travels in a box that the main thread empties: once it has taken a batch,
        # this thread holds nothing of it, so the user's thread is the one that lets it go
        # (a batch pinned in its slot is fenced on that thread's stream, NOTE [Pinned slots]).
        kind = item[0]
        box = [item]
        del item
        while not stop.is_set():
            try:
                out.put(box, timeout=_POLL)
                break
            except queue.Full:
                continue
        del box
        if kind == "fatal":
            source._shutdown_workers()
        if kind in ("end", "fatal"):
            return


def _reraised(wrapper: ExceptionWrapper) -> BaseException:
    try:
        wrapper.reraise()
    except BaseException as exc:
        return exc
    return RuntimeError(wrapper.exc_msg)


def slot_pinning() -> Optional[tuple]:
    """``(register, unregister, fence)`` for pinning worker processes' batches where they
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
