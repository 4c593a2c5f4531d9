"""DataLoader.stats(): where an epoch's time went. Each stage's time is checked against work
of a known least duration (sleeps), so the bounds hold however loaded the machine is."""

from __future__ import annotations

import time

import pytest
import torch
import torch.utils.data as tud
from _datasets import AsyncSleepy, BurnsCpu, Sleepy, SlowThenQuick
from _samplers import SlowEpochThenQuick

import rloader

pytestmark = pytest.mark.timeout(120)

SLEEP = 0.005


def slow_collate(batch):
    time.sleep(SLEEP)
    return tud.default_collate(batch)


def run(loader, pause=SLEEP):
    n = 0
    for _ in loader:
        time.sleep(pause)  # the training step
        n += 1
    return n


SLOW = 0.05


def slow_then_quick_collate(batch):
    if batch[0][1] < 16:
        time.sleep(SLOW)
    return tud.default_collate(batch)


@pytest.mark.parametrize(
    "engine, persistent",
    [("main", False), ("thread", False), ("process", True), ("process", False)],
    ids=["single", "threads", "processes", "new-processes-each-epoch"],
    indirect=["engine"],
)
def test_stages_add_up_what_happened(engine, persistent):
    kwargs = engine.kwargs(persistent_workers=persistent)
    loader = rloader.DataLoader(
        SlowThenQuick(SLOW),
        batch_size=4,
        sampler=SlowEpochThenQuick(),
        collate_fn=slow_then_quick_collate,
        **kwargs,
    )
    assert loader.stats() is None  # no epoch yet
    epochs = []
    for _ in range(2):  # the second epoch counts afresh (persistent workers too)
        assert run(loader) == 4
        stats = loader.stats()
        epochs.append(stats)
        assert stats["batches"] == 4
        assert stats["waiting_for_user_s"] >= 3 * SLEEP  # between the 4 batches
        if engine.name != "process":
            assert stats["transport_s"] == 0.0
        else:  # taken in from other processes
            assert stats["transport_s"] > 0.0
        if engine.name == "main":  # the single-process loop does the work inside next()
            assert stats["waiting_for_data_s"] >= stats["fetch_s"] + stats["collate_s"]
        assert stats["pin_s"] == 0.0
    first, second = epochs
    # Every sample and every batch of the slow first epoch, summed over the workers (threads
    # or processes).
    assert first["fetch_s"] >= 16 * SLOW
    assert first["collate_s"] >= 4 * SLOW
    # The second epoch's samples and batches take no work: its stages, counted afresh, come to
    # less than the first's (counted on from the first, they would come to more).
    assert second["fetch_s"] < first["fetch_s"]
    assert second["collate_s"] < first["collate_s"]


def slow_pin(loader):
    if not loader.pin_memory:
        return None

    def pin(batch):
        time.sleep(SLEEP)
        return batch

    return pin


def test_pinning_is_counted_where_it_happens(engine, monkeypatch):
    # Stands in for pinning on a machine without an accelerator (as test_pin_thread.py does).
    monkeypatch.setattr(rloader._pinning.policy, "pin_plan", slow_pin)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0, raising=False)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: None, raising=False)
    loader = rloader.DataLoader(Sleepy(SLEEP), batch_size=4, pin_memory=True, **engine.kwargs())
    assert run(loader, pause=0) == 4
    assert loader.stats()["pin_s"] >= 4 * SLEEP


def test_a_loader_that_is_the_bottleneck_shows_it():
    # The dataset is slow (0.8 s of sleeps an epoch) and the loop does nothing: the loop waits
    # for data most of the time, however often a loaded machine stops it between batches.
    loader = rloader.DataLoader(SlowThenQuick(SLOW), batch_size=2, sampler=range(16))
    run(loader, pause=0)
    stats = loader.stats()
    assert stats["waiting_for_data_s"] > stats["waiting_for_user_s"]


def test_async_datasets_report_their_stages():
    loader = rloader.DataLoader(
        AsyncSleepy(SLEEP),
        batch_size=4,
        num_workers=2,
        worker_type="thread",
        collate_fn=slow_collate,
    )
    assert run(loader) == 4
    stats = loader.stats()
    assert stats["fetch_s"] >= 16 * SLEEP and stats["collate_s"] >= 4 * SLEEP


def test_thread_workers_count_their_own_cpu_time():
    # Each sample burns 5 ms of its thread's CPU: the pool's worker_cpu_s holds all of it (the
    # same clock, read around each whole batch), and no more than the batches' wall time.
    dataset = BurnsCpu(SLEEP)
    loader = rloader.DataLoader(dataset, batch_size=4, num_workers=2, worker_type="thread")
    assert run(loader, pause=0) == 4
    stats = loader.stats()
    burned = sum(dataset.burned)
    assert len(dataset.burned) == 16 and burned >= 16 * SLEEP
    assert burned <= stats["worker_cpu_s"]
    assert stats["worker_cpu_s"] <= stats["fetch_s"] + stats["collate_s"] + 0.002 * 4


def test_thread_workers_cpu_time_leaves_out_waits_and_the_other_threads(busy_thread):
    # The workers sleep 5 ms a sample while another thread of the process keeps a core busy
    # (as a training step's threads do): neither the sleeps nor that thread's CPU time are the
    # workers' (a process-wide clock counted both threads' time as the pool's).
    loader = rloader.DataLoader(
        Sleepy(SLEEP), batch_size=4, num_workers=2, worker_type="thread", persistent_workers=True
    )
    for _ in range(2):  # (a persistent pool's second epoch too)
        assert run(loader, pause=0) == 4
        stats = loader.stats()
        assert stats["fetch_s"] >= 16 * SLEEP
        assert 0 < stats["worker_cpu_s"] < 0.1 * stats["fetch_s"]
    assert busy_thread.is_alive()


@pytest.mark.parametrize("engine", ["main", "process"], indirect=True)
def test_only_thread_workers_report_their_cpu_time(engine):
    # (the main process's loop and worker processes have no worker threads; an async
    # dataset's threads run an event loop, not one batch at a time)
    loader = rloader.DataLoader(Sleepy(0), batch_size=4, **engine.kwargs())
    assert run(loader, pause=0) == 4
    assert "worker_cpu_s" not in loader.stats()
    asynchronous = rloader.DataLoader(
        AsyncSleepy(0), batch_size=4, num_workers=2, worker_type="thread"
    )
    assert run(asynchronous, pause=0) == 4
    assert "worker_cpu_s" not in asynchronous.stats()
