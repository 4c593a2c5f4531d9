"""What only thread workers do (worker_type="thread"): batches handed over without shared
memory or pickling, fetches that overlap, each thread's worker info and generators, pinning
on the worker threads, async datasets. Behaviour shared with the other engines (batches,
iterable datasets, persistent workers, errors, the sampler's draws, Ctrl-C, what abandoned
iterators leave behind) is in test_engines.py; resuming, in test_resume.py."""

from __future__ import annotations

import asyncio
import gc
import pickle
import random
import threading
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _children import no_worker_threads_within, worker_threads
from _datasets import (
    AllAtOnce,
    AsyncBatches,
    AsyncFailing,
    AsyncSquares,
    AsyncStuck,
    Concurrent,
    CountsFetches,
    InfoReport,
    RngReport,
    Squares,
    UnpicklableDataset,
    WhoBegan,
    ZeroWaitsForTheRest,
    failing_init,
)
from _samplers import read_past_errors

import rloader

from _compare import same

pytestmark = pytest.mark.timeout(120)

THREADS = dict(worker_type="thread")


def test_batches_are_handed_over_without_shared_memory():
    # Process workers' batches live in shared memory; a thread's batch is the one it made.
    batch = next(iter(rloader.DataLoader(Squares(8), batch_size=4, num_workers=2, **THREADS)))
    assert not batch["x"].is_shared()
    process_batch = next(iter(rloader.DataLoader(Squares(8), batch_size=4, num_workers=2)))
    assert same(batch, process_batch)


def test_out_of_order_hands_out_what_is_ready():
    loader = rloader.DataLoader(
        ZeroWaitsForTheRest(4),
        batch_size=None,
        num_workers=4,
        prefetch_factor=1,
        in_order=False,
        **THREADS,
    )
    out = list(loader)
    assert sorted(out) == [0, 1, 2, 3] and out[-1] == 0
    in_order = rloader.DataLoader(
        ZeroWaitsForTheRest(4), batch_size=None, num_workers=4, prefetch_factor=1, **THREADS
    )
    assert list(in_order) == [0, 1, 2, 3]


def test_workers_fetch_at_the_same_time_without_holding_the_gil_while_waiting():
    # 8 threads each inside __getitem__ at once: a worker waiting (here on a barrier, as on
    # I/O) does not keep the others out.
    loader = rloader.DataLoader(Concurrent(32, 8), batch_size=None, num_workers=8, **THREADS)
    assert list(loader) == list(range(32))


def test_get_worker_info_is_each_threads_own():
    torch.manual_seed(123)
    theirs = list(tud.DataLoader(InfoReport(), batch_size=None, num_workers=2))
    torch.manual_seed(123)
    ours = list(rloader.DataLoader(InfoReport(), batch_size=None, num_workers=2, **THREADS))
    # The same ids and seeds as torch's worker processes (base seed from the same RNG state).
    assert [r[1:4] for r in ours] == [r[1:4] for r in theirs]
    assert all(r[0] and r[4] == "thread" and r[5] and r[6] for r in ours)
    # The main thread is no worker, during an epoch and after.
    it = iter(rloader.DataLoader(InfoReport(), batch_size=None, num_workers=2, **THREADS))
    next(it)
    assert tud.get_worker_info() is None and rloader.get_worker_info() is None
    del it
    assert tud.get_worker_info() is None


def test_each_thread_has_generators_of_its_own_and_the_global_ones_are_left_alone():
    def run(seed):
        torch.manual_seed(seed)
        loader = rloader.DataLoader(RngReport(), batch_size=None, num_workers=2, **THREADS)
        return sorted(list(loader))

    random.seed(5)
    np.random.seed(5)
    before = (random.getstate(), np.random.get_state()[1].tolist())
    first = run(1)
    assert (random.getstate(), np.random.get_state()[1].tolist()) == before
    assert first == run(1)  # reproducible from the seed
    assert first != run(2)
    by_worker = {w: [row[1:4] for row in first if row[0] == w] for w in (0, 1)}
    assert by_worker[0] != by_worker[1]  # seeded per worker
    # Seeded as a worker process seeds the global ones: random's and torch's with its seed.
    assert all(row[4] for row in first)


def test_nothing_is_pickled_on_the_way_to_a_thread():
    with pytest.raises(TypeError):
        pickle.dumps(UnpicklableDataset())
    keys = [lambda i=i: i * 10 for i in range(6)]
    loader = rloader.DataLoader(
        UnpicklableDataset(), batch_size=2, sampler=keys, num_workers=2, **THREADS
    )
    assert [b.tolist() for b in loader] == [[0, 10], [20, 30], [40, 50]]


def pin_stand_in(loader):
    """Stands in for pinning on a machine without an accelerator: records the thread each
    batch was pinned on (test_pin_thread.py does the same for processes)."""
    if not loader.pin_memory:
        return None

    def pin(batch):
        batch["pinned_on"] = threading.current_thread().name
        return batch

    return pin


def test_pin_memory_pins_on_the_worker_threads(monkeypatch):
    monkeypatch.setattr(rloader._pinning.policy, "pin_plan", pin_stand_in)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0, raising=False)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: None, raising=False)
    loader = rloader.DataLoader(Squares(8), batch_size=2, num_workers=2, pin_memory=True, **THREADS)
    out = list(loader)
    assert [b["i"].tolist() for b in out] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(b["pinned_on"] != threading.main_thread().name for b in out)


@pytest.mark.parametrize("how", ["del", "break"])
def test_leaving_early_does_not_load_the_rest_of_the_prefetch_window(how):
    # 2 workers x prefetch 2 x 8 samples are in flight when the loop leaves: at most the
    # sample each worker is inside is finished, nothing more is started for no one.
    dataset = CountsFetches()
    loader = rloader.DataLoader(dataset, batch_size=8, num_workers=2, **THREADS)
    it = iter(loader)
    next(it)
    if how == "del":
        before = dataset.calls[0]
        del it
    else:
        for _ in it:
            before = dataset.calls[0]
            break
        del it
    after = dataset.calls[0]
    assert after - before <= 2, (before, after)
    assert not worker_threads()


def test_argument_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="worker_type must be 'process' or 'thread'"):
        rloader.DataLoader(Squares(), num_workers=2, worker_type="fiber")
    with pytest.raises(ValueError, match="starts none: its workers are threads"):
        rloader.DataLoader(Squares(), num_workers=2, multiprocessing_context="spawn", **THREADS)
    # Set after the loader was made: checked when it is iterated.
    loader = rloader.DataLoader(Squares(), num_workers=2)
    loader.worker_type = "threadz"
    with pytest.raises(ValueError, match="worker_type must be"):
        iter(loader)
    loader = rloader.DataLoader(Squares(), num_workers=2, **THREADS)
    loader.multiprocessing_context = "spawn"
    with pytest.raises(ValueError, match="starts none"):
        iter(loader)


def test_many_threads_are_no_warning():
    # torch's warning counts worker processes against the CPU cores; threads waiting on I/O
    # are meant to outnumber them.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = rloader.DataLoader(Squares(8), num_workers=32, **THREADS)
        assert len(list(loader)) == 8


# ---------------------------------------------------------------- async datasets


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # torch's, 3 workers
@pytest.mark.parametrize("dataset", [AsyncSquares, AsyncBatches])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
        dict(batch_size=5, drop_last=True, in_order=False),
        dict(batch_size=3, prefetch_factor=1, num_workers=3),
        dict(batch_sampler=[[3, 1], [0], [5, 6, 7]]),
    ],
)
def test_async_datasets_give_the_batches_of_their_sync_twin(dataset, kwargs):
    kwargs = {"num_workers": 2, **kwargs}
    theirs = list(tud.DataLoader(Squares(), **kwargs))
    ours = list(rloader.DataLoader(dataset(), **kwargs, **THREADS))
    if kwargs.get("in_order", True):
        assert same(ours, theirs)
    else:
        key = lambda b: b["i"].tolist()  # noqa: E731
        assert same(sorted(ours, key=key), sorted(theirs, key=key))


def test_async_dataset_without_batching():
    theirs = list(tud.DataLoader(Squares(9), batch_size=None, num_workers=2))
    ours = list(rloader.DataLoader(AsyncSquares(9), batch_size=None, num_workers=2, **THREADS))
    assert same(ours, theirs)


def test_async_datasets_keep_every_sample_of_the_prefetch_window_in_flight():
    # prefetch_factor * batch_size * num_workers = 2 * 8 * 2 samples awaited at once, on two
    # threads.
    loader = rloader.DataLoader(
        AllAtOnce(32, 32), batch_size=8, num_workers=2, prefetch_factor=2, **THREADS
    )
    assert [x for b in loader for x in b.tolist()] == list(range(32))


def test_async_errors_reraise_as_worker_errors():
    with pytest.raises(ValueError) as ours:
        list(rloader.DataLoader(AsyncFailing(), batch_size=2, num_workers=2, **THREADS))
    text = str(ours.value)
    assert text.startswith("Caught ValueError in DataLoader worker thread 0.")
    assert "sample 5 is broken" in text and "Traceback" in text
    loader = rloader.DataLoader(AsyncFailing(), batch_size=2, num_workers=2, **THREADS)
    assert [b if isinstance(b, str) else b.tolist() for b in read_past_errors(loader)] == [
        [0, 1],
        [2, 3],
        "ValueError",
        [6, 7],
    ]
    with pytest.raises(KeyError, match="in DataLoader worker thread"):
        list(
            rloader.DataLoader(
                AsyncSquares(), num_workers=2, worker_init_fn=failing_init, **THREADS
            )
        )


ELSEWHERE = {
    "main": (dict(num_workers=0), "num_workers=0 calls it in the main process"),
    "processes": (dict(num_workers=1), "worker processes call it"),
    "auto": (dict(num_workers="auto", worker_type="auto"), "num_workers='auto' starts in"),
}


@pytest.mark.parametrize(
    "dataset, method", [(AsyncSquares, "__getitem__"), (AsyncBatches, "__getitems__")]
)
@pytest.mark.parametrize("engine", ELSEWHERE.values(), ids=ELSEWHERE.keys())
def test_async_datasets_outside_thread_workers_say_to_use_them(dataset, method, engine):
    # torch hands the coroutines to default_collate, which raises a TypeError and leaves them
    # unawaited. rloader raises torch's type at iter(), before any sample is asked for (no
    # coroutine made, none unawaited), saying what to do.
    kwargs, where = engine
    torch_kwargs = dict(num_workers=0) if kwargs["num_workers"] == "auto" else kwargs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # torch's coroutines, never awaited
        with pytest.raises(TypeError):
            list(tud.DataLoader(dataset(8), batch_size=4, **torch_kwargs))
        gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError) as ours:
            iter(rloader.DataLoader(dataset(8), batch_size=4, **kwargs))
        gc.collect()
    text = str(ours.value)
    assert text.startswith(f"{dataset.__name__}.{method} is 'async def'"), text
    assert where in text and "worker_type='thread' with a fixed num_workers > 0" in text, text
    assert [str(w.message) for w in caught] == []


def awaited_then_collated(coroutines):
    """A collate_fn that awaits an async dataset's samples itself."""

    async def gather():
        return await asyncio.gather(*coroutines)

    return tud.default_collate(asyncio.run(gather()))


@pytest.mark.parametrize("engine", ["main", "process"], indirect=True)
def test_async_datasets_go_to_a_users_collate_fn_as_in_torch(engine):
    # Only default_collate is refused: another collate_fn is given the coroutines, as torch
    # gives them.
    kwargs = engine.kwargs(batch_size=4, collate_fn=awaited_then_collated)
    theirs = list(tud.DataLoader(AsyncSquares(10), **engine.torch_kwargs(**kwargs)))
    assert same(list(rloader.DataLoader(AsyncSquares(10), **kwargs)), theirs)
    assert same(theirs, list(tud.DataLoader(Squares(10), batch_size=4)))


def test_async_timeout_and_no_threads_left_behind():
    assert no_worker_threads_within()
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.5 seconds"):
        list(rloader.DataLoader(AsyncStuck(), num_workers=2, timeout=0.5, **THREADS))
    gc.collect()
    assert no_worker_threads_within()  # the stuck samples were cancelled with their loops
    loader = rloader.DataLoader(AsyncSquares(40), batch_size=2, num_workers=2, **THREADS)
    for _ in range(10):
        it = iter(loader)
        next(it)
        del it
    assert no_worker_threads_within()


# ---------------------------------------------------------------- the first batch (NOTE [Thread start])


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_the_first_batch_is_made_by_worker_0_alone():
    dataset = WhoBegan(64, batch_size=4)
    loader = rloader.DataLoader(dataset, batch_size=4, num_workers=4, worker_type="thread")
    it = iter(loader)
    it._first_batch_grace = 3600.0  # (no clock: the others wait for the first batch)
    first = next(it)
    assert dataset.at_first_batch == [[0]]
    assert same([first, *it], list(tud.DataLoader(WhoBegan(64, 4), batch_size=4, num_workers=4)))
    assert sorted(dataset.began) == [0, 1, 2, 3]


def test_a_slow_first_batch_lets_the_other_workers_start():
    # Worker 0's first sample waits for another worker to begin: only the grace lets one.
    dataset = WhoBegan(64, batch_size=4, wait_for_another=True)
    loader = rloader.DataLoader(dataset, batch_size=4, num_workers=2, worker_type="thread")
    assert same(list(loader), list(tud.DataLoader(WhoBegan(64, 4), batch_size=4, num_workers=2)))
    assert dataset.waited == [True]
