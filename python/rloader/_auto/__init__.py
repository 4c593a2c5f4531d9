"""``num_workers="auto"``: the loader chooses its workers' number (and, with
``worker_type="auto"``, their kind) from what it measures, and keeps choosing.

NOTE [Auto workers]: what the user sees is a fixed loader's stream; only the engines behind it
change.

- One stream. ``iter()`` makes the epoch's draws as a fixed loader does, once (``start``). The
  epoch's keys are one ``Source``; each engine (the single-process loop, a process pool or a
  thread pool) draws through a share of its own (``keys.py``). To change the pool the
  iterator closes the current engine's share and starts the next engine on a new share;
  engines hand out in start order, each to its end, so the batches, their order and contents
  are a fixed loader's. Where the old and new pool together would exceed the memory budget,
  the old one is drained first (``Engine.drain``).
- Seeds. The base seed is drawn once per iterator and every pool of it starts its workers
  with it: worker ``i`` of any pool gets ``base_seed + i`` and ``worker_init_fn(i)``.
- Decisions (``decisions.py``) are pure functions of a ``Window`` of measurements
  (``policy.py``, with the numbers they decide by; ``measure.py`` reads /proc and the
  clocks): the consumer's time per batch outside and inside ``next()``, the loader's work per
  batch and its own CPU share (``window.py``: ``Tally``; its thread's CPU time, its waits for
  a core left out, so that other processes do not make it read as waiting). Windows are long
  enough for hysteresis (at least ``2 × workers × prefetch_factor`` batches and
  ``LONG_STEPS`` of the consumer's longest step), begin once a new pool has handed out its
  first round, and turning back needs a window twice as long. Bounds: the usable cores, the
  memory budget (``RLOADER_AUTO_MAX_MEMORY``, else half of MemAvailable, against each
  worker's measured PSS), and the work left in the epoch (no pool whose start the rest of the
  epoch, or the next epochs, would not win back). A pool no faster than the main process
  goes back to it, and that is remembered for its kind.
- Kind (``worker_type="auto"``, ``kind.py``, with the GIL probe's session in
  ``gil_probe.py``): processes for loading that holds the GIL or its CPU; threads first
  otherwise, judged against the main process and, where short of their promise, against an
  epoch of processes. The kind changes only between epochs.
- Between epochs the loader's record keeps what was learned (``learned.py``: ``Learned``):
  the next epoch starts on the last chosen pool at once; with ``persistent_workers`` the last
  pool itself is kept. ``state_dict()`` saves the choice (``learned_state``).
- An ``IterableDataset`` shards by worker id and count, so its epoch keeps one engine: the
  first epoch runs in the main process and measures; each later epoch starts with the count
  the previous one asked for.
- ``prefetch_factor="auto"`` (``prefetch.py``): batches ahead, doubled in place where the
  consumer waits though the workers keep up on average.

Imports run downward: ``iterator`` over ``decisions``, ``kind``, ``gil_probe``, ``prefetch``,
``window``, ``engines``, ``keys``; all over ``learned``, ``options``, ``policy`` (pure) and
``measure``. The loader's modules (``_resume``, the engines) reach auto only through
``options`` and ``learned``.
"""

from .iterator import AutoIter, start
from .learned import learned_of, learned_state, seed_learned, stream_readers
from .options import AUTO, AutoPrefetch, AutoWorkers, is_auto

__all__ = [
    "AUTO",
    "AutoIter",
    "AutoPrefetch",
    "AutoWorkers",
    "is_auto",
    "learned_of",
    "learned_state",
    "seed_learned",
    "start",
    "stream_readers",
]
