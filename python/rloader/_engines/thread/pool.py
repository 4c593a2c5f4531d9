"""Worker threads: ``DataLoader(..., num_workers=N, worker_type="thread")``.

N threads of this process run the fetch-and-collate loop (``rust/rloader-py/src/threads/``,
NOTE [Thread workers]) and hand their batches over as they are: the dataset exists once, no
batch is pickled or copied through shared memory, and starting a worker costs a thread, not a
process. Python's part is each thread's setup (this module's ``_ThreadWorker``) and the one
change thread workers need in torch: ``get_worker_info()`` answering per thread.

NOTE [Thread worker info]: torch's ``get_worker_info()`` returns a module global, set once in
each worker process. Thread workers share one process, so rloader keeps each thread's
``WorkerInfo`` in a ``threading.local`` (weakly: its worker holds it, NOTE [Worker slots]) and,
the first time thread workers start, makes torch's
function (the one object that ``torch.utils.data.get_worker_info``, its ``_utils.worker`` home
and ``rloader.get_worker_info`` all name, and that datasets imported long before) look there
first: it swaps the function's code for ``_per_thread_get_worker_info``'s, which reads the
thread's info and otherwise torch's global, as before. Outside thread workers it answers what
torch's answers. Loaders that do not use thread workers never make that change.

What cannot be per thread: a worker process seeds Python's ``random``, numpy's global generator
and torch's global generator with its seed; threads share those with the main thread and one
another, so rloader leaves them alone (reseeding them would change the main thread's random
streams, and their order between threads is not reproducible). Each thread's
``get_worker_info()`` has its ``seed`` (torch's per-worker seed, ``base_seed + id``),
``worker_method="thread"``, and ``rng``: its own ``random_generator`` (``random.Random``),
``torch_generator`` and ``numpy_generator``, seeded as a worker process seeds the global ones
(torch's ``WorkerInfo.rng`` fields), for random work that should be reproducible per worker.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import pickle
import random
import sys
import threading
import time
import weakref
from typing import NamedTuple, Optional

import torch
import torch.utils.data as tud
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import _DatasetKind

from ... import _compat, _resume, _rloader, _thread_info
from ..._collate import _collate_plan
from ..._pinning import policy
from ..._resume.format import snapshot
from ..._resume.readers import state_holder
from ..._seed import draw_seed
from ...sampler import iter_keys
from ..iterable_len import reported_len
from . import intra_op

__all__ = ["start_threads"]

_install_lock = threading.Lock()


def _per_thread_get_worker_info():
    # The code torch's get_worker_info() runs once thread workers have started (NOTE [Thread
    # worker info]). It runs with torch's module globals: `_worker_info` is torch's, and
    # `_rloader_thread_worker_info` is put there beside it.
    info = _rloader_thread_worker_info()  # type: ignore[name-defined]  # noqa: F821
    return _worker_info if info is None else info  # type: ignore[name-defined]  # noqa: F821


def _install_per_thread_worker_info() -> None:
    with _install_lock:
        if getattr(torch_worker, "_rloader_thread_worker_info", None) is not None:
            return
        torch_worker._rloader_thread_worker_info = _thread_info.info
        code = _per_thread_get_worker_info.__code__
        names = {"co_name": "get_worker_info"}
        if sys.version_info >= (3, 11):  # code objects have a co_qualname from 3.11
            names["co_qualname"] = "get_worker_info"
        torch_worker.get_worker_info.__code__ = code.replace(**names)


def _worker_rng(base_seed: int, worker_id: int):
    """A worker thread's own generators, seeded as a worker process seeds the global ones:
    ``random`` and torch's with ``base_seed + worker_id``, numpy's with torch's
    ``_generate_state``. In torch's ``_RNG`` container where the installed torch has it (its
    ``WorkerInfo.rng``), else one with the same fields."""
    seed = base_seed + worker_id
    try:
        import numpy as np

        numpy_generator = np.random.default_rng(torch_worker._generate_state(base_seed, worker_id))
    except ImportError:
        numpy_generator = None
    container = getattr(torch_worker, "_RNG", _RNG)
    return container(
        random_generator=random.Random(seed),
        torch_generator=torch.Generator().manual_seed(seed),
        numpy_generator=numpy_generator,
    )


class _RNG(NamedTuple):
    """``WorkerInfo.rng`` where the installed torch has no ``_RNG`` of its own."""

    random_generator: random.Random
    torch_generator: torch.Generator
    numpy_generator: Optional[object] = None


def _worker_copy(dataset):
    """The dataset as one worker thread sees it: a shallow copy (``copy.copy``), so that what a
    worker sets on its dataset (``worker_init_fn`` narrowing ``get_worker_info().dataset`` to
    its shard, as torch's documentation does) is its own, as in a worker process, while the
    data the dataset refers to exists once. A dataset that cannot be copied is shared."""
    try:
        return copy.copy(dataset)
    except Exception:
        return dataset


class _ThreadWorker:
    """One worker thread's setup, run on that thread by the Rust worker loop."""

    def __init__(
        self,
        worker_id: int,
        num_workers: int,
        base_seed: int,
        *,
        loader,
        device=None,
        worker_states: bool = False,
        dataset_state=None,
        dataset_ended: bool = False,
    ) -> None:
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.base_seed = base_seed
        self.seed = base_seed + worker_id  # torch's per-worker seed
        self.dataset = _worker_copy(loader.dataset)
        self.worker_init_fn = loader.worker_init_fn
        self.iterable = loader._dataset_kind == _DatasetKind.Iterable
        self.device = device  # pinning on this thread: the accelerator in use at iter()
        self.init_error: Optional[ExceptionWrapper] = None
        self.info: Optional[_thread_info.InfoCell] = None  # (the thread's, weakly)
        # A stateful dataset's: each batch comes with the state after it (``state``), and a
        # resumed epoch's worker loads its saved one first (NOTE [Resume]); an iterable one's
        # whose stream had ended makes nothing more this epoch.
        self.worker_states = worker_states
        self.dataset_state = dataset_state
        self.dataset_ended = dataset_ended

    def start(self):
        """Makes this thread worker ``worker_id``: its ``get_worker_info()``, then
        ``worker_init_fn`` and, for an iterable dataset, its iterator. Returns ``(the worker's
        dataset, iterator or None, the wrapped error of either or None)``: an error is the
        answer to the first task, as with worker processes."""
        self.info = _thread_info.InfoCell(
            torch_worker.WorkerInfo(
                id=self.worker_id,
                num_workers=self.num_workers,
                seed=self.seed,
                dataset=self.dataset,
                rng=_worker_rng(self.base_seed, self.worker_id),
                worker_method="thread",
            )
        )
        _thread_info.set_info(self.info)
        # One intra-op thread for this thread's torch ops, as torch gives a worker process
        # (before worker_init_fn, which may choose otherwise).
        intra_op.use_one_intra_op_thread()
        try:
            if self.device is not None:  # batches are pinned on this thread
                torch.accelerator.set_device_index(self.device)
            if self.worker_init_fn is not None:
                self.worker_init_fn(self.worker_id)
            if self.dataset_state is not None:  # a resumed epoch: where this worker was
                state_holder(self.dataset).load_state_dict(self.dataset_state)
            if not self.iterable:
                return self.dataset, None, None
            return self.dataset, iter(()) if self.dataset_ended else iter(self.dataset), None
        except Exception as exc:
            self.init_error = self.wrap_error(exc, exc.__traceback__)
            return self.dataset, None, self.init_error

    def restart(self):
        return iter(self.dataset)

    def state(self):
        """The worker's dataset's state after a batch, asked on this thread. A map-style
        dataset's is pickled (``snapshot``); an IterableDataset's is a copy taken now (through
        pickle, as a worker process sends it): one that does not pickle is that batch's error,
        as there. Only what the dataset keeps per copy is per worker (attributes it sets on
        itself; rloader.vision's generators): the threads' copies are shallow, and share
        whatever else it holds."""
        holder = state_holder(self.dataset)
        if self.iterable:
            return pickle.loads(pickle.dumps(holder.state_dict(), protocol=pickle.HIGHEST_PROTOCOL))
        return snapshot(holder)

    def start_state(self):
        """An IterableDataset's state as a persistent worker restarts it for an epoch, or as
        its stream ends (``state``'s copy), or None where it cannot be taken (a resume from
        there starts this worker as the loader's dataset)."""
        try:
            return self.state()
        except Exception:  # noqa: BLE001 - a state is an extra here: the epoch goes on
            return None

    def wrap_error(self, exc: BaseException, tb=None) -> ExceptionWrapper:
        return ExceptionWrapper(
            exc_info=(type(exc), exc, tb), where=f"in DataLoader worker thread {self.worker_id}"
        )

    def finish(self) -> None:
        _thread_info.local.__dict__.clear()


def is_async(dataset) -> bool:
    """Whether ``dataset`` is a map-style dataset whose ``__getitems__`` or ``__getitem__`` is
    a coroutine function (``async def``): its thread workers then await it (NOTE [Async
    datasets])."""
    return async_method(dataset) is not None


def async_method(dataset) -> Optional[str]:
    """The name of the method thread workers would await (``"__getitems__"`` or
    ``"__getitem__"``; ``__getitems__`` wins when present, as in torch's fetcher), or None for
    a dataset that is not async."""
    if isinstance(dataset, tud.IterableDataset):
        return None
    getitems = getattr(dataset, "__getitems__", None)
    if getitems:
        return "__getitems__" if inspect.iscoroutinefunction(getitems) else None
    getitem = getattr(dataset, "__getitem__", None)
    return "__getitem__" if inspect.iscoroutinefunction(getitem) else None


class _AsyncThreadWorker(_ThreadWorker):
    """A worker thread over an async dataset: it runs an event loop of its own.

    NOTE [Async datasets]: the main thread hands each task to the worker's loop
    (``submit``, ``loop.call_soon_threadsafe``) instead of its task channel, and every task
    runs at once as a task of that loop: its samples are awaited together (``__getitems__``
    once, or ``__getitem__`` per key under ``asyncio.gather``), then collated (and pinned) on
    the loop's thread, and the result goes back through the pool's report channel
    (``_rloader.Reporter``). The Scheduler still bounds the tasks in flight to
    ``prefetch_factor`` per worker, so up to ``prefetch_factor * batch_size * num_workers``
    samples are awaited at once. ``ThreadPool.stop`` stops the loops; a task still running
    is cancelled.
    """

    def __init__(self, *args, loader, device=None) -> None:
        super().__init__(*args, loader=loader, device=device)
        self.loop = asyncio.new_event_loop()  # made here: tasks may be submitted before it runs
        self.collate_fn = loader.collate_fn
        self.auto_collation = loader._auto_collation
        self.pin = None
        self.reporter = None
        self.stats = None  # the iterator's Stats (DataLoader.stats()), set before any task

    def run_async(self, reporter) -> None:
        """The thread's life after ``start``: runs the loop until ``stop_async``."""
        self.reporter = reporter
        getitems = getattr(self.dataset, "__getitems__", None)
        self.getitems = getitems if getitems else None
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            asyncio.set_event_loop(None)
            self.loop.close()

    def submit(self, task: int, keys) -> None:
        """Called on the main thread: hands ``task`` to this worker's loop."""
        self.loop.call_soon_threadsafe(self._begin, task, keys)

    def stop_async(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _begin(self, task: int, keys) -> None:
        if self.init_error is not None:  # the answer to the first task, as with processes
            error, self.init_error = self.init_error, None
            self.reporter.error(task, error)
            return
        self.loop.create_task(self._fetch(task, keys))

    async def _fetch(self, task: int, keys) -> None:
        try:
            started = time.perf_counter()
            if not self.auto_collation:
                data = await self.dataset[keys]
            elif self.getitems is not None:
                data = await self.getitems(keys)
            else:
                data = list(await asyncio.gather(*(self.dataset[key] for key in keys)))
            fetched = time.perf_counter()
            batch = self.collate_fn(data)
            collated = time.perf_counter()
            if self.pin is not None:
                batch = self.pin(batch)
            if self.stats is not None:  # (the samples of tasks awaited together overlap)
                self.stats.add_seconds("fetch", fetched - started)
                self.stats.add_seconds("collate", collated - fetched)
                self.stats.add_seconds("pin", time.perf_counter() - collated)
        except Exception as exc:
            self.reporter.error(task, self.wrap_error(exc, exc.__traceback__))
        else:
            self.reporter.batch(task, batch)


def start_threads(loader, buffers=None, drawn=None, resumed=None) -> "_rloader.ThreadIter":
    """Starts ``loader.num_workers`` worker threads and returns the iterator over their
    batches. The draws (the sampler's iterator, the base seed, the first tasks) are those of
    ``start_pool`` for processes, in the same order (or ``drawn`` and ``resumed``, as there).
    ``buffers(pin)``: the loader's ``BatchBuffers``, which the workers' large default-collate
    outputs reuse."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    saved_states, first_worker = None, 0
    if drawn is None:
        keys = None if iterable else iter_keys(loader._index_sampler)
        base_seed = draw_seed(loader.generator)
        epoch = _resume.epoch_of(loader)
        keys = epoch.keys(keys)  # NOTE [Resume]
        saved_states, first_worker = epoch.worker_states(), epoch.first_worker()
    else:
        keys, base_seed = drawn
        saved_states, first_worker = resumed or (None, 0)
    if loader.prefetch_factor <= 0:
        raise _compat.assertion(
            "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
        )
    pin = policy.pin_plan(loader)
    pinning = pin is not None and torch.accelerator.is_available()
    device = torch.accelerator.current_device_index() if pinning else None
    _install_per_thread_worker_info()
    n = loader.num_workers
    asynchronous = is_async(loader.dataset)
    owner = getattr(loader, "_rloader_owner", loader)  # an auto loader's engine: its loader
    worker_states = not asynchronous and _resume.stateful_workers(owner, (n, "thread"))
    saved_states = saved_states or [(None, False)] * n
    workers = []
    for w in range(n):
        if asynchronous:
            worker = _AsyncThreadWorker(w, n, base_seed, loader=loader, device=device)
            worker.pin = pin
        else:
            worker = _ThreadWorker(
                w,
                n,
                base_seed,
                loader=loader,
                device=device,
                worker_states=worker_states,
                dataset_state=saved_states[w][0],
                dataset_ended=saved_states[w][1],
            )
        workers.append(worker)
    pool = _rloader.ThreadPool(
        workers=workers,
        iterable=iterable,
        batch=_rloader.BatchOptions(
            auto_collation=loader._auto_collation,
            batch_size=loader.batch_size if iterable else None,
            drop_last=loader.drop_last,
            collate_fn=loader.collate_fn,
            collate_plan=_collate_plan(loader.collate_fn),
            pin=pin,
            # the loader's recycled batch memory (NOTE [Batch memory]), pinned with the batches
            buffers=None if buffers is None else buffers(pin),
        ),
        asynchronous=asynchronous,
    )
    try:
        it = _rloader.ThreadIter(
            pool=pool,
            prefetch_factor=loader.prefetch_factor,
            keys=keys,
            hand_out=_rloader.HandOutOptions(
                in_order=bool(loader.in_order),
                timeout=float(loader.timeout),
                persistent=bool(loader.persistent_workers),
                length_of=loader._index_sampler,
                reported_len=reported_len(loader),
                first_worker=first_worker,
            ),
        )
        it._rloader_pool = pool  # the threads behind an iterator (persistent loaders look)
        for worker in workers:
            worker.stats = it._stats
        # The threads go with the iterator, or at exit (finalize's atexit hook). The finalizer
        # holds a stopper, not the pool: held by finalize's registry, the pool would keep alive
        # a persistent loader whose dataset refers back to it (NOTE [Worker slots]); collected
        # with such a cycle, the pool stops itself (`ThreadPool.__clear__`).
        weakref.finalize(it, pool.stopper().stop)
        # (an epoch resumed between epochs draws at its first batch: NOTE [Epoch's end])
        if _resume.epoch_of(owner).draws_in_iter():
            it._prefill()
    except BaseException:
        pool.stop()
        raise
    return it
