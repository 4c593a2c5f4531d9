"""The main process's side of multi-process loading: the worker processes around the Rust pool
(``rust/rloader-py/src/process/pool.rs``), from their start to their stop.

Python's part is what only Python can do: start the processes through ``multiprocessing`` (so
``multiprocessing_context`` works and datasets travel by torch's rules), and stop them. What
runs in a worker process is ``worker``; how a batch crosses between the processes,
``wire``; how a dead worker is noticed and named, ``death``. Everything between —
assigning index batches to workers, the bound on work in flight, reordering, waiting, noticing
dead workers, and each worker's fetch-and-collate loop — runs in Rust, and batches cross
between processes through shared-memory rings and slots.

The shared memory of a pool is one anonymous region (``_rloader.PoolRegion``, a memfd): it has
no name, so nothing can be left in /dev/shm, and workers get its descriptor (inherited under
fork, passed by multiprocessing under spawn and forkserver). When a pool has stopped, its region
is kept for the same loader's next pool (``LoaderRecord.region``), so a new epoch finds its batch slots
already reserved and mapped.

NOTE [Worker shutdown]: a pool is stopped by ``_Pool.shutdown``, which is idempotent and is
called (1) by the Rust iterator when an epoch ends without persistent workers, (2) when the
iterator is garbage-collected (``weakref.finalize``), and (3) at interpreter exit (finalize's
atexit hook). It asks each worker to stop, waits up to ``_JOIN_TIMEOUT`` seconds, then
terminates and kills stragglers, and only then hands the region back to the loader. Workers
also exit on their own when the main process dies: the kernel
signals them (PR_SET_PDEATHSIG) and their wait loop checks the parent every 100 ms.

Workers are started one by one: worker 0 in ``iter()``, the others from the waits for their
answers (``_Starter``; NOTE [Staged start] in process/pool.rs says when), so the first
batch does not wait for every worker's start.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
import warnings
import weakref
from typing import Optional

from torch.utils.data.dataloader import _DatasetKind

from ... import _compat, _resume, _rloader
from ..._loader_record import record_of
from ..._pinning import cuda_host, policy
from ..._pinning.pin_thread import PinnedBatches
from ..._seed import draw_seed
from ...sampler import iter_keys
from ..iterable_len import reported_len
from .death import STATUS_LOST, ended_unseen, no_autoreaping, worker_death
from .wire import loads
from .worker import _worker_main

__all__ = ["start_pool"]

_JOIN_TIMEOUT = 5.0
_KILL_TRIES = 3  # (an interrupt while a worker is killed: it is killed again)


class _RegionFd:
    """A pool region's descriptor in a worker's spec: the int itself under fork (inherited);
    under spawn and forkserver, multiprocessing passes a duplicate with the process."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (multiprocessing.reduction.DupFd(self.fd),)


def _received_fd(dup) -> _RegionFd:
    return _RegionFd(dup.detach())


class _Pool:
    """The worker processes of one iterator, and how to stop them: what the Rust ``PoolIter``
    calls back (``_PoolHooks`` in ``_rloader.pyi``)."""

    def __init__(self, region, loader) -> None:
        self.region = region
        self.loader = weakref.ref(loader)
        self.procs: list = []
        self.stopped = False
        self.lock = threading.Lock()

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
        """``(worker_id, exit code)`` of each worker process that has ended; ``STATUS_LOST``
        for one that ended with its exit status taken elsewhere (``ended_unseen``)."""
        out = []
        for i, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                out.append((i, proc.exitcode))
            elif ended_unseen(proc):
                out.append((i, STATUS_LOST))
        return out

    def death(self, worker_id: int, code: int) -> RuntimeError:
        """The error for a worker that ended before its time (the caller raises it)."""
        return worker_death(worker_id, self.procs[worker_id].pid, code)

    def shutdown(self) -> None:
        # (The pin thread may stop the pool while the main thread starts a worker: the lock
        # makes the start either join the processes stopped here or see the pool stopped.)
        with self.lock:
            if self.stopped:
                return
            self.stopped = True
            procs = list(self.procs)
        # Closed rings tell the workers to leave (the iterator may have closed the task rings
        # already, at the end of the sampler); then they are joined.
        try:
            self.region._close_rings()
        finally:
            _stop_processes(procs)  # whatever happened, the processes go
        # Every worker is gone (joined): the region can serve the loader's next pool.
        loader = self.loader()
        if loader is not None:
            record_of(loader).region = self.region


class _Starter:
    """The workers of a pool not started yet, and how to start them (NOTE [Staged start] in
    process/pool.rs). Held by the iterator alone (the Rust ``PoolIter``, or ``PinnedBatches``),
    never by the pool, which the iterator's finalizer holds: the specs hold the dataset, which
    may refer back to the loader and its iterator, and such a cycle must stay collectable."""

    def __init__(self, pool: _Pool, context, specs: list) -> None:
        self.pool, self.context, self.pending = pool, context, specs

    def start_next(self) -> float:
        """Starts the next worker not started yet; returns the seconds its start took. A worker
        whose process exists is counted as started even if the start then raised (Ctrl-C
        after the fork), so ``procs[i]`` is always worker ``i``; one the pool was stopped
        under meanwhile is stopped too."""
        if self.pool.stopped:  # workers not started are not started now
            self.pending = []
        if not self.pending:
            return 0.0
        started = time.perf_counter()
        proc = self.context.Process(target=_worker_main, args=(self.pending[0],), daemon=True)
        try:
            proc.start()
        except (TypeError, AttributeError, pickle.PicklingError):
            text = _compat.worker_pickle_warning()  # torch's words, where it has them
            if text is not None:
                warnings.warn(text, stacklevel=2)
            raise
        finally:
            if getattr(proc, "_popen", None) is not None:  # the process exists
                self.pending.pop(0)
                with self.pool.lock:
                    late = self.pool.stopped
                    if not late:
                        self.pool.procs.append(proc)
                if late:
                    _kill_process(proc)
        return time.perf_counter() - started

    def start_all(self) -> None:
        """Starts every worker not started yet."""
        while self.pending and not self.pool.stopped:
            self.start_next()


def _stop_processes(procs: list) -> None:
    """Joins each worker (told to leave), terminating or killing one that does not. An exception
    while one is joined (Ctrl-C during the teardown) does not leave the others running: they are
    killed without waiting, then it is raised. A second one (Ctrl-C again while they are killed)
    does not cut that short either: a worker killed but not reaped would stay a zombie, and
    nothing stops a stopped pool again. Each worker's kill is tried ``_KILL_TRIES`` times."""
    interrupted: Optional[BaseException] = None
    for proc in procs:
        tries = 0
        while True:
            try:
                if interrupted is None:
                    _stop_process(proc)
                else:
                    _kill_process(proc)
                break
            except BaseException as exc:  # noqa: B036 - raised below, once every worker is gone
                if interrupted is None:
                    interrupted = exc
                tries += 1
                if tries > _KILL_TRIES:
                    break
    if interrupted is not None:
        raise interrupted


def _stop_process(proc) -> None:
    proc.join(timeout=_JOIN_TIMEOUT)
    if proc.is_alive() and not ended_unseen(proc):
        proc.terminate()
        proc.join(timeout=1.0)
    _kill_process(proc)


def _kill_process(proc) -> None:
    """Kills ``proc`` if it still runs, then reaps and closes it."""
    if getattr(proc, "_closed", False) or ended_unseen(proc):
        # (ended unseen: gone, but multiprocessing thinks it runs and would refuse to close
        # it; its pipe is closed by multiprocessing's finalizer when the Process object goes)
        return
    if proc.is_alive():
        proc.kill()
    proc.join()
    proc.close()


def start_pool(loader, drawn=None, resumed=None) -> "_rloader.PoolIter | PinnedBatches":
    """Starts ``loader.num_workers`` workers and returns the iterator over their batches.
    ``drawn``: ``(keys, base_seed)`` the caller drew for the epoch (an auto loader's engine,
    NOTE [Auto workers]), instead of this iterator's own draws; then ``resumed``, the resumed
    epoch's ``(worker_states(), first_worker())`` (NOTE [Resume]) if any."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    if drawn is None:
        keys = None if iterable else iter_keys(loader._index_sampler)
        base_seed = draw_seed(loader.generator)
        epoch = _resume.epoch_of(loader)
        keys = epoch.keys(keys)  # NOTE [Resume]
        saved_states, first_worker = epoch.worker_states(), epoch.first_worker()
    else:
        keys, base_seed = drawn
        saved_states, first_worker = resumed or (None, 0)
    owner = getattr(loader, "_rloader_owner", loader)  # an auto loader's engine: its loader
    # Workers of a stateful dataset send its state with each batch; those of a resumed epoch
    # load theirs first, and the round robin starts where it was.
    worker_states = _resume.stateful_workers(owner, (loader.num_workers, "process"))
    dataset_states = saved_states or [(None, False)] * loader.num_workers
    if loader.prefetch_factor <= 0:  # torch checks it here too: after drawing the seed
        raise _compat.assertion(
            "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
        )
    pin = policy.pin_plan(loader)
    context = loader.multiprocessing_context or multiprocessing.get_context()
    record = record_of(owner)
    region, record.region = record.region, None  # this pool's until it stops
    # The region's slots: for the deepest prefetch an auto loader may tune to in place (not
    # with pinning, whose key feed is sized on the prefetch: such a pool keeps its own).
    layout = loader.prefetch_factor
    if pin is None:
        layout = getattr(loader, "_rloader_layout_prefetch", None) or layout
    if region is None or not region.fits(loader.num_workers, layout):
        region = _rloader.PoolRegion(loader.num_workers, layout)
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
        pool = _Pool(region, owner)
        it = _rloader.PoolIter(
            region=region,
            hooks=pool,
            keys=feed if feed is not None else keys,
            auto_collation=loader._auto_collation,
            hand_out=_rloader.HandOutOptions(
                in_order=bool(loader.in_order),  # torch takes any truthy value
                # With pinning, torch times the main thread's wait for the pin thread
                # (PinnedBatches), not the pin thread's wait for the workers, which may run while
                # the user is busy.
                timeout=0.0 if pin is not None else float(loader.timeout),
                persistent=bool(loader.persistent_workers),
                # PinnedBatches has the length, and pins on a thread of its own (below)
                length_of=None if pin is not None else loader._index_sampler,
                reported_len=None if pin is not None else reported_len(loader),
                first_worker=first_worker,
            ),
            worker_states=worker_states,
        )
        it._rloader_pool = pool  # for tests and debugging: the processes behind an iterator
        if layout != loader.prefetch_factor:
            it._set_prefetch_factor(loader.prefetch_factor)  # (before the first draws)
        # The first tasks wait in the rings, so worker 0 starts on them as soon as it exists
        # (torch too queues them in iter(), but only once all its workers are started); an
        # epoch resumed between epochs draws them at its first batch (NOTE [Epoch's end]).
        if pin is not None or _resume.epoch_of(owner).draws_in_iter():
            it._prefill()
    except BaseException:
        record.region = region
        raise
    no_autoreaping()
    # From here on workers may exist: make sure they go, whatever happens.
    finalizer = weakref.finalize(it, pool.shutdown)
    starter = _Starter(
        pool,
        context,
        [
            dict(
                region_fd=_RegionFd(region.fd),
                worker_id=worker_id,
                num_workers=loader.num_workers,
                prefetch_factor=layout,  # (the region's layout)
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
            for worker_id in range(loader.num_workers)
        ],
    )
    try:
        # Worker 0 now, the others from the waits for answers (NOTE [Staged start]).
        grace = starter.start_next()
        if pin is not None and drawn < loader.num_workers:
            # Fewer tasks than workers: some would owe nothing, and the pin thread may end the
            # epoch before the main thread starts them (every worker runs, as torch's do).
            starter.start_all()
    except BaseException:
        finalizer()
        raise
    it._stage(starter, grace, pin is None)  # with pinning, PinnedBatches starts them
    if pin is not None:
        pinning = cuda_host.slot_pinning()
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
            reported_len(loader),
            stage=(starter, grace, first_worker),
        )
    return it


def _key_feed(region, auto_collation: bool, first: int):
    """What makes, for an iterator of the sampler, the KeyFeed the main thread draws keys into
    (NOTE [Key feed] in process/key_feed.rs), with its first ``first`` batches of keys drawn as torch
    draws them in ``iter()``: returns ``(feed, batches drawn)``. (It holds no loader: a
    persistent loader holds its iterator, which holds this.)"""

    def new_feed(keys):
        feed = _rloader.KeyFeed(region, keys, auto_collation, _Pool.dump_keys)
        return feed, feed.draw(first)

    return new_feed
