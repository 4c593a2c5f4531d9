"""DataLoader: torch.utils.data.DataLoader's interface over rloader's Rust loop.

``rloader.DataLoader`` is a subclass of ``torch.utils.data.DataLoader``: it takes the same
arguments, validates them the same way, and keeps them as the same plain instance attributes,
so code and frameworks that inspect a loader (``isinstance``, ``vars(loader)``, rebuilding it as
``type(loader)(**kwargs)``) treat it as torch's. What differs is where the work happens:

- ``num_workers=0``: iteration runs in ``_rloader.LoaderIter`` (``rust/rloader-py/src/single_process.rs``).
- ``num_workers>0``: worker processes started through ``multiprocessing``; task assignment,
  hand-off through shared memory and each worker's loop run in ``_rloader.PoolIter`` and
  ``_rloader.worker_loop`` (``rust/rloader-py/src/process/``,
  ``python/rloader/_engines/process/``).
- ``num_workers>0, worker_type="thread"``: worker threads of this process, in
  ``_rloader.ThreadPool``/``ThreadIter`` (``rust/rloader-py/src/threads/``,
  ``python/rloader/_engines/thread/``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable, Optional, TypeVar, Union

import torch
import torch.utils.data as tud
from torch.utils.data import get_worker_info
from torch.utils.data.dataloader import _DatasetKind

from . import _auto, _resume, _twin
from ._collate import default_collate, default_convert
from ._engines import dispatch
from ._loader_record import record_of
from .dataset import Dataset
from .sampler import (
    RandomSampler,
    Sampler,
    SequentialSampler,
    _InfiniteConstantSampler,
)

# torch.utils.data.dataloader's names (get_worker_info is torch's own function: one answer
# for both libraries' workers)
__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(tud.DataLoader[_T_co], metaclass=_twin.TorchTwin):
    """Combines a dataset and a sampler, and provides an iterable over the dataset.

    A drop-in for ``torch.utils.data.DataLoader`` (and a subclass of it): the same arguments,
    defaults, attributes, batches and exceptions. Only where the work runs differs: the
    single-process loop and each worker's fetch-and-collate loop run in Rust, and batches cross
    from workers through shared memory.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``; ``__getitems__`` is used
            to fetch a whole batch when present) or an ``IterableDataset``.
        batch_size: samples per batch (default 1); ``None`` turns off automatic batching, so
            each sample is converted by ``collate_fn`` on its own.
        shuffle: reshuffle the data every epoch (a ``RandomSampler``). Not allowed with
            ``sampler``, nor with an ``IterableDataset``.
        sampler: yields the keys (indices) to load; any iterable with ``__len__`` works.
        batch_sampler: yields lists of keys, one list per batch; excludes ``batch_size``,
            ``shuffle``, ``sampler`` and ``drop_last``.
        num_workers: workers to load with (processes, or threads with ``worker_type="thread"``);
            0 loads in the main process; ``"auto"``: the loader chooses, from what it measures,
            and keeps choosing, with the batches of any fixed number (see docs/auto.md; the
            attribute then holds an ``int`` subclass: the usable cores).
        collate_fn: merges a list of samples into a batch (default: ``default_collate``, or
            ``default_convert`` without automatic batching).
        pin_memory: return batches in page-locked memory (on a machine with an accelerator;
            elsewhere it warns and does nothing, as torch does). On CUDA, batches are pinned
            where they arrive (worker processes') or are collated (thread workers' and the
            single-process loop's large arrays and tensors), without a copy; their memory is reused
            once the events recorded on each device's current stream, when the batch is
            dropped, have completed: drop a batch after the copies that read it are queued
            on (or waited for by) the current streams, not while a side stream still reads it.
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        timeout: seconds to wait for a batch from the workers before raising (0: no limit).
        worker_init_fn: called in each worker with its id, after seeding, before loading.
        multiprocessing_context: the start method (``"fork"``, ``"spawn"``,
            ``"forkserver"``) or a context object.
        generator: the ``torch.Generator`` the random sampler and the workers' base seed are
            drawn from (torch's global RNG when ``None``).
        prefetch_factor: batches loaded ahead per worker (default 2 with workers; must be
            ``None`` without; ``"auto"``: tuned with ``num_workers="auto"``, from 2 up to 8
            within its memory budget; torch's default with a fixed count).
        persistent_workers: keep the workers alive between epochs.
        pin_memory_device: deprecated in torch; the current accelerator is used.
        in_order: hand batches out in sampler order (``False``: as they are ready).
        worker_type: ``"process"`` (default, torch's workers) or ``"thread"``: the workers are
            threads of this process, the dataset exists once, and batches are handed over
            without a copy; for I/O-bound datasets, large in-memory datasets, and a fast
            start. Datasets with ``async def __getitem__`` need it. With ``num_workers="auto"``,
            ``"auto"`` chooses from measurements. An rloader extension: see the README.

    Differences from torch: random samplers give rloader's own random orders (same
    distributions, reproducible from a seed or ``generator``); a worker's failure to hand a
    batch over (a batch that will not pickle, say) is raised as that batch's error instead of
    being dropped. See the README for the rest.
    """

    def __init__(
        self,
        dataset: Dataset[_T_co],
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[Sampler, Iterable, None] = None,
        batch_sampler: Union[Sampler[list], Iterable[list], None] = None,
        num_workers: Union[int, str] = 0,
        collate_fn: Optional[Callable[[list], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context=None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Union[int, str, None] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_type: str = "process",
    ) -> None:
        _check_count("num_workers", num_workers)
        if _auto.is_auto(num_workers):  # NOTE [Auto workers]
            num_workers = _auto.AutoWorkers(num_workers if isinstance(num_workers, int) else None)
        _check_worker_type(worker_type, multiprocessing_context, num_workers)
        if _auto.is_auto(prefetch_factor):
            # tuned under num_workers="auto"; torch's default with a fixed count
            if isinstance(num_workers, _auto.AutoWorkers):
                prefetch_factor = _auto.AutoPrefetch()
            else:
                prefetch_factor = None if num_workers == 0 else _auto.policy.PREFETCH
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None:
            _check_count("prefetch_factor", prefetch_factor)
            if prefetch_factor < 0:
                raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context  # validated by torch's setter
        self.in_order = in_order
        self.worker_type = worker_type

        # Iterable-style datasets choose their own order: reject sampler options first, so
        # users don't fix a sampler only to learn it can't be used here.
        if isinstance(dataset, tud.IterableDataset):
            self._dataset_kind = _DatasetKind.Iterable
            if shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, "
                    f"but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler "
                    f"option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = _DatasetKind.Map

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )

        if sampler is None:
            if self._dataset_kind == _DatasetKind.Iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
        if batch_size is not None and batch_sampler is None:
            # torch's own class, as torch makes it: frameworks that rebuild loaders
            # (Lightning) check its exact type. rloader still cuts its batches in Rust
            # (sampler.iter_keys).
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        # From here on torch's __setattr__ guards batch_size, sampler, dataset, ...
        self._DataLoader__initialized = True
        self._IterableDataset_len_called = None
        self._iterator = None
        if worker_type == "process" and not _auto.is_auto(num_workers):
            # (torch's warning counts processes against CPU cores; auto stays within them)
            self.check_worker_number_rationality()

    def __setattr__(self, attr, val):
        if attr == "num_workers" and _auto.is_auto(val) and not isinstance(val, _auto.AutoWorkers):
            val = _auto.AutoWorkers()  # set after the loader was made: the attribute auto holds
        super().__setattr__(attr, val)

    def _get_iterator(self):
        if _auto.is_auto(self.num_workers):
            _check_worker_type(self.worker_type, self.multiprocessing_context, self.num_workers)
            dispatch.refuse_unawaited(self, auto=True)
            return _auto.start(self, dispatch.engine, _resume.epoch_of)
        if self.num_workers > 0:
            # (checked again: both may have been set after the loader was made)
            _check_worker_type(self.worker_type, self.multiprocessing_context, self.num_workers)
        return dispatch.start(self)

    def __iter__(self):
        _check_count("num_workers", self.num_workers)  # (it may have been set after __init__)
        persistent = self.persistent_workers and (
            _auto.is_auto(self.num_workers) or self.num_workers > 0
        )
        if persistent and self._iterator is not None and _resume.restarts_workers(self):
            self._iterator._shutdown_workers()  # a resume's workers start from saved states
        fresh = not persistent or self._iterator is None or self._iterator._rloader_pool.stopped
        epoch = _resume.Epoch.begin(self, draws_base_seed=fresh)  # NOTE [Resume]
        try:
            if persistent:
                if fresh:
                    # (workers stopped by an error, a dead one say, are started anew)
                    self._iterator = self._get_iterator()
                else:
                    dispatch.reset(self._iterator, self)
                it = self._iterator
            else:
                it = self._get_iterator()
        finally:
            epoch.end_window()
        epoch.bind(it)
        record_of(self).stats = it._stats
        return it

    def stats(self) -> Optional[dict]:
        """Where the latest epoch's time went, in seconds, so you can tell whether the loader
        is your bottleneck: ``waiting_for_data_s`` (your loop inside ``next()``, waiting for a
        batch) against ``waiting_for_user_s`` (your loop's own work between batches), and the
        loader's stages where they ran: ``fetch_s`` (your dataset), ``collate_s``,
        ``transport_s`` (taking batches in from worker processes), ``pin_s``; with
        ``batches``, the number handed out. Where rloader.vision made samples, ``decode_s``
        and ``transform_s``: the part of ``fetch_s`` spent decoding and transforming them. Workers' stages (threads or processes) are summed
        over the workers. Thread workers add ``worker_cpu_s``: the CPU time their threads spent
        making batches (each thread's own clock; not an async dataset's). With ``num_workers="auto"``, ``auto`` says what was chosen, when
        and why (docs/auto.md). None before the first ``iter()``. An rloader extension."""
        stats = record_of(self).stats
        return None if stats is None else stats.as_dict()

    def state_dict(self) -> dict:
        """Where this loader is: a small dict of plain values (``torch.save`` and
        ``torch.load(weights_only=True)`` round-trip it) that ``load_state_dict`` resumes from.

        It may be taken at any time: before ``iter()``, between batches, after an epoch. Mid-epoch
        it holds the random generators' states at the epoch's start and which batches were
        handed out since (batches workers loaded ahead are not counted: they come again after a
        resume; out of order, the few not handed out below the last one are named), and for an
        IterableDataset with ``state_dict()`` its state, or each worker's. An extension of
        torch's DataLoader, with torchdata ``StatefulDataLoader``'s method names.
        """
        return _resume.state_dict(self)

    def load_state_dict(self, state) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` yields exactly the batches the saved
        loader had not handed out yet, then later epochs are those of an uninterrupted run. A
        state saved once every batch of an epoch was handed out resumes into the next epoch.

        Build the loader with the same arguments (``num_workers`` may differ, but not for an
        IterableDataset saved mid-epoch, whose stream depends on how many workers read it, nor
        for one whose workers' states were saved: a ``ValueError``; ``num_workers="auto"``
        reads such an epoch with the saved count). The saved order
        travels in the state, whatever generator this loader has. ``state`` may also be a list
        of the states of every rank of a job over a ``DistributedSampler``: the samples of that
        epoch no rank handed out are then shared by this job's ranks (see the README).
        """
        _resume.check(self, state)  # a TypeError or ValueError naming the bad field
        _resume.load_state_dict(self, state)


def _check_count(name: str, value) -> None:
    """Refuses a str other than ``"auto"`` where rloader takes an int or ``"auto"``: torch's
    exception type (its comparison with 0 raises a TypeError), in words that name what is
    accepted."""
    if isinstance(value, str) and not _auto.is_auto(value):
        raise TypeError(
            f"{name} must be an int or 'auto' (the loader chooses; docs/auto.md), "
            f"but got {name}={value!r}"
        )


def _check_worker_type(worker_type, multiprocessing_context, num_workers) -> None:
    if worker_type == _auto.AUTO and not _auto.is_auto(num_workers):
        raise ValueError(
            "worker_type='auto' chooses between processes and threads from measurements, as "
            "num_workers='auto' chooses their number: use it with num_workers='auto', or "
            "choose worker_type='process' or 'thread'"
        )
    if worker_type not in ("process", "thread", _auto.AUTO):
        raise ValueError(
            "worker_type must be 'process' or 'thread' (or 'auto', with num_workers='auto'), "
            f"but got worker_type={worker_type!r}"
        )
    if worker_type == "thread" and multiprocessing_context is not None:
        raise ValueError(
            "multiprocessing_context chooses how worker processes start, and "
            "worker_type='thread' starts none: its workers are threads of this process. "
            "Drop multiprocessing_context, or use worker_type='process'."
        )


_twin.pair((DataLoader, tud.DataLoader))
