"""What rloader keeps for each DataLoader across its epochs: one ``LoaderRecord`` per loader.

The records live beside their loaders, in a ``WeakKeyDictionary`` keyed by the loader, not in
the loader's ``__dict__``, for three reasons:

- A loader pickles as torch's does, after iteration too: the record holds objects that do
  not pickle or must not travel (a memfd, the Rust iterators' Stats, a weak reference to the
  latest iterator).
- ``copy.copy(loader)`` and ``copy.deepcopy(loader)`` make a loader with a record of its own
  (a new, empty one): two loaders sharing a region would start two pools on one piece of
  shared memory, and one's ``load_state_dict()`` would resume the other. Frameworks that
  rebuild a loader as ``type(loader)(**kwargs)`` (Lightning) likewise get a new record.
- The record never keeps its loader alive; it goes with the loader (nothing in it may hold the
  loader strongly, or the entry would live forever).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

__all__ = ["LoaderRecord", "record_of"]


class LoaderRecord:
    """One loader's state between and across its epochs."""

    __slots__ = ("auto", "buffers", "epoch", "pending", "region", "stats")

    def __init__(self) -> None:
        # The latest iter()'s ``_resume.Epoch`` (NOTE [Resume]).
        self.epoch: Any = None
        # A resume that ``load_state_dict()`` left for the next iter() (a plan dict).
        self.pending: Optional[dict] = None
        # The latest epoch's ``_rloader.Stats`` (``DataLoader.stats()``).
        self.stats: Any = None
        # The recycled batch memory, kept across epochs so that a new epoch's batches reuse the
        # last one's pages (``_rloader.BatchBuffers``; NOTE [Batch memory] in
        # rust/rloader-memory/src/lib.rs); freed with the loader.
        self.buffers: Any = None
        # The worker processes' shared memory (``_rloader.PoolRegion``) while no pool uses it:
        # the next pool finds its batch slots already reserved and mapped (_engines/process/pool.py).
        self.region: Any = None
        # What num_workers="auto" learned in earlier epochs (``_auto.Learned``).
        self.auto: Any = None


_RECORDS: "weakref.WeakKeyDictionary[Any, LoaderRecord]" = weakref.WeakKeyDictionary()


def record_of(loader) -> LoaderRecord:
    """``loader``'s record (a new, empty one the first time)."""
    record = _RECORDS.get(loader)
    if record is None:
        record = _RECORDS[loader] = LoaderRecord()
    return record
