"""Exact mid-epoch resume: ``DataLoader.state_dict()`` and ``load_state_dict()``.

NOTE [Resume]: an epoch's order is a function of the random generators' states when it starts
(rloader's samplers take one seed per pass from them; so do torch's, and the workers' base
seed), so a position in an epoch is (those states, batches handed out). Each ``iter()`` records
the states before its first draw (``Epoch.begin``); ``state_dict()`` saves them with the
batches of keys the iterator has handed out, numbered in draw order (batches loaded ahead by
workers but not handed out are not counted: they are produced again after a resume). In
order they are a prefix, saved as its length ``position``. With ``in_order=False`` and workers
they are every batch below ``position`` but a few ``holes``: each hole is a batch drawn and not
handed out yet, and the scheduler never lets more than ``prefetch_factor × num_workers`` of
those exist (``HandOuts``, rloader-py's handout/handouts.rs, records them as the batches reach
the user; the Scheduler says which task each one answered). ``load_state_dict()`` leaves a
pending resume that the next ``iter()`` applies: the generators are put back in their saved
states, the epoch's draws happen in the usual order (base seed, then the sampler's seed at its
first pull), and the batches below ``position`` are skipped but the holes, which come first.
Keys made in Rust are skipped without Python objects (``BatchStream.skip``); keys of another
sampler are drawn and dropped (``_skip_handed``). A resumed iterator numbers its batches anew:
``_rebase`` maps them back to the saved epoch's numbers for the next ``state_dict()``.

An IterableDataset with ``state_dict``/``load_state_dict`` read in the main process saves its
own state. Read by workers, each worker's copy has its own place: the worker sends its
dataset's state (and whether its iterator ended, on a short last batch) with each batch, and
the state after the last batch of that worker handed out is saved, with the worker whose batch
comes next. A resumed pool's workers load their states before ``iter(dataset)`` (a worker whose
stream had ended makes nothing more) and the round robin starts at that next worker: each
worker's stream goes on where it was and the round robin over those still going is the
uninterrupted one's, so the whole stream is. Persistent workers also send their dataset's
state as they restart for an epoch (what a worker that has handed out nothing yet saves) and as
their stream ends (what a state between epochs saves, for the next epoch's workers to load).
The states are per worker: another ``num_workers`` is refused.

An IterableDataset's stream depends on who reads it (each worker reads its shard): the state
of an epoch says who read it (``readers``: ``[0, "main"]`` or ``[n, kind]``). A fixed loader's
are its arguments; an auto loader reads a resumed epoch with the saved ones, whatever it would
have chosen (``_auto.stream_readers``), and saves its own copy's state always (the main process
reads it in auto's first epoch, and fresh workers start from it).

A generator the loader was given (``generator=``, or a sampler's ``generator``) takes the saved
state and keeps it: later epochs are the uninterrupted run's. torch's global RNG is only
borrowed for the resumed epoch's draws and put back as it was: it belongs to the user, who
restores it with the rest of a checkpoint.

Between epochs (before the first ``iter()``, or once an epoch has ended) the state holds the
generators' current states instead, and the next ``iter()`` starts a fresh epoch from them.

Elastic resume (``load_state_dict()`` given every rank's state, on another number of ranks) is
``_reshard``'s: it works out this rank's share of the saved epoch, which ``_elastic_plan`` here
makes the pending resume.

The epoch and the pending resume are kept in the loader's record (``_loader_record``), not in
the loader: a loader pickles after iteration as torch's does, and nothing here keeps a loader
alive.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
import zlib
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data as tud

from . import _auto, _reshard
from ._loader_record import record_of
from ._seed import draw_seed
from .sampler import _InfiniteConstantSampler

FORMAT = "rloader.DataLoader/1"


def epoch_of(loader) -> "Epoch":
    """The epoch ``iter(loader)`` is starting (``Epoch.begin`` made it)."""
    return record_of(loader).epoch


def _pack(generator: Optional[torch.Generator]) -> bytes:
    """A generator's state, small: a CPU generator's Mersenne Twister words are stored as
    64-bit integers whose upper halves are zero, so the halves are split before compressing
    (about 2.5 KB instead of 5 KB)."""
    raw = (generator if generator is not None else torch.default_generator).get_state().numpy()
    if raw.size % 8:
        return b"\0" + zlib.compress(raw.tobytes(), 9)
    words = raw.view(np.uint32)
    return b"\1" + zlib.compress(np.concatenate([words[0::2], words[1::2]]).tobytes(), 9)


def _unpack(blob: bytes) -> torch.Tensor:
    data = np.frombuffer(zlib.decompress(blob[1:]), dtype=np.uint8)
    if blob[:1] == b"\1":
        halves = data.view(np.uint32)
        words = np.empty_like(halves)
        words[0::2], words[1::2] = halves[: halves.size // 2], halves[halves.size // 2 :]
        data = words.view(np.uint8)
    return torch.from_numpy(data.copy())


def _drawing_sampler(loader) -> Optional[Any]:
    """The sampler whose draws order the epoch: the one the batch sampler wraps (or a batch
    sampler of the user's, which draws itself), else the loader's sampler."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None:
        return getattr(batch_sampler, "sampler", batch_sampler)
    if isinstance(loader.sampler, _InfiniteConstantSampler):
        return None
    return loader.sampler


def _generators(loader) -> dict:
    """The generators an epoch draws from, by role: "loader" (its ``generator``, None for
    torch's global RNG) and "sampler" (the drawing sampler's ``generator``, if it has one and
    it is another generator). A ``generator`` that is no torch.Generator has no state: the
    epoch's first draw from it raises torch's TypeError."""
    roles: dict = {}
    if loader.generator is None or isinstance(loader.generator, torch.Generator):
        roles["loader"] = loader.generator
    sampler = _drawing_sampler(loader)
    gen = getattr(sampler, "generator", None) if sampler is not None else None
    if (
        sampler is not None
        and hasattr(sampler, "generator")
        and (gen is None or isinstance(gen, torch.Generator))
    ):
        if gen is not loader.generator:
            roles["sampler"] = gen
    return roles


def _sampler_state(sampler) -> Optional[dict]:
    state: dict = {}
    if callable(getattr(sampler, "state_dict", None)) and callable(
        getattr(sampler, "load_state_dict", None)
    ):
        try:  # taken at every iter(): a sampler whose state_dict fails must still iterate
            state["state_dict"] = sampler.state_dict()
        except Exception:  # then a resume draws its keys again instead
            pass
    if isinstance(sampler, tud.distributed.DistributedSampler):
        from .distributed import DistributedSampler

        state["distributed"] = dict(
            # rloader's order or torch's (isinstance cannot tell them apart: _twin.py)
            order="rloader" if DistributedSampler in type(sampler).__mro__ else "torch",
            epoch=int(sampler.epoch),
            seed=int(sampler.seed),
            num_replicas=int(sampler.num_replicas),
            rank=int(sampler.rank),
            shuffle=bool(sampler.shuffle),
            drop_last=bool(sampler.drop_last),
            length=len(sampler.dataset),
        )
    return state or None


class Epoch:
    """One ``iter()`` of a loader: the generator states before its draws, and the iterator."""

    def __init__(self, loader, readers: tuple) -> None:
        self.generators = {role: _pack(gen) for role, gen in _generators(loader).items()}
        self.sampler = _sampler_state(_drawing_sampler(loader))
        self.iterable = isinstance(loader.dataset, tud.IterableDataset)
        self.readers = readers  # who reads the dataset (``readers``)
        # Whether iter() itself pulls the sampler's first keys (workers get tasks in iter()).
        self.pulls_in_iter = loader.num_workers > 0
        # Workers whose copies of an IterableDataset say where they are: their states are saved.
        self.stateful_workers = readers[0] if _stateful_workers(loader, readers) else 0
        # Of a resumed epoch: the batches (in draw order) below `skipped` handed out before the
        # checkpoint but `holes`, and the saved workers' states ("workers" of state_dict()).
        self.skipped = 0
        self.holes: list = []
        self.workers: Optional[dict] = None
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

    @classmethod
    def begin(cls, loader, draws_base_seed: bool) -> "Epoch":
        """Starts an ``iter()`` (which draws the workers' base seed unless it resets persistent
        workers): records the states, and applies a pending resume."""
        record = record_of(loader)
        pending, record.pending = record.pending, None
        readers = planned_readers(loader, pending)
        workers = between = None
        if pending is not None and pending["position"] is None:
            _set_generators(loader, pending["generators"], borrow_global=False)  # between epochs
            saved = pending["sampler"] or {}
            if "state_dict" in saved:
                _drawing_sampler(loader).load_state_dict(saved["state_dict"])
            if restarts_workers(loader, pending):  # persistent workers' datasets' states
                workers = pending["workers"]
            if "dataset" in pending and stateful_iterable(loader.dataset):
                loader.dataset.load_state_dict(pending["dataset"])  # (the loader's own copy)
            between = pending
            pending = None
        epoch = cls(loader, readers)
        epoch.workers = workers
        if between is not None and between.get("next_draws_base", True) != draws_base_seed:
            gen = loader.generator if loader.generator is not None else torch.default_generator
            epoch._base_fix = gen.get_state() if draws_base_seed else "draw"
            epoch._loader = loader
        epoch.base_drawn = draws_base_seed
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
        sampler = _drawing_sampler(loader)
        saved = pending["sampler"] or {}
        if "state_dict" in saved:
            sampler.load_state_dict(saved["state_dict"])
        if "distributed" in saved:
            sampler.epoch = saved["distributed"]["epoch"]
        # The saved epoch's draws come from the saved states in their order: when only one of
        # the two epochs draws a base seed, the states are set after that draw, or a draw
        # stands in for it (see Epoch.keys). torch's global RNG is the user's again at the end
        # of the window, whenever it is first borrowed.
        self._borrowed = torch.get_rng_state()
        if pending.get("base_drawn", True) or not draws_base_seed:
            self._apply("loader")

    def _apply(self, role: str) -> None:
        """Sets the saved state of one role's generator (see ``_set_generators``)."""
        if role not in self._applied:
            self._applied.add(role)
            _set_generators(self._loader, self._plan["generators"], role)

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
            keys = _skip_handed(keys, self.skipped, self.holes)
        self.end_window()
        return keys

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
            position, holes = _rebase(self.skipped, self.holes, end, new_holes)
        workers = None
        if self.stateful_workers and handouts is not None:
            # Per worker (state, ended) after its last batch handed out (or as it started the
            # epoch); if none since a resume, what it was resumed from.
            saved = self.worker_states() or [(None, False)] * self.stateful_workers
            now = [
                (state, ended) if state is not None else saved[w]
                for w, (state, ended) in enumerate(zip(handouts.states, handouts.ended))
            ]
            last = handouts.last_worker
            workers = dict(
                num_workers=self.stateful_workers,
                states=[state for state, _ in now],
                ended=[bool(ended) for _, ended in now],
                next_worker=(
                    self.first_worker() if last is None else (last + 1) % self.stateful_workers
                ),
            )
        if finished and workers is not None:
            # Between epochs: where each worker's dataset was once its stream ended, from which
            # persistent workers start the next epoch (fresh ones start as the loader's dataset).
            n = self.stateful_workers
            workers = dict(
                num_workers=n, states=handouts.end_states, ended=[False] * n, next_worker=0
            )
        exhausted = bool(getattr(iterator, "_exhausted", False))  # LoaderIter's stream
        return dict(
            position=position, holes=holes, finished=finished, workers=workers, exhausted=exhausted
        )


_END = object()


def _skip_handed(keys, end: int, holes: list):
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


def _rebase(end: int, holes: list, new_end: int, new_holes: list) -> tuple:
    """The batches handed out in an epoch resumed with (``end``, ``holes``) — the saved
    epoch's batches below ``end`` but ``holes`` were handed out before — after its iterator
    handed out its own batches below ``new_end`` but ``new_holes``, as (end, holes) in the
    saved epoch's numbering: the resumed iterator's batch ``t`` is ``holes[t]``, then ``end``,
    ``end + 1``, ... (``_skip_handed``)."""
    if new_end == 0:
        return end, list(holes)
    k = len(holes)

    def original(t: int) -> int:
        return holes[t] if t < k else end + t - k

    missing = set(new_holes)
    left = [holes[t] for t in range(k) if t >= new_end or t in missing]
    left += [original(t) for t in missing if t >= k]
    return max(end, original(new_end - 1) + 1), sorted(left)


def _set_generators(loader, packed: dict, role: Optional[str] = None, borrow_global: bool = True):
    """Puts the generator that plays ``role`` (every saved role when None) in this loader in its
    saved state: the loader's ``generator``, or its sampler's; a sampler that draws from the
    same generator as the loader has it set just before its draw. torch's global RNG is set only
    with ``borrow_global`` (the caller has its state, to put back)."""
    current = _generators(loader)
    for name in [role] if role is not None else list(packed):
        if name not in packed:
            continue
        if name in current:
            gen = current[name]
        else:  # the sampler draws from the loader's generator here, if it draws at all
            sampler = _drawing_sampler(loader)
            if sampler is None or not hasattr(sampler, "generator"):
                continue
            gen = loader.generator
        state = _unpack(packed[name])
        if gen is not None:
            gen.set_state(state)
        elif borrow_global:
            torch.set_rng_state(state)


def state_dict(loader) -> dict:
    record = record_of(loader)
    pending = record.pending
    if pending is not None:  # loaded, not yet iterated: the same position
        return {k: v for k, v in pending.items() if k != "elastic"}
    state = dict(
        format=FORMAT,
        position=None,
        sampler=None,
        in_order=bool(loader.in_order),
        batch_size=loader.batch_size,
    )
    if _is_auto(loader):
        state["auto"] = _auto.learned_state(loader)  # what it chose: a resume starts there
    epoch = record.epoch
    progress = epoch.progress() if epoch is not None else None
    if progress is not None and not progress["finished"]:
        position = int(progress["position"])
        if progress["holes"]:  # out of order: batches below `position` not handed out yet
            state["holes"] = [int(h) for h in progress["holes"]]
        if epoch.elastic_from is not None:
            world = _drawing_sampler(loader)
            return dict(
                state,
                position=position,
                generators={},
                elastic_from=epoch.elastic_from,
                world=[int(world.num_replicas), int(world.rank)],
            )
        state = dict(
            state,
            position=position,
            generators=dict(epoch.generators),
            sampler=epoch.sampler,
            pulled=position > 0 or epoch.pulls_in_iter,
            base_drawn=epoch.base_drawn,
        )
        if epoch.iterable:
            state["readers"] = list(epoch.readers)
        if _keeps_main_copy(loader, epoch.readers):
            state["dataset"] = loader.dataset.state_dict()
            # Its iterator may have ended with a short last batch: nothing more comes then.
            state["dataset_ended"] = bool(progress["exhausted"]) and epoch.readers[0] == 0
        if progress["workers"] is not None:
            state["workers"] = progress["workers"]
        return state
    state["generators"] = {role: _pack(gen) for role, gen in _generators(loader).items()}
    state["sampler"] = _sampler_state(_drawing_sampler(loader))
    readers = planned_readers(loader, None)  # the next epoch's
    if progress is not None and progress["workers"] is not None and loader.persistent_workers:
        # An epoch ended: where persistent workers are, if the next epoch goes on with them
        # (an auto loader's next epoch may start another pool, whose workers start fresh).
        if not _is_auto(loader) or loader._iterator._keeps_pool(*readers):
            state["workers"] = progress["workers"]
    if isinstance(loader.dataset, tud.IterableDataset):
        state["readers"] = list(readers)
    if _keeps_main_copy(loader, readers):
        state["dataset"] = loader.dataset.state_dict()  # where the next epoch starts from
    # Persistent workers' next epoch draws no base seed; a fresh pool's does (Epoch.begin).
    it = loader._iterator
    state["next_draws_base"] = not (
        loader.persistent_workers
        and loader.num_workers > 0
        and it is not None
        and not it._rloader_pool.stopped
    )
    return state


def stateful_iterable(dataset) -> bool:
    """An IterableDataset that says where it is (``state_dict``/``load_state_dict``)."""
    return (
        isinstance(dataset, tud.IterableDataset)
        and callable(getattr(dataset, "state_dict", None))
        and callable(getattr(dataset, "load_state_dict", None))
    )


def _is_auto(loader) -> bool:
    return _auto.is_auto(loader.num_workers)


def planned_readers(loader, pending: Optional[dict]) -> tuple:
    """Who reads the dataset in the epoch that starts, with ``pending`` (a resume) if any:
    ``(num_workers, kind)``, kind "main", "process" or "thread". A fixed loader's are its
    arguments; an auto loader's are chosen as an epoch begins (``_auto.stream_readers``: an
    IterableDataset's epoch keeps one engine, and a resumed one is read by its saved readers,
    on which its stream depends)."""
    if _is_auto(loader):
        return _auto.stream_readers(loader, pending)
    n = int(loader.num_workers)
    return n, (getattr(loader, "worker_type", "process") if n > 0 else "main")


def _keeps_main_copy(loader, readers: tuple) -> bool:
    """Whether the loader's own copy of a stateful IterableDataset has a state to save: when
    the main process reads it, and under auto always (the main process reads it in some
    epochs, and fresh workers start as it is). Any loader given such a state loads it."""
    return stateful_iterable(loader.dataset) and (readers[0] == 0 or _is_auto(loader))


def _stateful_workers(loader, readers: tuple) -> bool:
    """A stateful IterableDataset read by worker processes: each worker's copy's state is
    saved (the state after the last of its batches handed out), and restored in that worker.
    Thread workers do not report their copies' states yet: their loaders resume such a dataset
    as any other IterableDataset, by fetching and dropping (with the warning)."""
    n, kind = readers
    return n > 0 and kind == "process" and stateful_iterable(loader.dataset)


def restarts_workers(loader, pending: Optional[dict] = None) -> bool:
    """Whether a resume (the pending one by default) starts workers that load their datasets'
    states first (a persistent loader's running workers are then replaced)."""
    pending = record_of(loader).pending if pending is None else pending
    return (
        pending is not None
        and pending.get("workers") is not None
        and _stateful_workers(loader, planned_readers(loader, pending))
    )


def _check_workers(loader, state: dict) -> None:
    """An IterableDataset's stream depends on how many workers read it (each reads its shard),
    and a stateful one's place is per worker (each has its own copy): an epoch saved mid-way
    resumes only with the same number of workers (an auto loader reads it with them; per-worker
    places need processes)."""
    if not isinstance(loader.dataset, tud.IterableDataset):
        return
    stateful = stateful_iterable(loader.dataset)
    workers = state.get("workers") if stateful else None
    if _is_auto(loader):
        if workers is not None and getattr(loader, "worker_type", "process") == "thread":
            raise ValueError(
                f"this state holds the places of {workers['num_workers']} worker processes "
                "over an IterableDataset with state_dict(): each one's copy has its own place "
                "in the stream, which thread workers do not restore; build this loader with "
                "worker_type='process' or 'auto' to resume it"
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


def load_state_dict(loader, state) -> None:
    if isinstance(state, (list, tuple)):
        record_of(loader).pending = _elastic_plan(loader, list(state), 0)
        return
    if isinstance(state, dict) and state.get("elastic_from") is not None:
        # Saved during an epoch resumed from another world size: that epoch again, from here,
        # on the same new world.
        _reshard.check_rank(_drawing_sampler(loader), *state["world"])
        plan = _elastic_plan(
            loader, list(state["elastic_from"]), state["position"], list(state.get("holes", ()))
        )
        record_of(loader).pending = plan
        return
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            "load_state_dict() expects what rloader.DataLoader.state_dict() returned (a dict "
            f"with format={FORMAT!r}), or a list of them, one per rank of the saved job"
        )
    distributed = (state.get("sampler") or {}).get("distributed")
    if state["position"] is not None and distributed is not None:
        _reshard.check_rank(
            _drawing_sampler(loader), distributed["num_replicas"], distributed["rank"]
        )
    _check_workers(loader, state)
    if _is_auto(loader):
        _auto.seed_learned(loader, state.get("auto"))
    record_of(loader).pending = dict(state)


def _elastic_plan(loader, states: list, position: int, holes: list = ()) -> dict:
    """The pending resume of an epoch saved on another world size (``_reshard``): this rank's
    share of what no old rank handed out, less its batches below ``position`` but ``holes``
    (those handed out on this world, when the resumed epoch was saved again)."""
    sampler = _drawing_sampler(loader)
    share = _reshard.remaining_share(sampler, states)
    if share is None:  # between epochs on the old world: the new world starts its next epoch
        return dict(format=FORMAT, position=None, sampler=None, generators={})
    mine, epoch = share
    # (the plan waits beside the loader, in its record: it must not hold the loader itself)
    batch_size, drop_last = loader.batch_size, loader.drop_last

    def keys(_ignored):
        batches = tud.BatchSampler(mine, batch_size, drop_last) if batch_size is not None else mine
        return _skip_handed(batches, position, holes)

    sampler.epoch = epoch
    return dict(
        format=FORMAT,
        position=position,
        holes=list(holes),
        sampler=None,
        generators={},
        elastic=keys,
        elastic_from=states,
    )
