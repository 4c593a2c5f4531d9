"""What rloader keeps per loader (python/rloader/_loader_record.py): each loader has its own
record, which a copy of the loader does not share, and which never keeps the loader alive."""

import copy
import gc
import weakref

import pytest

import rloader


def loader_over(n, **kwargs):
    return rloader.DataLoader(list(range(n)), batch_size=2, **kwargs)


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy])
def test_a_copy_of_a_loader_shares_neither_its_resume_nor_its_epoch(copier):
    loader = loader_over(10, shuffle=True)
    it = iter(loader)
    first = [x for _ in range(2) for x in next(it).tolist()]
    again = loader_over(10, shuffle=True)
    again.load_state_dict(loader.state_dict())
    twin = copier(again)
    # The copy has no resume waiting: it starts an epoch of its own.
    assert twin.state_dict()["position"] is None
    assert again.state_dict()["position"] == 2
    # The loader itself resumes: the batches the saved one had not handed out.
    rest = [x for b in again for x in b.tolist()]
    assert sorted(first + rest) == list(range(10))
    # And the copy's epoch is not the loader's.
    assert again.state_dict()["position"] is None  # (the loader's epoch ended)
    twin_it = iter(twin)
    next(twin_it)
    assert twin.state_dict()["position"] == 1
    assert again.state_dict()["position"] is None


def test_a_loader_is_freed_with_its_record_after_an_epoch(engine):
    loader = loader_over(8, **engine.kwargs())
    assert len(list(loader)) == 4
    assert loader.stats()["batches"] == 4
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None


def test_a_loader_with_a_pending_elastic_resume_is_freed():
    def rank_loader(world, rank):
        sampler = rloader.DistributedSampler(range(12), num_replicas=world, rank=rank, seed=4)
        return rloader.DataLoader(list(range(12)), batch_size=2, sampler=sampler)

    states = []
    for rank in range(2):
        loader = rank_loader(2, rank)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
    loader = rank_loader(3, 0)
    loader.load_state_dict(states)  # on another world size: the plan waits for iter()
    assert loader.state_dict()["elastic_from"] == states
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None
