"""Who reads a loader's dataset in an epoch (``readers``: the main process, or ``n``
workers of a kind), and what that asks of a state: an IterableDataset's stream depends on it,
and a stateful one's place is per worker."""

from __future__ import annotations

from typing import Optional

import torch
import torch.utils.data as tud

from .. import _auto
from .._loader_record import record_of


def _says_where_it_is(dataset) -> bool:
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def stateful_iterable(dataset) -> bool:
    """An IterableDataset that says where it is (``state_dict``/``load_state_dict``)."""
    return isinstance(dataset, tud.IterableDataset) and _says_where_it_is(dataset)


def map_state_holder(dataset):
    """The map-style dataset that says where ``dataset``'s samples are (torchdata's
    convention): the state of what they draw from, such as rloader.vision's random
    augmentations. ``dataset`` itself where it says so; for a ``Subset`` (``random_split``'s)
    that does not, the dataset it selects from, which makes its samples. None where there is
    none: a module's ``state_dict`` is its weights, not a place, so a ``torch.nn.Module`` is
    not one."""
    while not isinstance(dataset, (tud.IterableDataset, torch.nn.Module)):
        if _says_where_it_is(dataset):
            return dataset
        if not isinstance(dataset, tud.Subset):
            return None
        dataset = dataset.dataset
    return None


def stateful_map(dataset) -> bool:
    """A map-style dataset whose state is saved per worker (``map_state_holder``)."""
    return map_state_holder(dataset) is not None


def state_holder(dataset):
    """What a worker's ``state_dict()`` and ``load_state_dict()`` go to for ``dataset``: a
    stateful IterableDataset itself, a map-style dataset's ``map_state_holder``."""
    return dataset if stateful_iterable(dataset) else map_state_holder(dataset)


def is_auto(loader) -> bool:
    return _auto.is_auto(loader.num_workers)


def planned_readers(loader, pending: Optional[dict]) -> tuple:
    """Who reads the dataset in the epoch that starts, with ``pending`` (a resume) if any:
    ``(num_workers, kind)``, kind "main", "process" or "thread". A fixed loader's are its
    arguments; an auto loader's are chosen as an epoch begins (``_auto.stream_readers``: an
    IterableDataset's epoch keeps one engine, and a resumed one is read by its saved readers,
    on which its stream depends)."""
    if is_auto(loader):
        return _auto.stream_readers(loader, pending)
    n = int(loader.num_workers)
    return n, (getattr(loader, "worker_type", "process") if n > 0 else "main")


def keeps_main_copy(loader, readers: tuple) -> bool:
    """Whether the loader's own copy of a stateful IterableDataset has a state to save: when
    the main process reads it, and under auto always (the main process reads it in some
    epochs, and fresh workers start as it is). Any loader given such a state loads it."""
    return stateful_iterable(loader.dataset) and (readers[0] == 0 or is_auto(loader))


def stateful_workers(loader, readers: tuple) -> bool:
    """Whether each worker's copy of the dataset has its state saved (the state after the
    last of its batches handed out) and restored in that worker: a stateful IterableDataset
    read by workers, or a stateful map-style dataset read by a fixed number of workers (under
    auto its workers' draws depend on when it switches engines)."""
    n, _kind = readers
    if n == 0:
        return False
    if stateful_map(loader.dataset):
        return not is_auto(loader)
    return stateful_iterable(loader.dataset)


def restarts_workers(loader, pending: Optional[dict] = None) -> bool:
    """Whether a resume (the pending one by default) starts workers that load their datasets'
    states first (a persistent loader's running workers are then replaced)."""
    pending = record_of(loader).pending if pending is None else pending
    if pending is None or pending.get("workers") is None:
        return False
    readers = planned_readers(loader, pending)
    saved = pending["workers"]
    # (a map-style dataset's states are those of so many workers of a kind: read by others,
    # the epoch's order is still exact, and its workers start as fresh ones do)
    same = [saved["num_workers"], saved.get("kind", "process")] == list(readers)
    return stateful_workers(loader, readers) and same


def check_workers(loader, state: dict) -> None:
    """An IterableDataset's stream depends on how many workers read it (each reads its shard),
    and a stateful one's place is per worker (each has its own copy): an epoch saved mid-way
    resumes only with the same number of workers (an auto loader reads it with them; per-worker
    places need workers of the kind that saved them)."""
    if not isinstance(loader.dataset, tud.IterableDataset):
        return
    stateful = stateful_iterable(loader.dataset)
    workers = state.get("workers") if stateful else None
    if is_auto(loader):
        saved = workers.get("kind", "process") if workers is not None else None
        wanted = getattr(loader, "worker_type", "process")
        if saved is not None and wanted not in ("auto", saved):
            kinds = {"process": "worker processes", "thread": "worker threads"}
            raise ValueError(
                f"this state holds the places of {workers['num_workers']} {kinds[saved]} "
                "over an IterableDataset with state_dict(): each one's copy has its own place "
                f"in the stream, which only {kinds[saved]} restore; build this loader with "
                f"worker_type={saved!r} or 'auto' to resume it"
            )
        return
    mid_epoch = state.get("position") is not None
    readers = state.get("readers")
    if workers is not None:
        saved = int(workers["num_workers"])
    elif mid_epoch and readers is not None:
        saved = int(readers[0])
    elif mid_epoch and stateful and "dataset" in state:
        saved = 0  # (a state saved before readers were: num_workers=0's)
    else:
        return  # between epochs, without persistent workers' places: any number goes on
    if saved != loader.num_workers:
        places = (
            ", and each worker's copy of the dataset has its own place in it, which cannot be "
            "split or merged"
            if stateful
            else ""
        )
        raise ValueError(
            f"this state was saved by a DataLoader with num_workers={saved} over an "
            "IterableDataset: its stream depends on how many workers read it (each reads its "
            f"shard){places}; build this loader with num_workers={saved} (it has "
            f"{loader.num_workers}) to resume it (a state saved between epochs without "
            "persistent_workers holds no such places)"
        )
