"""One ``iter()`` of a loader as resume sees it (``Epoch``): the generator states before its
draws, the pending resume it applies, and what its iterator has handed out (NOTE [Resume])."""

from __future__ import annotations

import itertools
import pickle
import warnings
import weakref
from typing import Any, Optional

import torch
import torch.utils.data as tud

from .._loader_record import record_of
from .._seed import draw_seed
from ..sampler import iter_keys
from .format import drawing_sampler, generators_of, pack, sampler_state, set_generators
from .readers import planned_readers, restarts_workers, stateful_iterable, stateful_workers


def epoch_of(loader) -> "Epoch":
    """The epoch ``iter(loader)`` is starting (``Epoch.begin`` made it)."""
    return record_of(loader).epoch


class Epoch:
    """One ``iter()`` of a loader: the generator states before its draws, and the iterator."""

    def __init__(self, loader, readers: tuple) -> None:
        self.generators = {role: pack(gen) for role, gen in generators_of(loader).items()}
        self.sampler = sampler_state(drawing_sampler(loader))
        self.iterable = isinstance(loader.dataset, tud.IterableDataset)
        self.readers = readers  # who reads the dataset (``readers``)
        # Whether iter() itself pulls the sampler's first keys (workers get tasks in iter()).
        self.pulls_in_iter = loader.num_workers > 0
        # Workers whose copies of the dataset say where they are: their states are saved.
        self.stateful_workers = readers[0] if stateful_workers(loader, readers) else 0
        # Of a resumed epoch: the batches (in draw order) below `skipped` handed out before the
        # checkpoint but `holes`, and the saved workers' states ("workers" of state_dict()).
        self.skipped = 0
        self.holes: list = []
        self.workers: Optional[dict] = None
        # Persistent workers' states at the end of the previous epoch, if saved: those of a
        # worker that has handed out nothing in this one yet.
        self.carried: Optional[list] = None
        self._iterator: Optional[weakref.ref] = None
        self.elastic_from: Optional[list] = None
        self._plan: Optional[dict] = None
        self._borrowed: Optional[torch.Tensor] = None
        # Resumed between epochs where only one of the saving loader's next iter() and this one
        # draws a base seed (persistent workers): the generator before this one's draw, to put
        # back after it, or "draw" to draw the seed the saving loader would have.
        self._base_fix: Any = None
        self._applied: set = set()
        self._loader: Any = None
        self.restored_stream = False
        self.stream_ended = False  # a restored stream that had ended: nothing more comes
        self.base_drawn = True
        # Resumed between epochs: the sampler's first draw waits for the first batch (see
        # ``draws_in_iter``), so a set_epoch() between iter() and that batch is this epoch's.
        self._draws_later = False

    @classmethod
    def begin(cls, loader, draws_base_seed: bool) -> "Epoch":
        """Starts an ``iter()`` (which draws the workers' base seed unless it resets persistent
        workers): records the states, and applies a pending resume."""
        record = record_of(loader)
        pending, record.pending = record.pending, None
        if pending is not None and _every_batch_handed_out(loader, pending):
            try:
                pending = _after_the_end(loader, pending)  # NOTE [Epoch's end]
            except BaseException:
                record.pending = pending  # (a sampler that failed: the resume waits still)
                raise
        readers = planned_readers(loader, pending)
        workers = between = None
        if pending is not None and pending["position"] is None:
            set_generators(loader, pending["generators"], borrow_global=False)  # between epochs
            saved = pending["sampler"] or {}
            if "state_dict" in saved:
                drawing_sampler(loader).load_state_dict(saved["state_dict"])
            if restarts_workers(loader, pending):  # persistent workers' datasets' states
                workers = pending["workers"]
            if "dataset" in pending and stateful_iterable(loader.dataset):
                loader.dataset.load_state_dict(pending["dataset"])  # (the loader's own copy)
            between = pending
            pending = None
        epoch = cls(loader, readers)
        epoch.workers = workers
        if not draws_base_seed and record.epoch is not None:  # persistent workers go on
            epoch.carried = record.epoch.end_states()
        if between is not None and not epoch.iterable:
            epoch._draws_later = True
            epoch.pulls_in_iter = False
        # Whether the generator moves by a base seed in this epoch: as the saving loader's would
        # have, where the two differ (a state this epoch saves says so, for its own resume).
        epoch.base_drawn = draws_base_seed
        if between is not None and between.get("next_draws_base", True) != draws_base_seed:
            gen = loader.generator if loader.generator is not None else torch.default_generator
            epoch._base_fix = gen.get_state() if draws_base_seed else "draw"
            epoch._loader = loader
            epoch.base_drawn = not draws_base_seed
        if pending is not None:
            try:
                epoch._resume(loader, pending, draws_base_seed)
            except BaseException:
                epoch.end_window()
                record.pending = pending  # the resume waits for the next iter()
                raise
        record.epoch = epoch
        return epoch

    def _resume(self, loader, pending: dict, draws_base_seed: bool) -> None:
        self._plan = pending
        self.elastic_from = pending.get("elastic_from")
        self.generators = pending["generators"]
        self.sampler = pending["sampler"]
        self.skipped = pending["position"]
        self.holes = list(pending.get("holes", ()))
        self._loader = loader
        if "dataset" in pending and stateful_iterable(loader.dataset):
            # the loader's own copy: the stream itself when the main process reads it, else
            # what fresh workers (and those whose saved state is None) start from
            loader.dataset.load_state_dict(pending["dataset"])
            if self.readers[0] == 0:
                self.restored_stream = True
                self.stream_ended = bool(pending.get("dataset_ended", False))
        if restarts_workers(loader, pending):
            self.workers = pending["workers"]  # each worker loads its own (start_pool)
            self.restored_stream = True
        _restore_sampler(drawing_sampler(loader), pending["sampler"])
        # The saved epoch's draws come from the saved states in their order: when only one of
        # the two epochs draws a base seed, the states are set after that draw, or a draw
        # stands in for it (see Epoch.keys). torch's global RNG is the user's again at the end
        # of the window, whenever it is first borrowed.
        self._borrowed = torch.get_rng_state()
        if pending.get("base_drawn", True) or not draws_base_seed:
            self._apply("loader")

    def _apply(self, role: str) -> None:
        """Sets the saved state of one role's generator (see ``set_generators``)."""
        if role not in self._applied:
            self._applied.add(role)
            set_generators(self._loader, self._plan["generators"], role)

    def keys(self, keys):
        """The epoch's keys (``iter`` of the index sampler, after the base seed's draw), with
        the batches a resumed epoch already handed out skipped. The window in which saved
        generator states stand in for torch's global RNG ends here."""
        if self._base_fix is not None:  # resumed between epochs (see __init__)
            gen = self._loader.generator
            if isinstance(self._base_fix, str):
                draw_seed(gen)
            else:
                (gen if gen is not None else torch.default_generator).set_state(self._base_fix)
            self._base_fix = self._loader = None
        if self._plan is None:
            return keys
        if "loader" not in self._applied:  # the saved epoch drew no base seed; this one just did
            self._apply("loader")
        elif self._plan.get("base_drawn", True) and not self.base_drawn:
            draw_seed(self._loader.generator)  # the base seed the saved epoch drew here
        # The sampler's generator just before its first draw: set earlier, it would take the
        # base seed's place when both roles are torch's global RNG in this loader.
        self._apply("sampler")
        if self._plan.get("elastic") is not None:
            return self._plan["elastic"](keys)
        if self.iterable:
            return keys  # an iterable dataset's batches are skipped by the iterator (fetched)
        if not self._plan.get("pulled", True):
            # Saved before the sampler's first draw: it draws later, as it did, from the
            # generator as it is then (the user's global RNG, restored with their checkpoint).
            self.end_window()
            return keys
        skip = getattr(keys, "skip", None)
        if callable(skip):  # an rloader BatchStream: skipped in Rust
            skip(self.skipped, self.holes)
        else:
            keys = skip_handed(keys, self.skipped, self.holes)
        self.end_window()
        return keys

    def draws_in_iter(self) -> bool:
        """Whether a pool makes the epoch's first draws (its workers' first tasks) in
        ``iter()``, as torch's does; asked once, by the epoch's first pool. An epoch resumed
        between epochs makes them at its first batch instead, as ``num_workers=0`` does (NOTE
        [Epoch's end])."""
        later, self._draws_later = self._draws_later, False
        return not later

    def worker_states(self) -> Optional[list]:
        """Of a resumed epoch over stateful workers: per worker, the state its dataset loads
        before ``iter()`` (None: it starts as the loader's dataset), and whether its stream had
        ended (then it makes nothing more this epoch)."""
        if self.workers is None:
            return None
        return list(zip(self.workers["states"], self.workers["ended"]))

    def first_worker(self) -> int:
        """The worker whose batch comes first (that after the last one handed out)."""
        return 0 if self.workers is None else int(self.workers["next_worker"])

    def _opened(self, state):
        """A worker's state as handed out: a map-style dataset's came pickled (``snapshot``;
        None if it could not be taken), an IterableDataset's as it is."""
        if self.iterable or state is None:
            return state
        return pickle.loads(state)

    def end_states(self) -> Optional[list]:
        """The stateful workers' states as this epoch is left (None if it has none): where
        persistent workers start the next epoch. Of an epoch left early, each worker's after
        its last batch handed out; a worker that made more goes on from its last one instead,
        which the next epoch's iterator learns as it drains them (``Drained`` in rloader-py's
        handout/mod.rs)."""
        if not self.stateful_workers:
            return None  # (without asking the iterator: this runs as every persistent epoch starts)
        progress = self.progress()
        if progress is None or progress["workers"] is None:
            return None
        return list(progress["workers"]["states"])

    def end_window(self) -> None:
        """After ``iter()``'s draws: torch's global RNG is the user's again."""
        if self._borrowed is not None:
            torch.set_rng_state(self._borrowed)
            self._borrowed = None

    def bind(self, iterator) -> None:
        self._iterator = weakref.ref(iterator)
        if self._plan is not None and self.iterable and self.skipped and not self.restored_stream:
            warnings.warn(
                f"resuming an IterableDataset by fetching and dropping the {self.skipped} "
                "batches handed out before the checkpoint (it cannot skip them any faster)",
                stacklevel=3,
            )
            for _ in range(self.skipped):
                if next(iterator, _END) is _END:
                    break
        self._plan = None
        self._loader = None  # the record is kept beside the loader: it must not keep it alive

    def progress(self) -> Optional[dict]:
        """Where the epoch is, or None once the iterator is gone: ``position`` and ``holes``
        (the batches handed out, in draw order: all below ``position`` but ``holes``),
        ``finished``, and the stateful workers' ``workers`` (see ``state_dict``).

        For a map-style dataset the iterator numbers its batches from the resumed position; an
        iterable dataset's iterator fetched the skipped batches itself, so they are in its count
        (unless its datasets were restored from their states)."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is None:
            return None
        taken, finished = iterator._progress
        handouts = getattr(iterator, "_handouts", None)  # with workers (HandOuts)
        holes: list = []
        if self.iterable:
            fetched_again = not self.restored_stream
            position = taken if fetched_again else self.skipped + taken
        else:
            end, new_holes = (taken, []) if handouts is None else handouts.tasks
            position, holes = rebase(self.skipped, self.holes, end, new_holes)
        workers = None
        if self.stateful_workers and handouts is not None:
            # Per worker (state, ended) after its last batch handed out (or as it started the
            # epoch; None where that state could not be taken: it starts afresh); if it said
            # nothing yet, what it was resumed from or carried from the last epoch.
            saved = self.worker_states() or [(state, False) for state in self.carried or ()]
            saved = saved or [(None, False)] * self.stateful_workers
            now = [
                (self._opened(state), ended) if said else saved[w]
                for w, (state, said, ended) in enumerate(
                    zip(handouts.states, handouts.said, handouts.ended)
                )
            ]
            last = handouts.last_worker
            workers = dict(
                num_workers=self.stateful_workers,
                kind=self.readers[1],
                states=[state for state, _ in now],
                ended=[bool(ended) for _, ended in now],
                next_worker=(
                    self.first_worker() if last is None else (last + 1) % self.stateful_workers
                ),
            )
        if finished and workers is not None:
            # Between epochs: where each worker's dataset was once its stream ended (an
            # iterable's), or after its last batch (a map-style one's), from which persistent
            # workers start the next epoch (fresh ones start as the loader's dataset).
            n = self.stateful_workers
            states = handouts.end_states if self.iterable else workers["states"]
            workers = dict(workers, states=states, ended=[False] * n, next_worker=0)
        exhausted = bool(getattr(iterator, "_exhausted", False))  # LoaderIter's stream
        return dict(
            position=position, holes=holes, finished=finished, workers=workers, exhausted=exhausted
        )


_END = object()


# NOTE [Epoch's end]: a state saved once every batch of its epoch was handed out (a map-style
# epoch's ``len(loader)`` batches, none held back) is at that epoch's end, whether or not the
# iterator has raised StopIteration yet: Lightning saves there (at the last batch's end) and
# counts the epoch as done, and so does a loop that saves after its last step. Its resume is the
# next epoch, as after StopIteration: the saved epoch's draws are made again, to their end, from
# its saved generator states (torch's global RNG borrowed), which leaves the generators and the
# sampler as the uninterrupted run's next iter() finds them, whatever a sampler draws after its
# last batch; then the state is one between epochs. An IterableDataset's epoch ends where its
# stream does, which only StopIteration tells.
#
# A resume between epochs makes the sampler's first draw at the epoch's first batch, not in
# iter(): Lightning's resumed fit loop calls iter() before set_epoch() (the uninterrupted one
# after), and the epoch's order must be that set_epoch()'s. The base seed is drawn in iter().


def _restore_sampler(sampler, saved: Optional[dict]) -> None:
    """Puts the sampler where a saved epoch found it: its own saved state, if it has one, and a
    DistributedSampler's epoch."""
    saved = saved or {}
    if "state_dict" in saved:
        sampler.load_state_dict(saved["state_dict"])
    if "distributed" in saved:
        sampler.epoch = saved["distributed"]["epoch"]


def _every_batch_handed_out(loader, pending: dict) -> bool:
    """Whether ``pending``, a state saved mid-epoch, had handed out every batch of its epoch."""
    position = pending["position"]
    if (
        not position  # (None: between epochs already; 0: an epoch of no batches, not drawn)
        or pending.get("holes")
        or pending.get("elastic") is not None
        or pending.get("elastic_from") is not None
        or isinstance(loader.dataset, tud.IterableDataset)
    ):
        return False
    try:
        return position >= len(loader)
    except TypeError:  # an epoch of unknown length: it ends where the sampler does
        return False


def _after_the_end(loader, pending: dict) -> dict:
    """The state between ``pending``'s epoch, every batch of which was handed out, and the
    next: that epoch's draws made again to their end (NOTE [Epoch's end])."""
    sampler = drawing_sampler(loader)
    distributed = (pending["sampler"] or {}).get("distributed")
    set_epoch = sampler.epoch if distributed is not None else None  # the user's, kept
    borrowed = torch.get_rng_state()
    try:
        set_generators(loader, pending["generators"], "loader")
        _restore_sampler(sampler, pending["sampler"])
        if pending.get("base_drawn", True):
            draw_seed(loader.generator)
        set_generators(loader, pending["generators"], "sampler")  # (as Epoch.keys orders them)
        keys = iter_keys(loader._index_sampler)
        skip = getattr(keys, "skip", None)
        if callable(skip):  # an rloader BatchStream: skipped in Rust
            skip(pending["position"], [])
        for _ in keys:  # (to the sampler's end: what it draws after its last batch)
            pass
        generators = {role: pack(gen) for role, gen in generators_of(loader).items()}
        after = sampler_state(sampler)
    finally:
        torch.set_rng_state(borrowed)
        if set_epoch is not None:
            sampler.epoch = set_epoch
    workers = pending.get("workers")
    if workers is not None:
        # Each worker's state after its last batch: persistent workers go on from there in the
        # next epoch, from the first worker; fresh ones start from their seeds.
        persistent = not pending.get("next_draws_base", True)
        workers = dict(workers, next_worker=0) if persistent else None
    return dict(
        pending, position=None, holes=[], generators=generators, sampler=after, workers=workers
    )


def skip_handed(keys, end: int, holes: list):
    """``keys`` (batches of keys) without those among the first ``end`` that were handed out
    (all but ``holes``), drawn now, as ``BatchStream.skip`` does in Rust: the kept ones come
    first, then the rest. The sampler's first draw is made here, in the window of NOTE
    [Resume], even when nothing is skipped."""
    keys = iter(keys)
    keep, kept = set(holes), []
    for i in range(end):
        batch = next(keys, _END)
        if batch is _END:
            break
        if i in keep:
            kept.append(batch)
    first = next(keys, _END)
    rest = iter(()) if first is _END else itertools.chain([first], keys)
    return itertools.chain(kept, rest) if kept else rest


def rebase(end: int, holes: list, new_end: int, new_holes: list) -> tuple:
    """The batches handed out in an epoch resumed with (``end``, ``holes``) — the saved
    epoch's batches below ``end`` but ``holes`` were handed out before — after its iterator
    handed out its own batches below ``new_end`` but ``new_holes``, as (end, holes) in the
    saved epoch's numbering: the resumed iterator's batch ``t`` is ``holes[t]``, then ``end``,
    ``end + 1``, ... (``skip_handed``)."""
    if new_end == 0:
        return end, list(holes)
    k = len(holes)

    def original(t: int) -> int:
        return holes[t] if t < k else end + t - k

    missing = set(new_holes)
    left = [holes[t] for t in range(k) if t >= new_end or t in missing]
    left += [original(t) for t in missing if t >= k]
    return max(end, original(new_end - 1) + 1), sorted(left)
