"""The pin_memory thread of worker processes: ``PinnedBatches`` (NOTE [Pin thread])."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any

import torch
from torch._utils import ExceptionWrapper

from .. import _rloader

__all__ = ["PinnedBatches"]

# How often a waiting pin thread looks at its stop flag (torch checks every 5 s; shorter here
# because stopping it is how an abandoned iterator shuts its workers down).
_POLL = 0.1
# How long the main thread waits for the pin thread between two worker starts (NOTE [Staged
# start] in process/pool.rs).
_START_YIELD = 0.002


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
    thread draws the keys of the tasks the thread sends into ``feed`` (NOTE [Key feed] in
    process/key_feed.rs), keeping torch's account of the tasks in flight. Every other use of ``source``
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
        stage=(None, 0.0, 0),
    ) -> None:
        self._source = source
        # NOTE [Staged start] (process/pool.rs), from this thread: the pin thread waits for
        # the answers, and the main thread starts the workers not started yet (the pool's
        # ``_Starter``; the grace the first wait gives the started ones; the worker whose
        # batch comes first).
        self._starter, self._grace, self._first_worker = stage
        self._grace_until: "float | None" = None
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
        # What reached the user, recorded here as it does (handout/handouts.rs: the thread only polls).
        self._handouts = source._handouts
        self._start()

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(1)
        self._stop = threading.Event()
        self._ended = False
        device = (
            torch.accelerator.current_device_index() if torch.accelerator.is_available() else None
        )
        # The record of a batch the thread took and was stopped holding (``_unheld``).
        self._unsent: list = []
        self._thread = threading.Thread(
            target=_pin_loop,
            args=(
                self._source,
                self._pin,
                self._queue,
                self._stop,
                device,
                self._stats,
                self._unsent,
            ),
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
            if self._starter is not None and self._starter.pending and self._queue.empty():
                # (a batch waiting is handed out first)
                if self._start_workers():
                    # The queue is looked at between two starts, for long enough to let the
                    # pin thread have the GIL (a start holds it throughout: back to back, they
                    # would starve it). A start is not counted (torch's clock runs once all
                    # are started).
                    wait = min(wait, _START_YIELD)
                    if deadline is not None:
                        deadline = time.monotonic() + self._timeout
                elif self._grace_until is not None:
                    wait = min(wait, max(0.0, self._grace_until - time.monotonic()))
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

    def _start_workers(self) -> bool:
        """Starts the next worker if the batch awaited is a worker's not started yet, or once
        the started ones had their grace (``_grace_until``); whether it started one."""
        starter = self._starter
        if starter.pool.stopped:
            return False
        started = len(starter.pool.procs)
        # Tasks go round the workers in order: the batch awaited is this worker's (but for
        # iterable datasets whose workers ended: then the grace decides).
        awaited = (self._first_worker + self._taken) % (started + len(starter.pending))
        now = time.monotonic()
        if self._grace_until is None:
            self._grace_until = now + self._grace
        if awaited < started and now < self._grace_until:
            return False
        self._starting(starter.start_next)
        return True

    def _starting(self, start) -> None:
        """``start()`` a worker or more; a failure stops the pool, but for Ctrl-C, after which
        the iterator goes on as after Ctrl-C in any wait (``PoolIter.start_next`` likewise)."""
        try:
            start()
        except KeyboardInterrupt:
            raise
        except BaseException:
            self._shutdown_workers()
            raise

    @property
    def _progress(self) -> tuple:
        """(batches handed out this epoch, whether it ended), as ``PoolIter._progress``."""
        return (self._taken, self._finished)

    def _halt(self) -> None:
        """Stops the thread (again, if need be): afterwards ``source`` is free to use."""
        _stop_thread(self._thread, self._stop)
        self._finalizer.detach()

    def _unheld(self) -> list:
        """With the thread stopped: the records (``HandOuts.record``'s) of the batches it took
        that were not handed out, oldest first; the batches are dropped. The next epoch's
        workers go on from their dataset states (``PoolIter._reset``'s ``pinned``)."""
        tags = []
        while True:
            try:
                _, _, tag = self._queue.get_nowait().pop()
            except queue.Empty:
                break
            if tag is not None:
                tags.append(tag)
        tags += self._unsent
        self._unsent.clear()
        return tags

    def _reset(self, keys, reported_len=None) -> None:
        """A new epoch on persistent workers."""
        self._len_warning = _len_warning(reported_len)
        self._halt()
        pinned = self._unheld()
        self._ended = True  # nothing of the old epoch is handed out, even if the reset fails
        if self._starter is not None:
            self._starting(self._starter.start_all)  # the old epoch's answers are drained below
        self._taken, self._finished = 0, False
        if self._new_feed is not None:  # keys is None for an iterable dataset: tokens
            self._in_flight = 0
            self._feed, self._in_flight = self._new_feed(keys)
            keys = self._feed
        self._source._reset(keys, pinned=pinned)
        self._start()

    def _shutdown_workers(self) -> None:
        self._halt()
        self._ended = True
        self._source._shutdown_workers()


def _stop_thread(thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    if thread is not threading.current_thread():
        thread.join()


def _pin_loop(
    source, pin, out: queue.Queue, stop: threading.Event, device, stats, unsent: list
) -> None:
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
        kind, tag = item[0], item[2]
        box = [item]
        del item
        put = False
        while not put and not stop.is_set():
            try:
                out.put(box, timeout=_POLL)
                put = True
            except queue.Full:
                continue
        if not put and tag is not None:
            unsent.append(tag)  # stopped holding it (PinnedBatches._unheld)
        del box, tag
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
