"""Multi-process loading: worker processes around the Rust pool (``rust/rloader-py/src/process/``).

Python's part is what only Python can do: start the processes through ``multiprocessing`` (so
``multiprocessing_context`` works and datasets travel by torch's rules), seed each worker and
run ``worker_init_fn`` exactly as torch does, turn batches into bytes and back, and stop the
processes. Everything between — assigning index batches to workers, the bound on work in
flight, reordering, waiting, noticing dead workers, and each worker's fetch-and-collate loop —
runs in Rust, and batches cross between processes through shared-memory rings and slots.

The shared memory of a pool is one anonymous region (``_rloader.PoolRegion``, a memfd): it has
no name, so nothing can be left in /dev/shm, and workers get its descriptor (inherited under
fork, passed by multiprocessing under spawn and forkserver). When a pool has stopped, its region
is kept for the same loader's next pool (``_REGIONS``), so a new epoch finds its batch slots
already reserved and mapped.

NOTE [Worker shutdown]: a pool is stopped by ``_Pool.shutdown``, which is idempotent and is
called (1) by the Rust iterator when an epoch ends without persistent workers, (2) when the
iterator is garbage-collected (``weakref.finalize``), and (3) at interpreter exit (finalize's
atexit hook). It asks each worker to stop, waits up to ``_JOIN_TIMEOUT`` seconds, then
terminates and kills stragglers, and only then hands the region back to the loader. Workers
also exit on their own when the main process dies: the kernel
signals them (PR_SET_PDEATHSIG) and their wait loop checks the parent every 100 ms.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import signal
import sys
import threading
import traceback
import weakref
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import _DatasetKind

from . import _compat, _pin, _resume, _rloader
from ._collate import _collate_plan
from ._pin import PinnedBatches
from ._seed import draw_seed
from .sampler import iter_keys

# Each worker seeds numpy's global generator, as torch's do. numpy 2 imports numpy.random only
# when it is first used, and in each new worker that import delayed the first batch; imported
# once now, forked workers start with it (CHANGELOG.md has the figures).
try:
    import numpy.random  # noqa: F401
except ImportError:
    pass

__all__ = ["start_pool"]

_JOIN_TIMEOUT = 5.0


# ---------------------------------------------------------------- batches as bytes


def _rebuild_tensor(buffer, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    # As torch's own rebuild of a tensor a worker sent (torch._utils._rebuild_tensor): set_ onto
    # the storage, so the batch is no view (`_base` None) and its `_version` is torch's.
    if len(buffer) == 0:
        storage = torch.UntypedStorage(0)
    else:
        storage = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()
    return torch.empty((0,), dtype=dtype, device="cpu").set_(storage, 0, shape)


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
                flat = obj.contiguous().reshape(-1).view(torch.uint8)
                data = flat.numpy()
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


# ---------------------------------------------------------------- the worker process


def _stack_lines_without_source(f=None, limit=None) -> list:
    """``traceback.format_stack``'s lines, less the source text, which costs a file read each
    (and without folding repeated recursive frames)."""
    if limit is None:
        limit = getattr(sys, "tracebacklimit", None)
    if f is None:
        f = sys._getframe().f_back  # the caller's frame, as format_stack starts from
    frames = []
    while f is not None:
        frames.append((f.f_code, f.f_lineno))
        f = f.f_back
    frames.reverse()
    if limit is not None:
        frames = frames[len(frames) - limit :] if limit >= 0 else frames[:-limit]
    return [
        f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n'
        for code, lineno in frames
    ]


def _manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``, without reading source files.

    torch.manual_seed queues the accelerator seeding for a lazy initialization that may never
    come, keeping ``traceback.format_stack()`` of each queued call for the error message if it
    fails. In a new worker none of the stack's source files is in ``linecache`` yet, and reading
    them slowed every worker's start (CHANGELOG.md has the figures). Each stack is kept with files, lines and
    functions, without the source text. The swap lasts for this one call, before
    ``worker_init_fn`` and the worker's first fetch; under fork the worker has no other Python
    thread, and under spawn only one the dataset's unpickling started could see it.
    """
    format_stack = traceback.format_stack
    traceback.format_stack = _stack_lines_without_source
    try:
        torch.manual_seed(seed)
    finally:
        traceback.format_stack = format_stack


def _worker_main(spec: dict) -> None:
    """Entry point of a worker process."""
    worker_id = spec["worker_id"]
    # The main process handles Ctrl-C; a worker leaves when told to or when its parent dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # As torch's workers: a segfault, bus error or FPE prints what happened before the default
    # action ends the process (and replaces a faulthandler inherited from the parent).
    signal_handling._set_worker_signal_handlers()
    torch.set_num_threads(1)
    seed = spec["base_seed"] + worker_id
    random.seed(seed)
    _manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(torch_worker._generate_state(spec["base_seed"], worker_id))
    except ImportError:
        pass
    dataset = spec["dataset"]
    # torch.utils.data.get_worker_info() (and rloader's, the same function) reads this.
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=spec["num_workers"], seed=seed, dataset=dataset
    )
    init_error = None
    samples = None
    try:
        if spec["worker_init_fn"] is not None:
            spec["worker_init_fn"](worker_id)
        if spec["dataset_state"] is not None:  # a resumed epoch: where this worker was
            dataset.load_state_dict(spec["dataset_state"])
        if spec["iterable"]:
            # (a worker whose stream had ended makes nothing more this epoch)
            samples = iter(()) if spec["dataset_ended"] else iter(dataset)
    except Exception as exc:  # reported with the first task, as torch does
        init_error = dump_error(worker_id, exc)
    # The spec, with what this process made of it (WorkerSpec, rloader-py's process/worker.rs).
    _rloader.worker_loop(
        dict(
            spec,
            region_fd=spec["region_fd"].fd,
            samples=samples,
            collate_plan=_collate_plan(spec["collate_fn"]),
            init_error=init_error,
            hooks=_WorkerHooks(worker_id, dataset, spec["worker_states"]),
        )
    )


class _WorkerHooks:
    """What the Rust worker loop calls back for."""

    def __init__(self, worker_id: int, dataset, worker_states: bool) -> None:
        self.worker_id = worker_id
        self.dataset = dataset
        self.worker_states = worker_states

    def dumps(self, batch, ended: bool = False):
        """A batch as bytes; with ``worker_states`` (an IterableDataset with ``state_dict``)
        paired with ``(the dataset's state right after making it, whether its iterator ended
        making it)``, which the main process keeps once the batch is handed out
        (``_Pool.loads``; NOTE [Resume]). A state that will not pickle is that batch's error."""
        if self.worker_states:
            return dumps((batch, (self.dataset.state_dict(), ended)))
        return dumps(batch)

    def dump_state(self) -> bytes:
        """The dataset's state, pickled, as a new epoch of persistent workers starts or as the
        stream ends (empty without ``worker_states``, or if ``state_dict()`` fails: the state
        is then not known there, and a resume from that point starts the worker as the
        loader's dataset)."""
        if not self.worker_states:
            return b""
        try:
            return pickle.dumps(self.dataset.state_dict())
        except Exception:
            return b""

    def dump_error(self, exc: BaseException, traceback=None) -> bytes:
        return dump_error(self.worker_id, exc, traceback)

    def restart(self):
        return iter(self.dataset)

    def load_keys(self, data: bytes):
        return pickle.loads(data)


# ---------------------------------------------------------------- the main process


# The exit code given for a worker whose exit status was taken by someone else.
_STATUS_LOST = -(2**31)


def _ended_unseen(proc) -> bool:
    """The worker process has ended, but its exit status is gone: with SIGCHLD ignored the
    kernel reaps children itself (or another part of the program reaped it), so
    multiprocessing, whose ``waitpid`` fails, reports it running forever. Its sentinel, a pipe
    the child held open, says it has ended."""
    if proc.exitcode is not None:
        return False
    try:
        return bool(multiprocessing.connection.wait([proc.sentinel], 0))
    except (OSError, ValueError):
        return False


def _no_autoreaping() -> None:
    """Gives SIGCHLD its default action back if it is ignored, as torch's iterators do (they
    install their SIGCHLD handler over it): ignored, the kernel reaps the workers and their
    exit status, which the error for a dead worker reports, is lost. Only the main thread can
    set a handler; elsewhere the status stays lost and ``_ended_unseen`` notices the exit."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):  # no SIGCHLD here, or not settable
        pass


def _torch_exit_text(pid: int, code: int) -> str:
    """What torch's SIGCHLD handler says of a worker that ended with ``code`` (a negative code:
    killed by that signal), or "" for code 0, of which torch says nothing more."""
    if code == _STATUS_LOST:
        return (
            f"DataLoader worker (pid {pid}) exited unexpectedly; how it ended is lost: its "
            "exit status was taken elsewhere in this process (SIGCHLD is ignored and the "
            "loader runs outside the main thread, or some code reaps child processes)."
        )
    if code < 0:
        text = f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-code)}. "
        if -code == signal.SIGBUS:
            text += (
                "It is possible that dataloader's workers are out of shared memory. "
                "Please try to raise your shared memory limit."
            )
        return text
    if code > 0:
        return (
            f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. "
            "Details are lost due to multiprocessing. Rerunning with num_workers=0 may give "
            "better error trace."
        )
    return ""


def worker_death(worker_id: int, pid: int, code: int) -> RuntimeError:
    """The error for a worker that ended before its time, in torch's words: torch's
    ``DataLoader worker (pid(s) N) exited unexpectedly``, caused by the error torch's SIGCHLD
    handler raises for that exit (``... is killed by signal: Segmentation fault. ``), to which
    rloader adds which worker it was and what to try."""
    detail = _torch_exit_text(pid, code)
    hint = (
        f"(rloader: that was worker {worker_id}. If it was killed for memory, use fewer workers "
        "or a smaller batch_size/prefetch_factor; a crash points at the dataset's or "
        "collate_fn's code.)"
    )
    if not detail:
        detail = f"DataLoader worker (pid {pid}) exited with code 0 before it answered."
    error = RuntimeError(f"DataLoader worker (pid(s) {pid}) exited unexpectedly")
    error.__cause__ = RuntimeError(f"{detail} {hint}")
    return error


class _RegionFd:
    """A pool region's descriptor in a worker's spec: the int itself under fork (inherited);
    under spawn and forkserver, multiprocessing passes a duplicate with the process."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (multiprocessing.reduction.DupFd(self.fd),)


def _received_fd(dup) -> _RegionFd:
    return _RegionFd(dup.detach())


# Each loader's idle region, for its next pool (see the module's docstring).
_REGIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Pool:
    """The worker processes of one iterator, and how to stop them."""

    def __init__(self, region, loader) -> None:
        self.region = region
        self.loader = weakref.ref(loader)
        self.procs: list = []
        self.stopped = False

    # With worker_states, what a worker's ``dumps`` sent is ``(batch, its dataset's state)``:
    # PoolIter splits the pair and keeps the state for when the batch is handed out.
    loads = staticmethod(loads)

    def load_error(self, data: bytes):
        return pickle.loads(data)

    def load_state(self, data: bytes):
        """A worker's dataset state as it restarted or ended (``_WorkerHooks.dump_state``)."""
        return pickle.loads(data)

    @staticmethod
    def dump_keys(keys) -> bytes:
        return pickle.dumps(keys, protocol=5)

    def exited(self) -> list:
        """``(worker_id, exit code)`` of each worker process that has ended; ``_STATUS_LOST``
        for one that ended with its exit status taken elsewhere (``_ended_unseen``)."""
        out = []
        for i, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                out.append((i, proc.exitcode))
            elif _ended_unseen(proc):
                out.append((i, _STATUS_LOST))
        return out

    def death(self, worker_id: int, code: int) -> RuntimeError:
        """The error for a worker that ended before its time (the caller raises it)."""
        return worker_death(worker_id, self.procs[worker_id].pid, code)

    def shutdown(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        # Closed rings tell the workers to leave (the iterator may have closed the task rings
        # already, at the end of the sampler); then they are joined.
        try:
            self.region._close_rings()
        finally:
            _stop_processes(self.procs)  # whatever happened, the processes go
        # Every worker is gone (joined): the region can serve the loader's next pool.
        loader = self.loader()
        if loader is not None:
            _REGIONS[loader] = self.region


def _stop_processes(procs: list) -> None:
    for proc in procs:
        proc.join(timeout=_JOIN_TIMEOUT)
        if _ended_unseen(proc):
            # Gone, but multiprocessing thinks it runs: it would refuse to close it. Its pipe
            # is closed by multiprocessing's finalizer when the Process object goes.
            continue
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        proc.close()


def start_pool(loader) -> "_rloader.PoolIter | PinnedBatches":
    """Starts ``loader.num_workers`` workers and returns the iterator over their batches."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    base_seed = draw_seed(loader.generator)
    epoch = _resume.epoch_of(loader)
    keys = epoch.keys(keys)  # NOTE [Resume]
    # Workers of a stateful IterableDataset send its state with each batch; those of a resumed
    # epoch load theirs first, and the round robin starts where it was.
    worker_states = iterable and _resume.stateful_iterable(loader.dataset)
    dataset_states = epoch.worker_states() or [(None, False)] * loader.num_workers
    if loader.prefetch_factor <= 0:  # torch checks it here too: after drawing the seed
        raise _compat.assertion(
            "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
        )
    pin = _pin.pin_plan(loader)
    context = loader.multiprocessing_context or multiprocessing.get_context()
    region = _REGIONS.pop(loader, None)
    if region is None or not region.fits(loader.num_workers, loader.prefetch_factor):
        region = _rloader.PoolRegion(loader.num_workers, loader.prefetch_factor)
    try:  # the sampler's first draws may fail: then the region serves the next pool still
        new_feed = feed = None
        drawn = 0
        if pin is not None:
            # The pin thread sends the tasks; the main thread draws their keys, or for an iterable
            # dataset their tokens (NOTE [Key feed]).
            new_feed = _key_feed(
                region, loader._auto_collation, loader.prefetch_factor * loader.num_workers
            )
            feed, drawn = new_feed(keys)
        pool = _Pool(region, loader)
        it = _rloader.PoolIter(
            region=region,
            in_order=bool(loader.in_order),  # torch takes any truthy value
            keys=feed if feed is not None else keys,
            auto_collation=loader._auto_collation,
            # With pinning, torch times the main thread's wait for the pin thread (PinnedBatches),
            # not the pin thread's wait for the workers, which may run while the user is busy.
            timeout=0.0 if pin is not None else float(loader.timeout),
            persistent=bool(loader.persistent_workers),
            pin=None,  # pinned on a thread of its own (below)
            length_of=None if pin is not None else loader._index_sampler,  # PinnedBatches has it
            hooks=pool,
            reported_len=None if pin is not None else _reported_len(loader),
            worker_states=worker_states,
            first_worker=epoch.first_worker(),
        )
        it._rloader_pool = pool  # for tests and debugging: the processes behind an iterator
        # The first tasks wait in the rings, so worker 0 starts on them as soon as it exists
        # (torch too queues them in iter(), but only once all its workers are started).
        it._prefill()
    except BaseException:
        _REGIONS[loader] = region
        raise
    _no_autoreaping()
    # From here on workers may exist: make sure they go, whatever happens.
    finalizer = weakref.finalize(it, pool.shutdown)
    try:
        for worker_id in range(loader.num_workers):
            spec = dict(
                region_fd=_RegionFd(region.fd),
                worker_id=worker_id,
                num_workers=loader.num_workers,
                prefetch_factor=loader.prefetch_factor,
                base_seed=base_seed,
                dataset=loader.dataset,
                iterable=iterable,
                auto_collation=loader._auto_collation,
                batch_size=loader.batch_size,
                drop_last=loader.drop_last,
                collate_fn=loader.collate_fn,
                worker_init_fn=loader.worker_init_fn,
                parent_pid=os.getpid(),
                worker_states=worker_states,
                dataset_state=dataset_states[worker_id][0],
                dataset_ended=dataset_states[worker_id][1],
            )
            proc = context.Process(target=_worker_main, args=(spec,), daemon=True)
            proc.start()
            pool.procs.append(proc)
    except BaseException:
        finalizer()
        raise
    if pin is not None:
        pinning = _pin.slot_pinning()
        if pinning is not None:  # batches are pinned where the workers write them
            it._pin_slots(*pinning)
        return PinnedBatches(
            it,
            pin,
            loader._index_sampler,
            loader.timeout,
            feed,
            drawn,
            new_feed,
            _reported_len(loader),
        )
    return it


def _key_feed(region, auto_collation: bool, first: int):
    """What makes, for an iterator of the sampler, the KeyFeed the main thread draws keys into
    (NOTE [Key feed]), with its first ``first`` batches of keys drawn as torch
    draws them in ``iter()``: returns ``(feed, batches drawn)``. (It holds no loader: a
    persistent loader holds its iterator, which holds this.)"""

    def new_feed(keys):
        feed = _rloader.KeyFeed(region, keys, auto_collation, _Pool.dump_keys)
        return feed, feed.draw(first)

    return new_feed


def _reported_len(loader):
    """``(dataset, len(loader))`` when ``len()`` of a loader over an IterableDataset was asked:
    torch warns once more batches than that are handed out."""
    if loader._IterableDataset_len_called is None:
        return None
    return (loader.dataset, loader._IterableDataset_len_called)


def reset_pool(it, loader) -> None:
    """A new epoch on persistent workers."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    it._reset(_resume.epoch_of(loader).keys(keys), _reported_len(loader))
