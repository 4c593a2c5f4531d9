"""Worker processes' batches pinned where they arrive (NOTE [Pinned slots] in rloader-workers'
pinned.rs): slots registered with the driver, and freed only once the device has read them.

On the CPU a stand-in driver (``_pinning.cuda_host.slot_pinning``) records registrations and hands out
events that complete when the test says so; the tests at the end run on a real GPU.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import warnings

import pytest
import torch
import torch.utils.data as tud
from _datasets import FilledTensors, FloatRows, GrowingRows, Slowed

import rloader
from rloader._pinning import cuda_host

from _compare import same
from _pinning import Driver, Event, slow_stream_reads

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true:UserWarning"),
]


@pytest.fixture
def driver(monkeypatch):
    return Driver.installed(monkeypatch)


def loader_of(dataset, **kwargs):
    kwargs = {"batch_size": 16, "num_workers": 2, "pin_memory": True, **kwargs}
    return rloader.DataLoader(dataset, **kwargs)


def region_of(it):
    return it._rloader_pool.region


def test_batches_lie_in_registered_ranges_of_the_region(driver):
    loader = loader_of(FloatRows())
    it = iter(loader)
    batches = []
    for batch in it:
        assert driver.covers(batch.data_ptr(), batch.nbytes)
        base, length = region_of(it)._span
        assert base <= batch.data_ptr() and batch.data_ptr() + batch.nbytes <= base + length
        batches.append(batch.clone())
    assert same(batches, list(tud.DataLoader(FloatRows(), batch_size=16)))
    # Two workers, each with its own slots: registered once each, not per batch.
    assert 0 < driver.registrations <= len(driver.ranges) <= 2 * (loader.prefetch_factor + 3)


def test_a_dropped_batchs_slot_is_not_overwritten_until_its_event_completes(driver):
    driver.events_done = False  # the "device" has not read anything yet
    # 24 batches: more than the 2 × 5 slots of the two workers.
    loader = loader_of(FloatRows(384), persistent_workers=True)
    it = iter(loader)
    dropped = []  # (address, bytes, what the device should read there)
    for batch in it:
        if driver.covers(batch.data_ptr(), batch.nbytes):
            dropped.append((batch.data_ptr(), batch.nbytes, batch.numpy().tobytes()))
        del batch  # released: parked behind its event
    in_slots, inline = it._source._transport_counts
    assert dropped and inline > 0  # once every slot was parked, workers sent batches inline
    # Every parked slot still holds the batch the "device" has not read yet.
    for addr, nbytes, expected in dropped:
        assert ctypes.string_at(addr, nbytes) == expected
    parked, _ = region_of(it)._pinned_counts
    assert parked == len(dropped)
    # The device catches up: the slots go back to their workers at the next poll.
    for event in driver.events:
        event.done = True
    driver.events_done = True
    second = [b.clone() for b in loader]
    assert same(second, list(tud.DataLoader(FloatRows(384), batch_size=16)))
    assert region_of(it)._pinned_counts[0] == 0
    in_slots_after, inline_after = loader._iterator._source._transport_counts
    assert in_slots_after > 0


def test_a_batch_is_released_on_the_thread_that_drops_it_not_the_pin_thread(driver):
    # The event goes on the current stream of the thread that lets go of the batch: that must
    # be the user's thread, which queued the copies, even when the pin thread is waiting for
    # slow workers right after handing the batch over.
    threads = []
    fence = driver.fence
    driver.fence = lambda: (threads.append(threading.current_thread().name), fence())[1]
    for batch in loader_of(Slowed(FloatRows(128)), batch_size=4):
        del batch
    assert threads and set(threads) == {threading.current_thread().name}


def test_slot_registrations_are_undone_and_events_waited_for_when_the_loader_goes(driver):
    driver.events_done = False
    loader = loader_of(FloatRows())
    for batch in loader:
        del batch  # released at once
    assert driver.ranges
    pending = [e for e in driver.events if not e.done]
    assert pending
    del loader
    gc.collect()
    assert driver.ranges == {}
    assert all(e.synchronized for e in pending)


def test_a_batch_the_user_keeps_holds_the_registration(driver):
    loader = loader_of(FloatRows(32), batch_size=16)
    kept = next(iter(loader))
    expected = kept.clone()
    del loader
    gc.collect()
    assert driver.covers(kept.data_ptr(), kept.nbytes)  # still registered, still mapped
    assert torch.equal(kept, expected)
    del kept
    gc.collect()
    assert driver.ranges == {}


def test_a_slot_whose_batches_outgrow_its_registration_is_registered_again(driver):
    batches = [b.clone() for b in loader_of(GrowingRows(), batch_size=4, collate_fn=torch.cat)]
    assert same(batches, list(tud.DataLoader(GrowingRows(), batch_size=4, collate_fn=torch.cat)))
    assert driver.registrations > len(driver.ranges)  # some were replaced by larger ones


def test_a_refused_registration_warns_and_batches_are_copied_as_before(driver):
    driver.refuse = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b.clone() for b in loader_of(FloatRows())]
    assert same(batches, list(tud.DataLoader(FloatRows(), batch_size=16)))
    texts = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(texts) == 1 and "could not pin batches where they are" in texts[0]
    assert driver.events == []  # nothing is fenced without a registration


def test_slots_registered_before_a_refusal_are_still_fenced(driver):
    # Two slots are registered, then the driver refuses: batches in those two still read as
    # pinned (they are not copied), so they must still wait for their events.
    driver.refuse_after = 2
    driver.events_done = False
    loader = loader_of(FloatRows(384), persistent_workers=True)
    it = iter(loader)
    dropped = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for batch in it:
            if driver.covers(batch.data_ptr(), batch.nbytes):
                dropped.append((batch.data_ptr(), batch.nbytes, batch.numpy().tobytes()))
            del batch
    assert len(driver.ranges) == 2 and len(dropped) == 2  # each registered slot used once
    for addr, nbytes, expected in dropped:
        assert ctypes.string_at(addr, nbytes) == expected


def test_a_slot_outgrowing_its_range_after_a_refusal_is_unregistered(driver):
    # A batch must never lie half in a registered range: it would read as pinned.
    driver.refuse_after = 2
    loader = loader_of(GrowingRows(), batch_size=4, collate_fn=torch.cat, num_workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for batch in loader:
            inside = [
                driver.covers(batch.data_ptr(), 1),
                driver.covers(batch.data_ptr(), batch.nbytes),
            ]
            assert inside[0] == inside[1]
    assert driver.registrations == 2


def test_without_pin_memory_nothing_is_registered(driver):
    list(loader_of(FloatRows(), pin_memory=False))
    assert driver.registrations == 0 and driver.events == []


# ------------------------------------------------------------------------- on a real GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_worker_batches_are_pinned_where_they_arrive_on_cuda():
    loader = loader_of(FilledTensors(), batch_size=64, num_workers=4)
    it = iter(loader)
    base, length = region_of(it)._span
    for batch in it:
        assert batch.is_pinned()
        assert base <= batch.data_ptr() < base + length  # not copied
    del it, loader
    gc.collect()


@cuda
@pytest.mark.parametrize("how", ["side stream", "default stream", "waited-for side stream"])
def test_a_dropped_batch_is_read_by_a_slow_device_stream_before_it_is_overwritten(how):
    # ~10 ms of spinning per batch (at ~2 GHz): the workers refill a freed slot far sooner.
    loader = loader_of(FilledTensors(), batch_size=64, num_workers=4)
    assert slow_stream_reads(loader, FilledTensors(), 20_000_000, how) == 0


@cuda
def test_the_slow_stream_test_sees_overwritten_batches_without_the_fence(monkeypatch):
    # The check above can fail: with fences that say "done" at once, slots are reused while
    # the device has not read them yet.
    register, unregister, _ = cuda_host.slot_pinning()
    monkeypatch.setattr(
        cuda_host, "slot_pinning", lambda: (register, unregister, lambda: Event(True))
    )
    loader = loader_of(FilledTensors(), batch_size=64, num_workers=4)
    assert slow_stream_reads(loader, FilledTensors(), 20_000_000) > 0
