# Type stub for the native module `rloader._rloader`, built from rust/rloader-py/src/.
# Keep it in step with the Rust signatures: `make lint` checks it against the built module
# with `python -m mypy.stubtest rloader._rloader`.

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from types import TracebackType
from typing import Any, NoReturn, Protocol, final

# In registration order, as PyO3 builds it.
__all__ = [
    "__version__",
    "IndexChunks",
    "BatchStream",
    "KeySegment",
    "LengthWarning",
    "BatchOptions",
    "LoaderIter",
    "sequential",
    "random_indices",
    "subset_indices",
    "weighted_indices",
    "permutation",
    "distributed_indices",
    "distributed_stream",
    "distributed_sizes",
    "fast_collate",
    "_split_stacks",
    "HandOutOptions",
    "PoolIter",
    "HandOuts",
    "KeyFeed",
    "Message",
    "PoolRegion",
    "worker_loop",
    "PoolStopper",
    "ThreadPool",
    "ThreadIter",
    "Reporter",
    "Stats",
    "GilProbe",
    "SlotView",
    "Lease",
    "PooledView",
    "BatchBuffers",
    "slot_empty",
    "in_slot_worker",
    "batch_empty",
    "SharedList",
    "SharedArray",
    "SharedDict",
    "SharedIter",
    "_attach_shared",
    "EncodedImage",
    "SampleSteps",
    "vision_open",
    "vision_open_many",
    "vision_run_many",
    "vision_convert",
    "vision_pillow_13_passes",
    "SamplePool",
]

__version__: str

# ---- What the Rust side calls back: objects of rloader's Python side, by their methods.
# Each Protocol names the Python class that implements it; Rust calls each method positionally
# (hence the `/`), and an exception a callback raises is that operation's error.

class _WrappedError(Protocol):
    """torch's ``ExceptionWrapper``: an error caught where a batch was made (a worker, a
    thread, the pin thread), raised again where the batch is handed out."""

    def reraise(self) -> NoReturn: ...

class _PoolHooks(Protocol):
    """``rloader._engines.process.pool._Pool``: the Python side of a ``PoolIter`` (process/pool.rs), the main
    process's end of the worker processes."""

    def dump_keys(self, keys: Any, /) -> bytes:
        """A batch of keys that are not plain indices, pickled for a task."""
    def loads(
        self,
        message: Message,
        lease: Lease | None,
        pickle_range: tuple[int, int],
        buffers: list[tuple[bool, int, int]],
        /,
    ) -> Any:
        """The batch a DATA message carries (``rloader._engines.process.wire.loads``): the pickle is
        ``message[start:end]``; each out-of-band buffer ``(in_slot, start, end)`` is bytes of the
        slot ``lease`` holds, or of the message. With ``worker_states``: ``(batch, state)``."""
    def load_error(self, data: bytes, /) -> _WrappedError:
        """A worker's error (an ERROR message's body, ``rloader._engines.process.wire.dump_error``'s)."""
    def load_state(self, data: bytes, /) -> Any:
        """A worker's dataset state (a RESUMED or ENDED message's body)."""
    def exited(self) -> list[tuple[int, int]]:
        """``(worker_id, exit code)`` of each worker process that has ended."""
    def death(self, worker_id: int, code: int, /) -> BaseException:
        """The error for a worker that ended before its time (Rust raises it)."""
    def shutdown(self) -> None:
        """Stops the workers (idempotent; NOTE [Worker shutdown])."""

class _Starter(Protocol):
    """``rloader._engines.process.pool._Starter``: the workers of a pool not started yet."""

    pending: list[Any]
    def start_next(self) -> float:
        """Starts the next one (NOTE [Staged start]); returns the seconds it took."""

class _WorkerHooks(Protocol):
    """``rloader._engines.process.worker._WorkerHooks``: what ``worker_loop`` (process/worker.rs) asks of
    Python in a worker process."""

    def dumps(self, batch: Any, ended: bool, /) -> tuple[bytes, list[Any]]:
        """A batch as pickle bytes and its out-of-band buffers (``rloader._engines.process.wire.dumps``);
        ``ended``: the dataset's iterator ended making it."""
    def dump_error(self, exc: BaseException, traceback: TracebackType | None, /) -> bytes:
        """An error of the dataset or collate_fn, pickled in torch's ExceptionWrapper."""
    def dump_state(self) -> bytes:
        """The worker's dataset state, pickled (empty when it has none)."""
    def restart(self) -> Iterable[Any]:
        """A persistent worker's iterable dataset, for a new epoch."""
    def load_keys(self, data: bytes, /) -> Any:
        """A task's keys that ``_PoolHooks.dump_keys`` pickled."""

class _ThreadWorker(Protocol):
    """``rloader._engines.thread.pool._ThreadWorker``: one worker thread's setup, run on that thread by
    ``ThreadPool`` (threads/pool.rs)."""

    def start(self) -> tuple[Any, Iterator[Any] | None, _WrappedError | None]:
        """(the worker's dataset, its iterator for an iterable dataset, the error of
        ``worker_init_fn`` or ``iter(dataset)``: the answer to the first task)."""
    def restart(self) -> Iterable[Any]:
        """A persistent worker's iterable dataset, for a new epoch."""
    def wrap_error(self, exc: BaseException, traceback: TracebackType | None, /) -> _WrappedError:
        """An error of the dataset or collate_fn, as the worker's answer."""
    def finish(self) -> None:
        """The thread is leaving: its worker info goes."""

class _AsyncThreadWorker(_ThreadWorker, Protocol):
    """``rloader._engines.thread.pool._AsyncThreadWorker``: a worker thread over an async dataset, which
    runs an event loop (NOTE [Async datasets])."""

    def run_async(self, reporter: Reporter, /) -> None:
        """The thread's life after ``start``: runs the loop until ``stop_async``."""
    def stop_async(self) -> None: ...
    def submit(self, task: int, keys: Any, /) -> None:
        """Called on the main thread: hands a task to the worker's loop."""

class _HostRegister(Protocol):
    """Pins ``length`` bytes at ``addr`` for the accelerator (``cudaHostRegister``), or
    raises: batches are then copied into pinned memory (``rloader._pinning.cuda_host``)."""

    def __call__(self, addr: int, length: int, /) -> object: ...

class _HostUnregister(Protocol):
    """Undoes ``_HostRegister`` for the range starting at ``addr``."""

    def __call__(self, addr: int, /) -> object: ...

class _Fence(Protocol):
    """Events recorded on the streams of every device in use when a pinned batch was dropped:
    its memory is written again only once they have completed."""

    def query(self) -> bool: ...
    def synchronize(self) -> None: ...

class _RecordFence(Protocol):
    """Records a ``_Fence`` now, on the calling thread's current streams."""

    def __call__(self) -> _Fence: ...

# sampling/streams.rs

@final
class IndexChunks:
    """A sampler's indices as lists of up to 8192 ints."""

    @staticmethod
    def lazy(factory: Callable[[], IndexChunks]) -> IndexChunks: ...
    def __iter__(self) -> IndexChunks: ...
    def __next__(self) -> list[int]: ...

@final
class BatchStream:
    """Batches of indices: what ``BatchSampler.__iter__`` returns."""

    @staticmethod
    def from_indices(chunks: IndexChunks, batch_size: int, drop_last: bool) -> BatchStream: ...
    @staticmethod
    def from_iterable(iterable: Iterable[Any], batch_size: int, drop_last: bool) -> BatchStream: ...
    def skip(self, batches: int, keep: list[int] = ...) -> None:
        """Discards the next ``batches`` batches as if handed out (NOTE [Resume])."""
    @property
    def exhausted(self) -> bool:
        """Whether the stream has ended (a draw found no batch left)."""
    def __iter__(self) -> BatchStream: ...
    def __next__(self) -> list[Any]: ...

@final
class KeySegment:
    """One engine's share of an auto loader's ``BatchStream`` (NOTE [Auto workers])."""

    def __new__(cls, stream: BatchStream) -> KeySegment: ...
    def close(self) -> None:
        """Ends this share: it draws nothing more."""
    @property
    def closed(self) -> bool: ...
    def __iter__(self) -> KeySegment: ...
    def __next__(self) -> list[Any]: ...

# single_process.rs (BatchOptions: fetch.rs)

# A default collate's plan: `CollatePlan` in rloader._collate, which holds the fast path's rule.
class _CollatePlan(Protocol):
    @property
    def general(self) -> Callable[[Any], Any]: ...
    def fast_path_may_run(self) -> bool: ...

@final
class BatchOptions:
    """How each batch is made (``LoaderIter``, ``ThreadPool``): collation, batching of an
    iterable dataset, pinning, and the loader's recycled batch memory."""

    def __new__(
        cls,
        *,
        auto_collation: bool,
        batch_size: int | None,
        drop_last: bool,
        collate_fn: Callable[[Any], Any],
        collate_plan: _CollatePlan | None,
        pin: Callable[[Any], Any] | None,
        buffers: BatchBuffers | None = None,
    ) -> BatchOptions: ...

@final
class LoaderIter:
    """The iterator ``iter(DataLoader(..., num_workers=0))`` returns."""

    def __new__(
        cls,
        *,
        dataset: Any,
        keys: Iterable[Any] | None,
        batch: BatchOptions,
        length_of: Sized,
        reported_len: int | None,
        exhausted: bool = False,
    ) -> LoaderIter: ...
    @property
    def _progress(self) -> tuple[int, bool]:
        """(batches handed out this epoch, whether the epoch ended)."""
    @property
    def _stats(self) -> Stats: ...
    @property
    def _exhausted(self) -> bool:
        """Whether an iterable dataset's iterator has ended."""
    def __iter__(self) -> LoaderIter: ...
    def __len__(self) -> int: ...
    def __next__(self) -> Any: ...

# sampling/samplers.rs

def sequential(n: int) -> IndexChunks: ...
def random_indices(n: int, num_samples: int, replacement: bool, seed: int) -> IndexChunks: ...
def subset_indices(indices: list[int], seed: int) -> IndexChunks: ...

# `weights`: any object exporting a contiguous float64 buffer (WeightedRandomSampler passes a
# float64 numpy array; numpy's stubs only declare `__buffer__` for Python 3.12+, so not `Buffer`).
def weighted_indices(
    weights: Any, num_samples: int, replacement: bool, seed: int
) -> IndexChunks: ...
def permutation(n: int, seed: int) -> list[int]: ...
def distributed_indices(
    n: int,
    num_replicas: int,
    rank: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    num_samples: int,
) -> list[int]: ...
def distributed_stream(
    n: int,
    num_replicas: int,
    rank: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    num_samples: int,
) -> IndexChunks: ...
def distributed_sizes(n: int, num_replicas: int, drop_last: bool) -> tuple[int, int]:
    """DistributedSampler's ``(num_samples, total_size)``, as torch computes them."""

# collate/

def fast_collate(batch: Any) -> Any | None:
    """The collated batch, or None when the general path must run."""

def _split_stacks() -> int:
    """How many batches this process stacked with helper threads (NOTE [Stack helpers])."""

# memory/export.rs

@final
class Message:
    """A received message, exported through the buffer protocol."""

    def __len__(self) -> int: ...
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...
        def __release_buffer__(self, buffer: memoryview, /) -> None: ...

# handout/length_warning.rs

@final
class LengthWarning:
    def __new__(cls, dataset: Any, reported: int, workers: bool) -> LengthWarning: ...
    def yielded(self) -> None: ...

# handout/options.rs

@final
class HandOutOptions:
    """How a multi-worker iterator (``PoolIter``, ``ThreadIter``) hands its batches out."""

    def __new__(
        cls,
        *,
        in_order: bool,
        timeout: float,
        persistent: bool,
        length_of: Sized | None,
        reported_len: tuple[Any, int] | None = None,
        first_worker: int = 0,
    ) -> HandOutOptions: ...

# process/pool.rs

@final
class PoolIter:
    """The iterator ``iter(DataLoader(..., num_workers>0))`` returns."""

    # rloader._engines.process.pool.start_pool sets it (its _Pool); None until then.
    _rloader_pool: _PoolHooks | None
    def _pin_slots(
        self,
        register: _HostRegister,
        unregister: _HostUnregister,
        fence: _RecordFence,
    ) -> None:
        """From now on, batches arriving in slots are pinned there (NOTE [Pinned slots])."""
    def __new__(
        cls,
        *,
        region: PoolRegion,
        hooks: _PoolHooks,
        keys: Iterable[Any] | KeyFeed | None,
        auto_collation: bool,
        hand_out: HandOutOptions,
        worker_states: bool = False,
    ) -> PoolIter: ...
    @property
    def _transport_counts(self) -> tuple[int, int]:
        """(tensor buffers received in shared-memory slots, received inline and copied)."""
    @property
    def _progress(self) -> tuple[int, bool]:
        """(batches handed out this epoch, whether the epoch ended)."""
    @property
    def _stats(self) -> Stats: ...
    @property
    def _handouts(self) -> HandOuts:
        """What ``__next__`` handed out this epoch."""
    def __iter__(self) -> PoolIter: ...
    def __len__(self) -> int: ...
    def __next__(self) -> Any: ...
    def _reset(
        self,
        keys: Iterable[Any] | KeyFeed | None,
        reported_len: tuple[Any, int] | None = None,
        pinned: list[tuple[int, int, tuple[Any, bool] | None]] | None = None,
    ) -> None: ...
    def _shutdown_workers(self) -> None: ...
    def _prefill(self) -> None: ...
    def _set_prefetch_factor(self, prefetch_factor: int) -> None: ...
    def _stage(self, starter: _Starter, grace: float, starts: bool = True) -> None: ...
    def _poll(self, wait: float) -> tuple[str, Any, tuple[int, int, Any] | None]: ...

# handout/handouts.rs

@final
class HandOuts:
    """What a multi-process iterator handed out this epoch (for DataLoader.state_dict())."""

    def record(self, task: int, worker: int, state: Any = None) -> None: ...
    @property
    def tasks(self) -> tuple[int, list[int]]:
        """(end, holes): every task below end was handed out but those in holes."""
    @property
    def count(self) -> int: ...
    @property
    def states(self) -> list[Any]: ...
    @property
    def said(self) -> list[bool]: ...
    @property
    def ended(self) -> list[bool]: ...
    @property
    def end_states(self) -> list[Any]: ...
    @property
    def last_worker(self) -> int | None: ...

# threads/ (Stats: stats.rs)

@final
class ThreadPool:
    """The worker threads of one iterator (worker_type="thread")."""

    def __new__(
        cls,
        *,
        workers: list[_ThreadWorker] | list[_AsyncThreadWorker],
        iterable: bool,
        batch: BatchOptions,
        asynchronous: bool = False,
    ) -> ThreadPool: ...
    @property
    def stopped(self) -> bool: ...
    def stop(self) -> None: ...
    def stopper(self) -> PoolStopper: ...

@final
class PoolStopper:
    """Stops a ThreadPool's threads without holding the pool (its iterator's finalizer)."""

    def stop(self) -> None: ...

@final
class Stats:
    """Where an epoch's time went (DataLoader.stats())."""

    def __new__(cls) -> Stats: ...
    def as_dict(self) -> dict[str, Any]: ...
    def add_seconds(self, stage: str, seconds: float) -> None: ...
    def next_called(self) -> None: ...
    def next_returned(self, batch: bool) -> None: ...
    def clear(self) -> None: ...

@final
class GilProbe:
    """How much of the main process's loading a second thread could not take the GIL."""

    def __new__(cls, period_s: float) -> GilProbe: ...
    def loading(self, loading: bool) -> None: ...
    def share(self) -> tuple[float, float, float]: ...
    def stop(self) -> None: ...

@final
class Reporter:
    """How an async worker's event loop reports a task's result."""

    def batch(self, task: int, batch: Any) -> bool: ...
    def error(self, task: int, wrapper: _WrappedError) -> bool: ...

@final
class ThreadIter:
    """The iterator ``iter(DataLoader(..., num_workers>0, worker_type="thread"))`` returns."""

    # rloader._engines.thread.pool.start_threads sets it (its ThreadPool); None until then.
    _rloader_pool: ThreadPool | None
    _first_batch_grace: float
    def __new__(
        cls,
        *,
        pool: ThreadPool,
        prefetch_factor: int,
        keys: Iterable[Any] | None,
        hand_out: HandOutOptions,
    ) -> ThreadIter: ...
    @property
    def _progress(self) -> tuple[int, bool]:
        """(batches handed out this epoch, whether the epoch ended)."""
    def _prefill(self) -> None: ...
    def _set_prefetch_factor(self, prefetch_factor: int) -> None: ...
    @property
    def _stats(self) -> Stats: ...
    @property
    def _handouts(self) -> HandOuts:
        """What ``__next__`` handed out this epoch."""
    def __iter__(self) -> ThreadIter: ...
    def __len__(self) -> int: ...
    def __next__(self) -> Any: ...
    def _reset(
        self, keys: Iterable[Any] | None, reported_len: tuple[Any, int] | None = None
    ) -> None: ...

# process/key_feed.rs

@final
class KeyFeed:
    """Keys drawn from the sampler on one thread for a PoolIter polled on another."""

    def __new__(
        cls,
        region: PoolRegion,
        keys: Iterable[Any] | None,
        auto_collation: bool,
        dump_keys: Callable[[Any], bytes],
    ) -> KeyFeed: ...
    def draw(self, n: int) -> int:
        """Draws up to ``n`` batches of keys on the calling thread; returns how many it drew."""
    def end(self) -> None:
        """Ends the feed: no task is sent after the keys already drawn."""

# process/worker.rs

# `spec` holds (other keys are ignored): region_fd (int), worker_id, num_workers,
# prefetch_factor (ints), dataset, iterable (bool), samples (an iterator or None),
# auto_collation, batch_size (int or None), drop_last, collate_fn, collate_plan
# (_CollatePlan or None), init_error (bytes or None), parent_pid (int), hooks (_WorkerHooks).
def worker_loop(spec: Mapping[str, Any]) -> None:
    """A worker process's loop: take tasks, fetch and collate, send answers, until told to stop."""

# process/region.rs

@final
class PoolRegion:
    """The shared memory of a loader's worker pools (an anonymous memfd)."""

    def __new__(cls, num_workers: int, prefetch_factor: int) -> PoolRegion: ...
    @property
    def fd(self) -> int:
        """The descriptor workers map the region through."""
    def fits(self, num_workers: int, prefetch_factor: int) -> bool:
        """Whether a pool of this shape can use the region."""
    def _close_rings(self) -> None:
        """Closes the pool's rings, so that its workers leave (how every pool is stopped)."""
    @property
    def _pinned_counts(self) -> tuple[int, int] | None:
        """(slots waiting for the device, slots registered), or None (for tests)."""
    @property
    def _span(self) -> tuple[int, int]:
        """(address, length) of the region in this process (for tests)."""

# memory/slots.rs (SlotView, Lease), memory/batch_buffers.rs (PooledView, BatchBuffers)

@final
class SlotView:
    """Bytes of a slot, exported through the buffer protocol (writable)."""

    def __len__(self) -> int: ...
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...
        def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class PooledView:
    """A block of recycled batch memory, exported through the buffer protocol (writable)."""

    def __len__(self) -> int: ...
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...
        def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class BatchBuffers:
    """A loader's recycled batch memory, kept across its epochs."""

    def __new__(cls) -> BatchBuffers: ...
    @property
    def free_blocks(self) -> int:
        """Blocks kept free for the next batches (some may wait for the device)."""
    def _pin_blocks(
        self,
        register: _HostRegister,
        unregister: _HostUnregister,
        fence: _RecordFence,
    ) -> None:
        """From now on, blocks are registered with the accelerator's driver when first taken
        and reused once the fence recorded when their batch is dropped has completed."""
    @property
    def _pinned(self) -> bool:
        """Whether blocks are pinned (``_pin_blocks`` was called)."""

@final
class Lease:
    """The main process's hold on one worker slot: the bytes of one batch's tensors."""

    def __len__(self) -> int: ...
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...
        def __release_buffer__(self, buffer: memoryview, /) -> None: ...

# memory/slots.rs

# `dtype`: a torch.dtype. None when this thread has no slot to allocate from.
def slot_empty(shape: list[int], dtype: Any) -> Any | None:
    """An uninitialised tensor of `shape` and `dtype` in the current slot, or None."""

def in_slot_worker() -> bool: ...

# memory/stacking.rs

def batch_empty(shape: list[int], dtype: Any) -> Any | None:
    """A tensor where the default collate will collate the batch being fetched (lent to a
    `__getitems__` of rloader's loops with the default collate), or None."""

# shared/ (rloader.shared: containers in shared memory, one copy per node)

@final
class SharedList:
    """A read-only list of ``str`` or ``bytes`` whose data lives once in shared memory."""

    def __new__(
        cls, items: Iterable[str] | Iterable[bytes], *, key: str | None = None
    ) -> SharedList: ...
    @staticmethod
    def attach(
        key: str,
        *,
        version: str | int,
        build: Callable[[], Iterable[str] | Iterable[bytes]] | None = None,
    ) -> SharedList: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def take(self, indices: Any) -> list[Any]: ...
    def __iter__(self) -> SharedIter: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    @property
    def key(self) -> str | None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def _inode(self) -> int: ...

@final
class SharedArray:
    """A read-only numeric array whose data lives once in shared memory."""

    def __new__(cls, data: Any, *, key: str | None = None) -> SharedArray: ...
    @staticmethod
    def attach(
        key: str, *, version: str | int, build: Callable[[], Any] | None = None
    ) -> SharedArray: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: Any, /) -> Any: ...
    def take(self, indices: Any) -> Any: ...
    def numpy(self) -> Any: ...
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any: ...
    def __iter__(self) -> SharedIter: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def dtype(self) -> Any: ...
    @property
    def key(self) -> str | None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def _inode(self) -> int: ...

@final
class SharedDict:
    """A read-only mapping of ``str`` to ``int`` whose data lives once in shared memory."""

    def __new__(
        cls, mapping: Mapping[str, int] | Iterable[tuple[str, int]], *, key: str | None = None
    ) -> SharedDict: ...
    @staticmethod
    def attach(
        key: str, *, version: str | int, build: Callable[[], Mapping[str, int]] | None = None
    ) -> SharedDict: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: Any, /) -> int: ...
    def __contains__(self, key: Any, /) -> bool: ...
    def get(self, key: Any, default: Any = None) -> Any: ...
    def take(self, keys: Iterable[Any]) -> list[int]: ...
    def keys(self) -> list[str]: ...
    def values(self) -> list[int]: ...
    def items(self) -> list[tuple[str, int]]: ...
    def __iter__(self) -> SharedIter: ...
    def __reduce__(self) -> tuple[Any, ...]: ...
    @property
    def key(self) -> str | None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def _inode(self) -> int: ...

@final
class SharedIter:
    """The iterator of a shared container (a ``SharedDict``'s: over its keys)."""

    def __iter__(self) -> SharedIter: ...
    def __next__(self) -> Any: ...

def _attach_shared(family: str, name: bytes, hash: bytes, key: str | None) -> Any:
    """Unpickles a shared container's handle: attaches to the copy this node serves."""

@final
class EncodedImage:
    """A JPEG or PNG file's bytes and header (rloader.vision), read without the GIL."""

    @property
    def size(self) -> tuple[int, int]: ...
    @property
    def format(self) -> str: ...
    def steps(self, scale_denom: int, steps: list[tuple[Any, ...]]) -> SampleSteps:
        """``steps`` parsed once for this image decoded at ``1/scale_denom``, with their output
        size: what ``run`` and ``vision_run_many`` take."""
    def run(
        self,
        steps: SampleSteps,
        out_ptr: int,
        out_len: int,
        table: bytes | None = None,
        elem: int = 0,
        channels: int = 0,
        *,
        draft: bool = False,
    ) -> bool:
        """Decodes at ``steps``' scale, runs them and writes the result at ``out_ptr`` without
        the GIL; False where the decoder failed or warned (Pillow decides that file).
        ``draft``: a JPEG may decode at 1/2, 1/4 or 1/8 where the steps reduce it anyway
        (close, not exact; same size)."""

@final
class SampleSteps:
    """A sample's steps parsed for one image size and scale (``EncodedImage.steps``)."""

    @property
    def size(self) -> tuple[int, int]:
        """The output's (width, height)."""

def vision_open(path: str | os.PathLike[str]) -> tuple[EncodedImage | None, str | None]:
    """Reads a file and its header without the GIL: the image, or None and why Pillow must
    decode it."""

def vision_open_many(
    paths: list[str | os.PathLike[str]],
) -> list[tuple[EncodedImage | None, str | None]]:
    """`vision_open` for each path, the GIL released once for them all."""

def vision_run_many(
    images: list[EncodedImage],
    steps: list[SampleSteps],
    outs: list[tuple[int, int]],
    table: bytes | None = None,
    elem: int = 0,
    channels: int = 0,
    *,
    draft: bool = False,
) -> int:
    """`EncodedImage.run` for each image and its steps into its `(out_ptr, out_len)`, the GIL
    released once; stops at the first that failed or warned: how many were written."""

def vision_convert(
    rgb: bytes,
    width: int,
    height: int,
    out_ptr: int,
    out_len: int,
    table: bytes,
    elem: int,
    channels: int,
) -> None:
    """An RGB image's bytes written at `out_ptr` as CHW through `table`, without the GIL."""

def vision_pillow_13_passes(on: bool) -> None:
    """Which order of resampling passes to reproduce: Pillow 13's (True) or older Pillow's."""

@final
class SamplePool:
    """Recycled memory for rloader.vision's sample tensors."""

    def __new__(cls, max_free: int) -> SamplePool: ...
    def empty(self, shape: list[int], dtype: Any, nbytes: int) -> Any:
        """An uninitialized contiguous tensor over a block that returns when it is gone."""
