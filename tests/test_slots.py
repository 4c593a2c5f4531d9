"""Batches in reused shared-memory slots (NOTE [Slots] in rust/rloader-workers/src/slots.rs).

A worker collates into a slot, the main process builds the batch's tensors over the same memory,
and the slot goes back to the worker once the user has dropped the batch. These tests check the
hand-off is used, that slots are reused, and that nothing a user or a worker still holds is ever
overwritten.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.utils.data as tud
from _datasets import MiBRows

import rloader
from _compare import same
from _datasets import SamplesOfKind

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["tensor", "numpy", "mixed"])
def test_batches_travel_in_slots_and_slots_are_reused(kind):
    ds = SamplesOfKind(400, kind)
    expected = list(tud.DataLoader(ds, batch_size=4, num_workers=2))
    it = iter(rloader.DataLoader(ds, batch_size=4, num_workers=2))
    for batch, want in zip(it, expected):
        assert same(batch, want)
    in_slots, inline = it._transport_counts
    # 100 batches through 2 x 5 slots: only reuse keeps them in slots. A batch may still come
    # inline when a worker outruns the main process's last drop (a race of timing, not of
    # correctness), so a couple are allowed.
    assert inline <= 4, (in_slots, inline)
    assert in_slots >= 100


def test_a_user_holding_every_batch_gets_correct_batches():
    ds = SamplesOfKind(400, "tensor")
    expected = list(tud.DataLoader(ds, batch_size=4, num_workers=2))
    it = iter(rloader.DataLoader(ds, batch_size=4, num_workers=2))
    held = list(it)
    in_slots, inline = it._transport_counts
    assert in_slots > 0 and inline > 0, (in_slots, inline)  # slots ran out: some came inline
    del it
    gc.collect()
    assert same(held, expected)  # the slots' memory outlives the iterator while batches do


def test_slots_go_back_to_the_worker_when_the_user_drops_batches():
    ds = SamplesOfKind(800, "tensor")
    it = iter(rloader.DataLoader(ds, batch_size=4, num_workers=2))
    held = [next(it) for _ in range(30)]
    assert it._transport_counts[1] > 0
    del held
    gc.collect()
    for _ in range(10):  # batches made while every slot was held may come inline
        next(it)
    before = it._transport_counts
    for i, batch in enumerate(it):
        assert batch[1][0].item() == 4 * (40 + i)
    after = it._transport_counts
    assert after[1] - before[1] <= 4, (before, after)  # as in the first test
    assert after[0] - before[0] >= 2 * 150  # 160 batches, less those already received


class KeepTwoBack:
    """A collate_fn that keeps its last two default-collated batches and returns, with each
    batch, the one from two batches before."""

    def __init__(self) -> None:
        self.kept = [None, None]

    def __call__(self, samples):
        cur = rloader.default_collate(samples)
        old = self.kept.pop(0)
        self.kept.append(cur)
        return old, cur


def test_a_batch_the_worker_still_holds_is_not_overwritten():
    # One worker, one task in flight: the worker makes batch k while the user holds batch k-1,
    # and batch k-2 has been dropped, so the main process has given its slot back. Only the
    # worker's own hold on batch k-2 (which it returns now) keeps that slot from being
    # collated into again.
    ds = SamplesOfKind(80, "tensor")
    loader = rloader.DataLoader(
        ds, batch_size=4, num_workers=1, prefetch_factor=1, collate_fn=KeepTwoBack()
    )
    it = iter(loader)
    batch = next(it)
    for k in range(1, 20):
        old, cur = next(it)
        del batch
        gc.collect()
        assert cur[1].tolist() == list(range(4 * k, 4 * (k + 1))), k
        if k >= 2:
            assert old[1].tolist() == list(range(4 * (k - 2), 4 * (k - 1))), k
            assert torch.equal(
                old[0][:, 0, 0, 0], torch.arange(4 * (k - 2), 4 * (k - 1)).float()
            ), k
        batch = [old, cur]
        del old, cur
    assert it._transport_counts[1] == 0


def test_in_place_changes_to_a_batch_do_not_reach_other_batches():
    ds = SamplesOfKind(200, "tensor")
    expected = list(tud.DataLoader(ds, batch_size=4, num_workers=2))
    got = []
    for images, labels in rloader.DataLoader(ds, batch_size=4, num_workers=2):
        got.append((images.clone(), labels.clone()))
        images.fill_(-1.0)  # writes into the slot, which the next batch in it overwrites
        labels.zero_()
    assert same([list(b) for b in got], expected)


def test_persistent_workers_reuse_slots_across_epochs():
    ds = SamplesOfKind(120, "numpy")
    loader = rloader.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    expected = list(tud.DataLoader(ds, batch_size=4, num_workers=2))
    for _ in range(3):
        assert same(list(loader), expected)
    it = loader._iterator
    assert it._transport_counts[0] > 0


def test_out_of_memory_for_slots_falls_back_to_the_queue_with_a_warning(monkeypatch, capfd):
    # The workers' slot reservations fail past 3 MiB, as on a machine with no memory left
    # (a test hook: really filling memory would endanger the machine running the tests).
    monkeypatch.setenv("RLOADER_TEST_SLOT_RESERVE_LIMIT", str(3 << 20))
    expected = list(tud.DataLoader(MiBRows(), batch_size=4, num_workers=2))
    # Spawned, so that the workers print their warnings (forked ones would inherit pytest's
    # recording of warnings, which stays in the worker).
    loader = rloader.DataLoader(
        MiBRows(), batch_size=4, num_workers=2, multiprocessing_context="spawn"
    )
    it = iter(loader)
    compared = 0
    for want, batch in zip(expected, it):  # (no zip(strict=) on Python 3.9)
        assert same(batch, want)
        compared += 1
    assert compared == len(expected) and next(it, None) is None
    assert it._transport_counts == (0, 12)  # both tensors of every batch came inline
    err = capfd.readouterr().err
    # Each worker says once what happened, how much, and what to change.
    assert err.count("RuntimeWarning: DataLoader worker: could not reserve 4194304 bytes") == 2, err
    assert "lower num_workers, prefetch_factor or batch_size" in err
    assert "Batches now travel through the worker's queue instead" in err
