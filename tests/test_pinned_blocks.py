"""Batches of thread workers and of the single-process loop pinned where they are collated
(NOTE [Pinned blocks] in rloader-memory): the loader's recycled batch blocks
registered with the driver, and reused only once the device has read them.

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
from _datasets import (
    ByteArrays,
    ChannelsLast,
    FilledArrays,
    FilledTensors,
    Slowed,
    VaryingArrays,
    Vectors,
)
from _engines import Engine

import rloader
from rloader._loader_record import record_of
from rloader._pinning import cuda_host

from _compare import same
from _pinning import Driver, Event, slow_stream_reads

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true:UserWarning"),
]

# The single-process loop and thread workers: both collate into the loader's batch blocks
# (worker processes into pinned slots: test_pinned_slots.py).
BLOCK_ENGINES = pytest.mark.parametrize("engine", ["main", "thread"], indirect=True)


@pytest.fixture
def driver(monkeypatch):
    return Driver.installed(monkeypatch)


def loader_of(dataset, engine: Engine, **kwargs):
    return rloader.DataLoader(
        dataset, **engine.kwargs(**{"batch_size": 16, "pin_memory": True, **kwargs})
    )


def torchs(dataset, batch_size: int = 16) -> list:
    return list(tud.DataLoader(dataset, batch_size=batch_size))


@BLOCK_ENGINES
def test_batches_lie_in_registered_blocks(driver, engine):
    loader = loader_of(ByteArrays(384), engine)
    batches = []
    for batch in loader:
        assert driver.covers(batch.data_ptr(), batch.nbytes)
        batches.append(batch.clone())
    assert same(batches, torchs(ByteArrays(384)))
    # Blocks are registered when first used, not per batch.
    assert 0 < driver.registrations < len(batches)


@BLOCK_ENGINES
def test_a_dropped_batchs_block_is_not_reused_until_its_event_completes(driver, engine):
    driver.events_done = False  # the "device" has not read anything yet
    loader = loader_of(ByteArrays(), engine)
    dropped = []  # (address, bytes, what the device should read there, its event)
    for batch in loader:
        assert driver.covers(batch.data_ptr(), batch.nbytes)
        for addr, _, _, event in dropped:
            # A block comes back only once its event is done (here: waited for, when more
            # blocks were free than the loader ever had out and the oldest was let go).
            assert addr != batch.data_ptr() or event.done
        dropped.append((batch.data_ptr(), batch.nbytes, batch.numpy().tobytes(), None))
        del batch  # released: its block waits for its event
        dropped[-1] = (*dropped[-1][:3], driver.events[-1])
    pending = [(addr, n, expected) for addr, n, expected, event in dropped if not event.done]
    assert len(pending) >= 3
    for addr, nbytes, expected in pending:
        assert ctypes.string_at(addr, nbytes) == expected
    # The device catches up: the next epoch reuses the blocks (a thread pool may have one more
    # batch out at once than before, which takes a new block).
    for event in driver.events:
        event.done = True
    driver.events_done = True
    registered = driver.registrations
    second = []
    for batch in loader:
        second.append(batch.clone())
        del batch
    assert same(second, torchs(ByteArrays()))
    assert driver.registrations - registered <= 1


@BLOCK_ENGINES
def test_batches_the_user_keeps_are_never_overwritten(driver, engine):
    loader = loader_of(ByteArrays(), engine)
    kept = list(loader)
    assert same(kept, torchs(ByteArrays()))
    del loader
    gc.collect()
    assert all(driver.covers(b.data_ptr(), b.nbytes) for b in kept), "still registered"
    assert same(kept, torchs(ByteArrays()))
    del kept
    gc.collect()
    assert driver.ranges == {}


@BLOCK_ENGINES
def test_stacked_tensor_batches_lie_in_registered_blocks(driver, engine):
    batches = []
    for batch in loader_of(Vectors(), engine):
        assert driver.covers(batch.data_ptr(), batch.nbytes)
        assert (batch._base, batch._version) == (None, 0)  # as torch.stack's own batch
        batches.append(batch.clone())
    assert same(batches, torchs(Vectors()))


@BLOCK_ENGINES
def test_tensor_batches_torch_would_promote_are_stacked_as_torch_does(driver, engine):
    # Mixed dtypes: torch.stack promotes to float64, which a float32 block would cast away.
    mixed = Vectors(dtypes=(torch.float32, torch.float64))
    batches = list(loader_of(mixed, engine))
    assert all(b.dtype == torch.float64 for b in batches)
    assert not any(driver.covers(b.data_ptr(), 1) for b in batches)
    assert same(batches, torchs(mixed))


def test_tensor_batches_that_require_grad_are_stacked_as_torch_does(driver):
    # torch.stack(out=...) refuses inputs that require grad; torch's own stack keeps the graph.
    grad = Vectors(grad=True)
    ours, theirs = list(loader_of(grad, Engine("main"))), torchs(grad)
    assert all(b.requires_grad and b.grad_fn is not None for b in ours)
    assert [b.grad_fn.name() for b in ours] == [b.grad_fn.name() for b in theirs]
    assert same([b.detach() for b in ours], [b.detach() for b in theirs])


@BLOCK_ENGINES
def test_tensor_batches_keep_the_memory_format_torch_gives_them(driver, engine):
    ours, theirs = list(loader_of(ChannelsLast(), engine)), torchs(ChannelsLast())
    assert [b.stride() for b in ours] == [b.stride() for b in theirs]
    assert not theirs[0].is_contiguous()
    assert same(ours, theirs)


@BLOCK_ENGINES
def test_batches_of_varying_sizes_share_registered_blocks(driver, engine):
    batches = [b.clone() for b in loader_of(VaryingArrays(), engine)]
    assert same(batches, torchs(VaryingArrays()))
    # Blocks come in size classes (an eighth of the power of two above): 256 KiB, and 320 KiB
    # for the five larger sizes. Exact sizes would register at least one block per size.
    assert driver.registrations < 6 if engine.name == "main" else driver.registrations <= 12
    assert {n for n in driver.ranges.values()} <= {256 << 10, 320 << 10}


@BLOCK_ENGINES
def test_block_registrations_are_undone_and_events_waited_for_when_the_loader_goes(driver, engine):
    driver.events_done = False
    loader = loader_of(ByteArrays(), engine)
    for batch in loader:
        del batch
    pending = [e for e in driver.events if not e.done]
    assert driver.ranges and pending
    del loader
    gc.collect()
    assert driver.ranges == {}
    assert all(e.synchronized for e in pending)


@BLOCK_ENGINES
def test_a_batch_freed_while_an_exception_unwinds_is_fenced_and_the_exception_kept(driver, engine):
    driver.events_done = False
    it = iter(loader_of(ByteArrays(), engine))
    seen = []

    def next_batch():
        batch = next(it)
        seen.append((batch.data_ptr(), batch.nbytes, batch.numpy().tobytes()))
        return batch

    def fails():
        # The batch is only on the value stack: it is freed as the ZeroDivisionError unwinds,
        # with the exception set.
        return [next_batch(), 1 / 0]

    with pytest.raises(ZeroDivisionError):
        fails()
    assert len(driver.events) == 1, "its block waits for the device"
    second = next(it)
    addr, nbytes, expected = seen[0]
    assert second.data_ptr() != addr
    assert ctypes.string_at(addr, nbytes) == expected, "and is not written meanwhile"
    rest = [second.clone()] + [b.clone() for b in it]
    assert same(rest, torchs(ByteArrays())[1:])


def test_a_thread_workers_batch_is_released_on_the_thread_that_drops_it(driver):
    threads = []
    fence = driver.fence
    driver.fence = lambda: (threads.append(threading.current_thread().name), fence())[1]
    # 128 KiB batches: in a block
    for batch in loader_of(Slowed(ByteArrays(64)), Engine("thread"), batch_size=8):
        del batch
    assert threads and set(threads) == {threading.current_thread().name}


@BLOCK_ENGINES
def test_a_refused_registration_warns_once_and_batches_are_copied_as_before(driver, engine):
    driver.refuse = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [b.clone() for b in loader_of(ByteArrays(), engine)]
    assert same(batches, torchs(ByteArrays()))
    texts = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(texts) == 1 and "could not pin batches where they are" in texts[0]
    assert driver.events == []  # nothing is fenced without a registration


@BLOCK_ENGINES
def test_without_pin_memory_nothing_is_registered_and_turning_it_off_unpins(driver, engine):
    list(loader_of(ByteArrays(), engine, pin_memory=False))
    assert driver.registrations == 0 and driver.events == []
    loader = loader_of(ByteArrays(), engine)
    list(loader)
    assert driver.ranges
    loader.pin_memory = False  # torch lets it change between epochs
    for batch in loader:
        assert not driver.covers(batch.data_ptr(), 1)
    gc.collect()
    assert driver.ranges == {}, "the pinned blocks went with the memory they belonged to"


# ------------------------------------------------------------------------- on a real GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


DATA = [FilledArrays, FilledTensors]
DATA_IDS = ["arrays", "tensors"]


@cuda
@pytest.mark.parametrize("data", DATA, ids=DATA_IDS)
@BLOCK_ENGINES
def test_batches_are_pinned_where_they_are_collated_on_cuda(engine, data):
    loader = loader_of(data(), engine, batch_size=64)
    for batch in loader:
        assert batch.is_pinned()
        assert record_of(loader).buffers._pinned
    assert same([b.clone() for b in loader], torchs(data(), 64))


@cuda
@pytest.mark.parametrize("data", DATA, ids=DATA_IDS)
@BLOCK_ENGINES
@pytest.mark.parametrize("how", ["side stream", "default stream", "waited-for side stream"])
def test_a_dropped_batch_is_read_by_a_slow_device_stream_before_its_block_is_reused(
    engine, how, data
):
    loader = loader_of(data(), engine, batch_size=64)
    assert slow_stream_reads(loader, data(), 20_000_000, how) == 0


@cuda
@pytest.mark.parametrize("data", DATA, ids=DATA_IDS)
@BLOCK_ENGINES
def test_the_slow_stream_test_sees_overwritten_blocks_without_the_fence(monkeypatch, engine, data):
    # The check above can fail: with fences that say "done" at once, blocks are reused while
    # the device has not read them yet.
    register, unregister, _ = cuda_host.slot_pinning()
    monkeypatch.setattr(
        cuda_host, "slot_pinning", lambda: (register, unregister, lambda: Event(True))
    )
    loader = loader_of(data(), engine, batch_size=64)
    assert slow_stream_reads(loader, data(), 20_000_000) > 0
