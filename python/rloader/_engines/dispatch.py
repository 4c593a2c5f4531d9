"""Which engine makes a loader's batches: the main process, worker threads or worker
processes (``start``); one engine of an auto loader (``engine``); a persistent iterator's next
epoch (``reset``); an async dataset no engine but threads can load (``refuse_unawaited``)."""

from __future__ import annotations

import operator

from torch.utils.data.dataloader import _DatasetKind

from .. import _resume
from .._collate import _collate_plan
from ..sampler import iter_keys
from . import single_process
from .batch_memory import batch_buffers
from .iterable_len import reported_len
from .process import pool as process_pool
from .thread import pool as thread_pool


def start(loader):
    """The iterator of a loader with a fixed ``num_workers`` (its ``worker_type`` checked by
    the caller)."""
    if loader.num_workers == 0:
        refuse_unawaited(loader)
        return single_process.start(loader)
    if loader.worker_type == "thread":
        operator.index(loader.num_workers)  # torch's TypeError for 2.5 workers, as in range()
        return thread_pool.start_threads(loader, buffers=lambda pin: batch_buffers(loader, pin))
    loader.check_worker_number_rationality()
    # torch's TypeError for 2.5 workers, where torch meets it (range(), once it has warned)
    operator.index(loader.num_workers)
    refuse_unawaited(loader)
    return process_pool.start_pool(loader)


def refuse_unawaited(loader, auto: bool = False) -> None:
    """Refuses a map-style dataset with an ``async def __getitem__`` (or ``__getitems__``) in
    an engine that calls it as torch does (the main process, worker processes; ``auto``: an
    auto loader, which starts in the main process) with ``default_collate``, which would fail
    on its coroutines: torch's TypeError, saying that thread workers await them (NOTE [Async
    datasets]). Checked once per ``iter()``, before any sample is asked for, so no coroutine
    is left unawaited. Another ``collate_fn`` gets the coroutines, as in torch."""
    if not loader._auto_collation or _collate_plan(loader.collate_fn) is None:
        return
    method = thread_pool.async_method(loader.dataset)
    if method is None:
        return
    where = (
        "num_workers='auto' starts in the main process"
        if auto
        else "num_workers=0 calls it in the main process"
        if loader.num_workers == 0
        else "worker processes call it"
    )
    raise TypeError(
        f"{type(loader.dataset).__name__}.{method} is 'async def': only thread workers await "
        f"it, and {where}, so default_collate would be given coroutines. Use "
        "worker_type='thread' with a fixed num_workers > 0 (docs/threads.md, Async datasets)."
    )


def engine(view, keys, base_seed: int, kind: str):
    """One engine of an auto loader's iterator (NOTE [Auto workers] in _auto/__init__.py):
    ``view`` is the loader with the engine's ``num_workers`` and options; ``keys`` its segment
    of the epoch's keys and ``base_seed`` the epoch's, both drawn by the auto iterator. An
    IterableDataset's epoch has one engine: a resumed one's goes on where the saved one was
    (NOTE [Resume])."""
    loader = view._loader
    epoch = _resume.epoch_of(loader) if view._dataset_kind == _DatasetKind.Iterable else None
    if view.num_workers == 0:
        return single_process.loader_iter(
            view, keys, exhausted=epoch is not None and epoch.stream_ended
        )
    resumed = (epoch.worker_states(), epoch.first_worker()) if epoch is not None else None
    if kind == "thread":
        return thread_pool.start_threads(
            view,
            buffers=lambda pin: batch_buffers(loader, pin),
            drawn=(keys, base_seed),
            resumed=resumed,
        )
    return process_pool.start_pool(view, drawn=(keys, base_seed), resumed=resumed)


def reset(it, loader) -> None:
    """A new epoch on persistent workers (``it._reset``, whichever engine it is)."""
    iterable = loader._dataset_kind == _DatasetKind.Iterable
    keys = None if iterable else iter_keys(loader._index_sampler)
    it._reset(_resume.epoch_of(loader).keys(keys), reported_len(loader))
