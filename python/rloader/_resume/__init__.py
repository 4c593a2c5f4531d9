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
sampler are drawn and dropped (``epoch.skip_handed``). A resumed iterator numbers its batches anew:
``epoch.rebase`` maps them back to the saved epoch's numbers for the next ``state_dict()``.

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

A map-style dataset with ``state_dict``/``load_state_dict`` (torchdata's convention: the state
of what its samples draw from, such as rloader.vision's augmentations) read by a fixed number
of workers has the same per-worker states saved (pickled as each batch is made, ``snapshot``:
None where that fails), with the worker whose batch comes next, and a resumed pool of as many
workers of that kind loads them and starts its round robin there. In order, batch ``i`` goes
to worker ``i mod n`` as in the uninterrupted epoch, from the state that worker had after its
previous one, so every draw is the uninterrupted run's. Resumed with another count or kind,
the order is still exact and the workers start as fresh ones do. Persistent workers go on from
their states at the end of the previous epoch, or where it was left (a ``break``): the answers
nobody took (still owed, held by the scheduler or by the pin thread) are drained as the next
epoch starts, and each worker's last one says where it is (``Drained`` in handout/mod.rs).

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
generators' current states instead, and the next ``iter()`` starts a fresh epoch from them. A
state saved once every batch of a map-style epoch was handed out is made one between epochs as
it is resumed (NOTE [Epoch's end] in epoch.py).

Elastic resume (``load_state_dict()`` given every rank's state, on another number of ranks) is
``reshard``'s: it works out this rank's share of the saved epoch, which ``state._elastic_plan``
makes the pending resume.

The epoch and the pending resume are kept in the loader's record (``_loader_record``), not in
the loader: a loader pickles after iteration as torch's does, and nothing here keeps a loader
alive.
"""

from .check import check
from .epoch import Epoch, epoch_of
from .readers import restarts_workers, stateful_iterable, stateful_workers
from .state import load_state_dict, state_dict

__all__ = [
    "Epoch",
    "check",
    "epoch_of",
    "load_state_dict",
    "restarts_workers",
    "state_dict",
    "stateful_iterable",
    "stateful_workers",
]
