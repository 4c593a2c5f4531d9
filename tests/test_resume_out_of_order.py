"""Resuming loaders with ``in_order=False``: the batches handed out are not the epoch's first
ones, and a resume yields every batch of the epoch once (NOTE [Resume])."""

import pytest
import torch
from _datasets import Gated
from _resume_helpers import checkpointed, epochs_of

import rloader

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


# ---------------------------------------------------------------- in_order=False


def out_of_order(workers, gates=None, worker_type="process"):
    return rloader.DataLoader(
        Gated(48, gates),
        batch_size=3,
        shuffle=True,
        num_workers=workers,
        in_order=False,
        generator=torch.Generator().manual_seed(7),
        worker_type=worker_type,
    )


def first_batch_indices(workers):
    """The indices of the first batch of keys the loader draws (epoch 0)."""
    return next(iter(out_of_order(0)))  # same generator, same draws


def take_holding_back(loader, gate, count):
    """`count` batches of a loader whose gated batch is held back, the state then, and the
    gate opened (so the workers can stop)."""
    it = iter(loader)
    got = [sorted(next(it).tolist()) for _ in range(count)]
    state = checkpointed(loader.state_dict())
    open(gate, "w").close()
    del it
    return got, state


def epoch_batches(batches):
    return sorted(sorted(b) for b in batches)


@pytest.mark.parametrize("workers,resume_workers", [(2, 2), (3, 3), (2, 0), (3, 1)])
def test_out_of_order_resume_gives_each_batch_of_the_epoch_once(tmp_path, workers, resume_workers):
    expected = [epoch_batches(e) for e in epochs_of(out_of_order(workers), 2)]
    gate = str(tmp_path / "gate")
    held = {int(i): gate for i in first_batch_indices(workers)}
    seen, state = take_holding_back(out_of_order(workers, held), gate, 4)
    assert 0 in state["holes"]  # the held-back batch was not handed out: a hole below position
    resumed = out_of_order(resume_workers)
    resumed.load_state_dict(state)
    rest = [sorted(b.tolist()) for b in resumed]
    assert epoch_batches(seen + rest) == expected[0]  # each batch once
    assert epoch_batches(b.tolist() for b in resumed) == expected[1]  # then the next epoch


@pytest.mark.parametrize("resume_type", ["thread", "process"])
def test_out_of_order_resume_with_thread_workers(tmp_path, resume_type):
    expected = [epoch_batches(e) for e in epochs_of(out_of_order(2), 2)]
    gate = str(tmp_path / "gate")
    held = {int(i): gate for i in first_batch_indices(2)}
    seen, state = take_holding_back(out_of_order(2, held, worker_type="thread"), gate, 4)
    assert 0 in state["holes"]
    resumed = out_of_order(2, worker_type=resume_type)
    resumed.load_state_dict(state)
    rest = [sorted(b.tolist()) for b in resumed]
    assert epoch_batches(seen + rest) == expected[0]
    assert epoch_batches(b.tolist() for b in resumed) == expected[1]


def test_out_of_order_resume_of_a_resume(tmp_path):
    expected = epoch_batches(epochs_of(out_of_order(2), 1)[0])
    gate1, gate2 = str(tmp_path / "one"), str(tmp_path / "two")
    first = [int(i) for i in first_batch_indices(2)]
    seen, state = take_holding_back(out_of_order(2, {i: gate1 for i in first}), gate1, 4)
    # The resumed epoch starts with the batches left behind (task 0 is the first batch): hold
    # that one back again, so the second state has holes in the resumed numbering.
    again = out_of_order(2, {i: gate2 for i in first})
    again.load_state_dict(state)
    more, state2 = take_holding_back(again, gate2, 3)
    assert state2["holes"] and state2["position"] > state["position"]
    last = out_of_order(2)
    last.load_state_dict(state2)
    assert epoch_batches(seen + more + [b.tolist() for b in last]) == expected


def test_skipping_handed_out_batches_in_python_and_in_rust_agree():
    # BatchStream.skip (Rust) and _skip_handed (other samplers' keys) keep the same batches.
    from rloader._resume import epoch

    for end, holes in [(0, []), (5, []), (6, [0, 2]), (7, [6]), (4, [1, 9])]:
        stream = rloader.BatchSampler(rloader.SequentialSampler(range(30)), 3, False)
        rust = iter(stream)
        rust.skip(end, holes)
        python = epoch.skip_handed(iter(stream), end, holes)
        assert [list(b) for b in rust] == [list(b) for b in python]


def test_elastic_resume_of_ranks_that_handed_out_out_of_order(tmp_path):
    # Each old rank held its first batch back: what no old rank handed out (those first
    # batches included) is shared by the new ranks, once each.
    def rank_loader(world, rank, workers, gates=None):
        sampler = rloader.DistributedSampler(range(48), num_replicas=world, rank=rank, seed=4)
        return rloader.DataLoader(
            Gated(48, gates), batch_size=3, sampler=sampler, num_workers=workers, in_order=False
        )

    states, consumed = [], []
    for rank in range(2):
        gate = str(tmp_path / f"gate{rank}")
        first = next(iter(rank_loader(2, rank, 0))).tolist()
        got, state = take_holding_back(rank_loader(2, rank, 2, {i: gate for i in first}), gate, 3)
        assert 0 in state["holes"]
        states.append(state)
        consumed += [x for b in got for x in b]
    shares = []
    for rank in range(3):
        loader = rank_loader(3, rank, 0)
        loader.load_state_dict(states)
        shares += [x for b in loader for x in b.tolist()]
    assert sorted(shares) == sorted(set(range(48)) - set(consumed))
