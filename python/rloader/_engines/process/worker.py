"""The entry point of a worker process: ``_worker_main``, what ``multiprocessing`` runs.

It does what only Python can do in a worker, as torch's ``_worker_loop`` does it: ignore
Ctrl-C, install torch's crash handlers, seed ``random``, torch and numpy, set
``get_worker_info()``, run ``worker_init_fn``, load a resumed dataset's state and start an
iterable dataset's iterator. Then it hands over to the Rust loop (``_rloader.worker_loop``,
rust/rloader-py/src/process/worker.rs), which takes tasks, fetches, collates and sends answers until it
is told to stop or the main process is gone, calling back into ``_WorkerHooks`` for what is
Python's (pickling through ``wire``, a new epoch's iterator). The main process's side is
``pool``.

Processes started by spawn or forkserver import this module to find ``_worker_main``.
"""

from __future__ import annotations

import gc
import pickle
import random
import signal
import sys
import traceback

import torch
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as torch_worker

from ... import _rloader
from ..._collate import _collate_plan
from ..._resume.format import snapshot
from ..._resume.readers import state_holder
from .wire import dump_error, dumps

# Each worker seeds numpy's global generator, as torch's do. numpy 2 imports numpy.random only
# when it is first used, and in each new worker that import delayed the first batch; imported
# once now, forked workers start with it (CHANGELOG.md has the figures).
try:
    import numpy.random  # noqa: F401
except ImportError:
    pass

__all__ = ["_worker_main"]


def _stack_lines_without_source(f=None, limit=None) -> list:
    """``traceback.format_stack``'s lines, less the source text, which costs a file read each
    (and without folding repeated recursive frames)."""
    if limit is None:
        limit = getattr(sys, "tracebacklimit", None)
    if f is None:
        f = sys._getframe().f_back  # the caller's frame, as format_stack starts from
    frames = []
    while f is not None:
        frames.append((f.f_code, f.f_lineno))
        f = f.f_back
    frames.reverse()
    if limit is not None:
        frames = frames[len(frames) - limit :] if limit >= 0 else frames[:-limit]
    return [
        f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n'
        for code, lineno in frames
    ]


def _manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``, without reading source files.

    torch.manual_seed queues the accelerator seeding for a lazy initialization that may never
    come, keeping ``traceback.format_stack()`` of each queued call for the error message if it
    fails. In a new worker none of the stack's source files is in ``linecache`` yet, and reading
    them slowed every worker's start (CHANGELOG.md has the figures). Each stack is kept with files, lines and
    functions, without the source text. The swap lasts for this one call, before
    ``worker_init_fn`` and the worker's first fetch; under fork the worker has no other Python
    thread, and under spawn only one the dataset's unpickling started could see it.
    """
    format_stack = traceback.format_stack
    traceback.format_stack = _stack_lines_without_source
    try:
        torch.manual_seed(seed)
    finally:
        traceback.format_stack = format_stack


def _worker_main(spec: dict) -> None:
    """Entry point of a worker process."""
    worker_id = spec["worker_id"]
    # What a forked worker inherits goes to the permanent generation before it allocates much:
    # its collections never traverse the parent's objects, so a full collection due in the
    # parent (one its heap made due, which torch's parent runs itself during its first epoch)
    # neither runs over that heap here nor writes, and so copies, its pages. The worker's own
    # objects are collected as usual; the parent's collections are untouched.
    gc.freeze()
    # The main process handles Ctrl-C; a worker leaves when told to or when its parent dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # As torch's workers: a segfault, bus error or FPE prints what happened before the default
    # action ends the process (and replaces a faulthandler inherited from the parent).
    signal_handling._set_worker_signal_handlers()
    torch.set_num_threads(1)
    seed = spec["base_seed"] + worker_id
    random.seed(seed)
    _manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(torch_worker._generate_state(spec["base_seed"], worker_id))
    except ImportError:
        pass
    dataset = spec["dataset"]
    # torch.utils.data.get_worker_info() (and rloader's, the same function) reads this.
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=spec["num_workers"], seed=seed, dataset=dataset
    )
    init_error = None
    samples = None
    try:
        if spec["worker_init_fn"] is not None:
            spec["worker_init_fn"](worker_id)
        if spec["dataset_state"] is not None:  # a resumed epoch: where this worker was
            state_holder(dataset).load_state_dict(spec["dataset_state"])
        if spec["iterable"]:
            # (a worker whose stream had ended makes nothing more this epoch)
            samples = iter(()) if spec["dataset_ended"] else iter(dataset)
    except Exception as exc:  # reported with the first task, as torch does
        init_error = dump_error(worker_id, exc)
    # The spec, with what this process made of it (rust/rloader-py/src/process/worker.rs, WorkerSpec).
    # A SystemExit from the dataset or collate_fn ends the process with its code; a
    # KeyboardInterrupt ends it quietly, as torch's worker loop does (the main process reports
    # either as a worker's death).
    try:
        _rloader.worker_loop(
            dict(
                spec,
                region_fd=spec["region_fd"].fd,
                samples=samples,
                collate_plan=_collate_plan(spec["collate_fn"]),
                init_error=init_error,
                hooks=_WorkerHooks(worker_id, dataset, spec["worker_states"], spec["iterable"]),
            )
        )
    except KeyboardInterrupt:
        pass


class _WorkerHooks:
    """What the Rust worker loop calls back for (``_WorkerHooks`` in ``_rloader.pyi``)."""

    def __init__(self, worker_id: int, dataset, worker_states: bool, iterable: bool) -> None:
        self.worker_id = worker_id
        self.dataset = dataset
        self.worker_states = worker_states
        self.iterable = iterable
        # (what says where the samples are: the dataset, or the one a Subset selects from)
        self.holder = state_holder(dataset) if worker_states else None

    def dumps(self, batch, ended: bool = False):
        """A batch as bytes; with ``worker_states`` (a dataset with ``state_dict``) paired with
        ``(the dataset's state right after making it, whether its iterator ended making it)``,
        which the main process keeps once the batch is handed out (NOTE [Resume]). An
        IterableDataset's state that will not pickle is that batch's error (its stream cannot
        be resumed without it); a map-style dataset's is sent pickled (``snapshot``)."""
        if self.worker_states:
            state = self.holder.state_dict() if self.iterable else snapshot(self.holder)
            return dumps((batch, (state, ended)))
        return dumps(batch)

    def dump_state(self) -> bytes:
        """The dataset's state, pickled, as a new epoch of persistent workers starts or as the
        stream ends (empty without ``worker_states``, or if ``state_dict()`` fails: the state
        is then not known there, and a resume from that point starts the worker as the
        loader's dataset)."""
        if not self.worker_states:
            return b""
        try:
            return pickle.dumps(self.holder.state_dict())
        except Exception:
            return b""

    def dump_error(self, exc: BaseException, traceback=None) -> bytes:
        return dump_error(self.worker_id, exc, traceback)

    def restart(self):
        return iter(self.dataset)

    def load_keys(self, data: bytes):
        return pickle.loads(data)
