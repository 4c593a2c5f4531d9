"""The pin_memory thread of multi-process loading (python/rloader/_pinning/pin_thread.py, PinnedBatches).

This machine may have no accelerator, so torch would not pin at all: these tests stand a
recording function in for the pinning (``_pinning.policy.pin_plan``) and check the thread around it — which
thread pins, that results, errors, epochs and shutdown come through it as without it.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch
import torch.utils.data as tud
from _datasets import (
    BadAtTwo,
    CountedStream,
    DiesOnResume,
    IntTensors,
    RefersToItsLoader,
    ReportedFive,
    SlowAfterFirst,
    ThreeWorkerStream,
    UnevenStream,
)
from _samplers import CountingSampler, FailingSampler, ThreadRecordingSampler, read_past_errors

import rloader
from rloader import _compat

from _compare import same

pytestmark = [
    pytest.mark.timeout(120),
    # torch, with no accelerator here, warns that it will not pin
    pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true:UserWarning"),
]


@pytest.fixture
def pinning(monkeypatch):
    """Makes loaders with pin_memory=True "pin" by recording which thread saw each batch."""
    seen: list = []

    def pin(batch):
        seen.append(threading.current_thread().name)
        if isinstance(batch, torch.Tensor) and batch.numel() and int(batch.flatten()[0]) == 999:
            raise ValueError("cannot pin this batch")
        return batch.clone()

    monkeypatch.setattr(
        rloader._pinning.policy, "pin_plan", lambda loader: pin if loader.pin_memory else None
    )
    return seen


def test_batches_are_pinned_off_the_main_thread(pinning):
    ours = list(rloader.DataLoader(IntTensors(), batch_size=3, num_workers=2, pin_memory=True))
    assert same(ours, list(tud.DataLoader(IntTensors(), batch_size=3, num_workers=2)))
    assert pinning == ["rloader_pin_memory"] * 7


def test_worker_error_comes_through_the_thread(pinning):
    with pytest.raises(KeyError, match="sample 7 is missing") as err:
        list(rloader.DataLoader(IntTensors(bad=7), batch_size=2, num_workers=2, pin_memory=True))
    assert "in DataLoader worker process 1" in str(err.value)


def test_iteration_goes_on_after_a_worker_error_like_torch(pinning):
    ours = read_past_errors(
        rloader.DataLoader(IntTensors(bad=7), batch_size=2, num_workers=2, pin_memory=True)
    )
    theirs = read_past_errors(tud.DataLoader(IntTensors(bad=7), batch_size=2, num_workers=2))
    assert "KeyError" in theirs
    assert same(ours, theirs)


def test_pinning_error_names_the_pin_thread(pinning):
    dataset = [torch.tensor([999])] * 4
    with pytest.raises(ValueError, match="cannot pin this batch") as err:
        list(rloader.DataLoader(dataset, batch_size=2, num_workers=2, pin_memory=True))
    assert "in pin memory thread" in str(err.value)


def test_abandoned_iterator_stops_thread_and_workers(pinning):
    # Threads of earlier tests' iterators may still be ending (they were in `before`, gone
    # after): only this iterator's must not be left. Thread objects, not idents, which a new
    # thread may take over from one that ended.
    before = set(threading.enumerate())
    it = iter(rloader.DataLoader(IntTensors(200), batch_size=2, num_workers=2, pin_memory=True))
    next(it)
    procs = list(it._rloader_pool.procs)
    assert len(it) == 100
    assert set(threading.enumerate()) - before  # its pin thread
    del it
    assert not set(threading.enumerate()) - before
    assert all(p._closed for p in procs)  # joined and closed by the pool's shutdown


def test_persistent_workers_with_pinning(pinning):
    loader = rloader.DataLoader(
        IntTensors(), batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True
    )
    expected = list(tud.DataLoader(IntTensors(), batch_size=4))
    first = iter(loader)
    next(first)  # a new epoch before this one is read through
    for _ in range(2):
        assert same(list(loader), expected)
    loader._iterator._shutdown_workers()
    assert not loader._iterator._thread.is_alive()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to pin for real")
def test_worker_batches_are_pinned_for_real():
    loader = rloader.DataLoader(
        [(torch.ones(2), {"a": torch.zeros(1)})] * 4, batch_size=2, num_workers=2, pin_memory=True
    )
    for x, d in loader:
        assert x.is_pinned() and d["a"].is_pinned()


def test_timeout_counts_the_users_wait_not_the_pin_threads(pinning):
    # The worker takes 1.2 s a batch, longer than the timeout, but the user spends 1.5 s on
    # each batch and so never waits for one: as with torch, which times the main thread's
    # wait, that is no timeout.
    loader = rloader.DataLoader(
        SlowAfterFirst(3, 1.2), batch_size=1, num_workers=1, pin_memory=True, timeout=1.0
    )
    out = []
    for batch in loader:
        out.append(batch)
        threading.Event().wait(1.5)
    assert same(out, [torch.tensor([[0]]), torch.tensor([[1]]), torch.tensor([[2]])])


def test_a_late_batch_is_a_timeout_with_pinning_too(pinning):
    it = iter(
        rloader.DataLoader(
            SlowAfterFirst(3, 3.0), batch_size=1, num_workers=1, pin_memory=True, timeout=0.5
        )
    )
    assert same(next(it), torch.tensor([[0]]))
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0\.5 seconds$"):
        next(it)


# ---------------------------------------------------------------- the sampler, on the main thread
# NOTE [Key feed]: with pinning, the main thread still draws every batch of keys,
# keeping torch's account of the tasks in flight.


@pytest.mark.parametrize("persistent", [False, True])
def test_the_sampler_is_advanced_on_the_main_thread_as_with_torch(pinning, persistent):
    sampler = ThreadRecordingSampler(40)
    loader = rloader.DataLoader(
        IntTensors(40),
        batch_size=2,
        sampler=sampler,
        num_workers=2,
        pin_memory=True,
        persistent_workers=persistent,
    )
    for _ in range(2):  # a second epoch restarts the sampler (and, persistent, the same workers)
        sampler.threads.clear()
        assert same(list(loader), list(tud.DataLoader(IntTensors(40), batch_size=2, num_workers=2)))
        assert sampler.threads == ["MainThread"] * 40
    assert pinning and set(pinning) == {"rloader_pin_memory"}


@pytest.mark.parametrize("lib", ["torch", "rloader"])
def test_the_pin_thread_draws_keys_as_torch_draws_them(pinning, lib):
    # prefetch_factor * num_workers batches of keys in iter(), then one per batch handed out.
    sampler = CountingSampler(40)
    mod = tud if lib == "torch" else rloader
    it = iter(
        mod.DataLoader(
            IntTensors(40),
            batch_size=2,
            sampler=sampler,
            num_workers=2,
            prefetch_factor=3,
            pin_memory=True,
        )
    )
    drawn = [sampler.drawn]
    for _ in range(3):
        next(it)
        drawn.append(sampler.drawn)
    assert drawn == [12, 14, 16, 18]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("good, workers, prefetch", [(5, 2, 2), (1, 1, 1), (3, 1, 1), (2, 2, 1)])
def test_a_sampler_error_goes_to_the_user_through_the_pin_thread_as_with_torch(
    pinning, good, workers, prefetch
):
    # torch raises it from the next() whose batch triggered the draw (that batch is lost), then
    # yields what is in flight and ends the epoch once nothing is: never a hang.
    def read(lib):
        return read_past_errors(
            lib.DataLoader(
                IntTensors(10),
                batch_size=1,
                sampler=FailingSampler(good),
                num_workers=workers,
                prefetch_factor=prefetch,
                pin_memory=True,
            )
        )

    theirs = read(tud)
    assert "IndexError" in theirs
    assert same(read(rloader), theirs)


def test_a_sampler_error_in_iter_is_raised_from_iter(pinning):
    for lib in (tud, rloader):
        with pytest.raises(IndexError, match="sampler ran out of luck"):
            iter(
                lib.DataLoader(
                    IntTensors(10),
                    batch_size=1,
                    sampler=FailingSampler(2),
                    num_workers=2,
                    pin_memory=True,
                )
            )


def test_a_slow_consumer_with_nothing_in_flight_is_not_a_timeout(pinning):
    # One task in flight: while the user works on a batch, the pin thread has nothing to wait
    # for until the main thread draws the next keys. That is not the workers being late.
    loader = rloader.DataLoader(
        IntTensors(6), batch_size=2, num_workers=1, prefetch_factor=1, pin_memory=True, timeout=0.3
    )
    out = []
    for batch in loader:
        out.append(batch)
        threading.Event().wait(0.6)
    assert same(out, list(tud.DataLoader(IntTensors(6), batch_size=2, num_workers=1)))


def test_a_persistent_pinned_loader_goes_without_the_garbage_collector(pinning):
    # Nothing of the iterator refers back to the loader that holds it: dropping the loader
    # stops its thread and workers at once.
    gc.collect()
    gc.disable()
    try:
        loader = rloader.DataLoader(
            IntTensors(40), batch_size=2, num_workers=2, pin_memory=True, persistent_workers=True
        )
        it = iter(loader)
        next(it)
        thread, procs = it._thread, list(it._rloader_pool.procs)
        del it, loader
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert all(p._closed for p in procs)
    finally:
        gc.enable()


@pytest.mark.timeout(30)
def test_a_batch_that_fails_to_unpickle_is_that_batchs_error_with_pinning_too(pinning):
    loader = rloader.DataLoader(
        BadAtTwo(), batch_size=1, num_workers=2, collate_fn=first_as_tensor, pin_memory=True
    )
    expected = [torch.tensor([i]) if i != 2 else "ValueError" for i in range(8)]
    assert same(read_past_errors(loader), expected)


def first_as_tensor(batch):
    first = batch[0]
    return torch.tensor([first]) if isinstance(first, int) else first


def test_a_pinned_persistent_loader_in_a_reference_cycle_is_collected(pinning):
    sampler = RefersToItsLoader()
    loader = rloader.DataLoader(
        IntTensors(20),
        batch_size=2,
        sampler=sampler,
        num_workers=2,
        pin_memory=True,
        persistent_workers=True,
    )
    sampler.loader = loader
    it = iter(loader)
    next(it)
    thread, procs = it._thread, list(it._rloader_pool.procs)
    del it, loader, sampler
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert all(p._closed for p in procs)


def start_every_worker(it) -> None:
    """Starts the workers an rloader iterator has not started yet (NOTE [Staged start]: they
    start as their batches are awaited), as torch starts all of them in ``iter()``."""
    starter = getattr(it, "_starter", None)
    if starter is not None:
        starter.start_all()


def test_an_iterable_datasets_workers_run_as_far_ahead_as_with_torch(pinning):
    # Its tasks are "next batch" tokens, drawn on the main thread as torch puts its indices.
    import multiprocessing

    def produced_before_each_next(lib, **kwargs):
        produced = multiprocessing.get_context("fork").Value("i", 0)
        it = iter(
            lib.DataLoader(
                CountedStream(produced),
                batch_size=None,
                num_workers=2,
                multiprocessing_context="fork",
                **kwargs,
            )
        )
        start_every_worker(it)  # how far ahead they run, once running
        row = []
        for _ in range(4):
            threading.Event().wait(0.5)  # the workers fill what they may meanwhile
            row.append(produced.value)
            next(it)
        return row

    assert produced_before_each_next(rloader, pin_memory=True) == produced_before_each_next(tud)


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_dataset_ending_unevenly_gives_torchs_batches(pinning, persistent):
    def epochs(lib, **kwargs):
        loader = lib.DataLoader(
            UnevenStream(), batch_size=2, num_workers=2, persistent_workers=persistent, **kwargs
        )
        return [list(loader) for _ in range(2)]

    assert same(epochs(rloader, pin_memory=True), epochs(tud))


@pytest.mark.timeout(20)
def test_a_worker_dying_as_a_pinned_persistent_epoch_starts_is_reported(pinning):
    # The first epoch is read slowly, so the main thread drew tokens the pin thread never
    # sent; the new epoch must not take them for work to do (it used to spin, GIL held, and
    # never notice the dead worker).
    loader = rloader.DataLoader(
        DiesOnResume(), batch_size=2, num_workers=2, persistent_workers=True, pin_memory=True
    )
    for _ in loader:
        threading.Event().wait(0.2)
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"
    ) as err:
        list(loader)
    assert "exited unexpectedly with exit code 3" in str(err.value.__cause__)
    # The workers are gone; the next epoch starts new ones.
    DiesOnResume.calls = -10
    assert len(list(loader)) == 4


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.skipif(
    _compat.TORCH < "2.7",
    reason="torch before 2.7 hands in_order=False tasks "
    "round-robin; rloader keeps the newer rule (in_order=False promises no order)",
)
def test_out_of_order_tokens_no_worker_may_take_are_dropped_as_torch_drops_them(pinning):
    import multiprocessing

    def produced_before_each_next(lib, **kwargs):
        produced = multiprocessing.get_context("fork").Value("i", 0)
        it = iter(
            lib.DataLoader(
                ThreeWorkerStream(produced),
                batch_size=None,
                num_workers=3,
                prefetch_factor=1,
                in_order=False,
                multiprocessing_context="fork",
                **kwargs,
            )
        )
        start_every_worker(it)  # how far ahead they run, once running
        row = []
        while True:
            threading.Event().wait(0.3)  # the workers fill what they may meanwhile
            before = produced.value
            try:
                next(it)
            except StopIteration:
                return row
            row.append(before)

    assert produced_before_each_next(rloader, pin_memory=True) == produced_before_each_next(tud)


@pytest.mark.parametrize("persistent", [False, True])
def test_the_iterable_length_warning_is_torchs_with_pinning_too(pinning, persistent):
    import warnings

    def warned(lib):
        loader = lib.DataLoader(
            ReportedFive(),
            batch_size=1,
            num_workers=2,
            pin_memory=True,
            persistent_workers=persistent,
        )
        len(loader)
        seen = []
        for _epoch in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count = len(list(loader))
            seen.append(
                (count, [str(w.message) for w in caught if "IterableDataset" in str(w.message)])
            )
        return seen

    expected = warned(tud)  # torch warns the same with or without an accelerator to pin for
    assert warned(rloader) == expected
    assert pinning and expected[0][1]  # the batches went through the pin thread, and it warns
