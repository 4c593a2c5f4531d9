"""DataLoader.state_dict() / load_state_dict(): a resumed loader yields exactly what an
uninterrupted run would have, compared with that run in the same test (NOTE [Resume])."""

import functools
import pickle
import warnings

import pytest
import torch
import torch.utils.data as tud
from _datasets import (
    PlainStream,
    SeedOfReader,
    ShardedStream,
    StatefulStream,
    TorchdataStyleStream,
    UnpicklableStateStream,
)
from _resume_helpers import POINTS, as_lists, checkpointed, epochs_of, interrupted, uninterrupted
from _samplers import FailsToLoadOnce, StridingSampler

import rloader
from rloader._auto import policy as auto_policy

pytestmark = [
    # Tests with 3 workers on this 2-core machine: torch's (and torchdata's) warning about it
    # is expected, as is torchdata's own deprecation notice.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

N = 37  # samples: batches of 4 leave a short last batch


def loaders():
    """name -> factory(num_workers, generator, **more DataLoader arguments) of a loader; each
    draws its order differently."""
    data = list(range(N))
    weights = [float(i % 5 + 1) for i in range(N)]
    return {
        "sequential": lambda nw, g, **kw: rloader.DataLoader(
            data, batch_size=4, num_workers=nw, **kw
        ),
        "shuffle": lambda nw, g, **kw: rloader.DataLoader(
            data, batch_size=4, shuffle=True, num_workers=nw, **kw, generator=g
        ),
        "random with replacement": lambda nw, g, **kw: rloader.DataLoader(
            data,
            batch_size=4,
            num_workers=nw,
            **kw,
            generator=g,
            sampler=rloader.RandomSampler(data, replacement=True, num_samples=30, generator=g),
        ),
        "subset random": lambda nw, g, **kw: rloader.DataLoader(
            data,
            batch_size=4,
            num_workers=nw,
            **kw,
            sampler=rloader.SubsetRandomSampler(range(3, 33), g),
        ),
        "weighted": lambda nw, g, **kw: rloader.DataLoader(
            data,
            batch_size=4,
            num_workers=nw,
            **kw,
            sampler=rloader.WeightedRandomSampler(weights, 40, generator=g),
        ),
        "weighted without replacement": lambda nw, g, **kw: rloader.DataLoader(
            data,
            batch_size=4,
            num_workers=nw,
            **kw,
            sampler=rloader.WeightedRandomSampler(weights, 30, replacement=False, generator=g),
        ),
        "batch sampler": lambda nw, g, **kw: rloader.DataLoader(
            data,
            num_workers=nw,
            **kw,
            batch_sampler=rloader.BatchSampler(rloader.RandomSampler(data, generator=g), 5, True),
        ),
        "torch's random sampler": lambda nw, g, **kw: rloader.DataLoader(
            data, batch_size=4, num_workers=nw, **kw, sampler=tud.RandomSampler(data, generator=g)
        ),
        "user's stateful sampler": lambda nw, g, **kw: rloader.DataLoader(
            data, batch_size=4, num_workers=nw, **kw, sampler=StridingSampler(N)
        ),
        "no auto-batching": lambda nw, g, **kw: rloader.DataLoader(
            data, batch_size=None, shuffle=True, num_workers=nw, **kw, generator=g
        ),
    }


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("name", loaders())
def test_resume_is_the_uninterrupted_run(name, point):
    make = loaders()[name]
    epoch, batch = POINTS[point]
    for explicit in (True, False):
        expected = uninterrupted(make, 0, 3, explicit)
        assert interrupted(make, 0, 0, epoch, batch, 3, explicit) == expected


@pytest.mark.parametrize("engine", ["process", "thread"], indirect=True)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("name", loaders())
def test_resume_with_workers(name, point, engine):
    worker_type = {k: v for k, v in engine.kwargs().items() if k != "num_workers"}
    make = functools.partial(loaders()[name], **worker_type)
    epoch, batch = POINTS[point]
    expected = uninterrupted(make, 2, 3, explicit=True)
    assert expected == uninterrupted(make, 0, 3, explicit=True)  # workers change nothing
    assert interrupted(make, 2, 2, epoch, batch, 3, explicit=True) == expected


@pytest.mark.parametrize("point", ["start", "middle", "last batch", "epoch end"])
@pytest.mark.parametrize("name", ["shuffle", "weighted", "batch sampler", "torch's random sampler"])
@pytest.mark.parametrize("workers", [(2, 0), (0, 2), (2, 1)])
def test_resume_with_another_worker_count(name, point, workers):
    make = loaders()[name]
    epoch, batch = POINTS[point]
    expected = uninterrupted(make, 0, 2, explicit=True)
    assert interrupted(make, *workers, epoch, batch, 2, explicit=True) == expected


def test_resume_with_persistent_workers():
    def make(nw, g):
        return rloader.DataLoader(
            list(range(N)),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            generator=g,
        )

    assert interrupted(make, 2, 2, 1, 3, 3, True) == uninterrupted(make, 2, 3, True)


@pytest.mark.parametrize("batch", [None, "all"])
@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize("explicit", [True, False])
def test_resume_between_epochs_with_persistent_workers(epoch, explicit, batch):
    # The saving loader's next epoch reuses its workers (no base seed drawn); the resumed one
    # starts a pool (one drawn): the generator is put back as if it had not.
    def make(nw, g):
        return rloader.DataLoader(
            list(range(N)),
            batch_size=4,
            shuffle=True,
            num_workers=nw,
            persistent_workers=nw > 0,
            generator=g,
        )

    expected = uninterrupted(make, 2, 3, explicit)
    assert interrupted(make, 2, 2, epoch, batch, 3, explicit) == expected
    if epoch == 1:  # (without workers every epoch draws a base seed: only the next one matches)
        assert interrupted(make, 2, 0, epoch, batch, 3, explicit) == expected


def rows(batch):
    return [as_lists(part) for part in batch]


def rank_one_of_two(seed, **kwargs):
    """A loader over rank 1 of 2 of a DistributedSampler (5 batches), with its sampler; the
    workers' seeds (in the samples) come from ``generator``."""
    dataset = SeedOfReader(29)
    sampler = rloader.DistributedSampler(dataset, num_replicas=2, rank=1, seed=5)
    generator = torch.Generator().manual_seed(seed)
    loader = rloader.DataLoader(
        dataset, batch_size=3, sampler=sampler, generator=generator, **kwargs
    )
    return loader, sampler


def next_epoch_after_a_state_at_the_end(kwargs, saved_after, set_epoch):
    """Three epochs, ``set_epoch`` before each ``iter()``, against a run saved at the end of
    the first (after its last batch, or after StopIteration too) and resumed by a new loader,
    ``set_epoch`` before or, as Lightning calls it there, after the resumed ``iter()`` (and
    before the next one's)."""
    loader, sampler = rank_one_of_two(7, **kwargs)
    expected = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected.append([rows(b) for b in loader])
    assert expected[0] != expected[1] != expected[2]  # each epoch its own order (and seeds)
    loader, sampler = rank_one_of_two(7, **kwargs)
    it = iter(loader)
    seen = [[rows(next(it)) for _ in range(len(loader))]]
    if saved_after == "StopIteration":
        assert next(it, None) is None
    state = checkpointed(loader.state_dict())
    del it, loader
    resumed, sampler = rank_one_of_two(99, **kwargs)  # the generator's state is the saved one
    resumed.load_state_dict(state)
    if set_epoch == "before iter()":
        sampler.set_epoch(1)
    it = iter(resumed)
    if set_epoch == "after iter()":
        sampler.set_epoch(1)
    seen.append([rows(b) for b in it])
    sampler.set_epoch(2)
    seen.append([rows(b) for b in resumed])
    return seen, expected


@pytest.mark.parametrize("set_epoch", ["before iter()", "after iter()"])
@pytest.mark.parametrize("saved_after", ["the last batch", "StopIteration"])
def test_a_state_at_an_epochs_end_resumes_into_the_next_epoch(engine, saved_after, set_epoch):
    # Every batch of the epoch handed out: the epoch is over, whether or not the iterator has
    # raised StopIteration yet. The resume is the next epoch (its order, its workers' seeds),
    # and its draws wait for its first batch, so that a set_epoch() between iter() and that
    # batch (Lightning's, on resume) is the epoch's. (Persistent workers keep their seeds from
    # epoch to epoch, which a new pool does not: test_resume_between_epochs_with_persistent_
    # workers checks their order.)
    seen, expected = next_epoch_after_a_state_at_the_end(engine.kwargs(), saved_after, set_epoch)
    assert seen == expected


@pytest.mark.parametrize("saved_after", ["the last batch", "StopIteration"])
def test_a_state_at_an_epochs_end_resumes_into_the_next_epoch_under_auto(quick, saved_after):
    seen, expected = next_epoch_after_a_state_at_the_end(
        dict(num_workers="auto"), saved_after, "after iter()"
    )
    assert seen == expected


def test_the_saved_order_travels_with_the_state():
    # The resumed epoch is the saved one whatever generator the new loader has (or none).
    g = torch.Generator().manual_seed(5)
    loader = rloader.DataLoader(range(100), batch_size=10, shuffle=True, generator=g)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    rest = [b.tolist() for b in it]
    fresh_gen = torch.Generator().manual_seed(5)
    saver = rloader.DataLoader(range(100), batch_size=10, shuffle=True, generator=fresh_gen)
    it = iter(saver)
    assert [next(it).tolist() for _ in range(3)] == head
    state = saver.state_dict()
    for generator in (None, torch.Generator().manual_seed(77)):
        other = rloader.DataLoader(range(100), batch_size=10, shuffle=True, generator=generator)
        other.load_state_dict(state)
        assert [b.tolist() for b in other] == rest


def test_dataset_state_is_small_and_plain():
    loader = rloader.DataLoader(range(50_000_000), batch_size=256, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert len(pickle.dumps(state)) < 4096
    assert checkpointed(state) == state


def test_state_before_iter_and_between_epochs():
    make = loaders()["shuffle"]
    g = torch.Generator().manual_seed(11)
    expected = epochs_of(make(0, g), 2)
    g = torch.Generator().manual_seed(11)
    fresh = make(0, g)
    state = fresh.state_dict()  # before any iter()
    resumed = make(0, torch.Generator().manual_seed(4))
    resumed.load_state_dict(state)
    assert epochs_of(resumed, 2) == expected


def test_state_dict_after_load_is_the_loaded_one():
    loader = loaders()["shuffle"](0, torch.Generator().manual_seed(1))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = loaders()["shuffle"](0, None)
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_load_state_dict_rejects_what_it_cannot_read():
    loader = rloader.DataLoader(range(10))
    with pytest.raises(ValueError, match="expects what rloader.DataLoader.state_dict"):
        loader.load_state_dict({"something": "else"})


# ---------------------------------------------------------------- another world size


def rank_loader(world, rank, drop_last=False, batch_size=3):
    sampler = rloader.DistributedSampler(
        range(N), num_replicas=world, rank=rank, seed=4, drop_last=drop_last
    )
    return rloader.DataLoader(list(range(N)), batch_size=batch_size, sampler=sampler), sampler


@pytest.mark.parametrize("old,new", [(2, 4), (4, 2), (3, 3), (2, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_covers_what_no_old_rank_yielded(old, new, drop_last):
    states, consumed = [], []
    for rank in range(old):
        loader, sampler = rank_loader(old, rank, drop_last)
        sampler.set_epoch(1)
        it = iter(loader)
        for _ in range(min(rank + 1, len(loader) - 1)):  # each old rank got as far as it got
            consumed += next(it).tolist()
        states.append(checkpointed(loader.state_dict()))
    epoch_samples = set()
    for rank in range(old):
        _, sampler = rank_loader(old, rank, drop_last)
        sampler.set_epoch(1)
        epoch_samples |= set(sampler)
    left = epoch_samples - set(consumed)
    shares = []
    for rank in range(new):
        loader, sampler = rank_loader(new, rank, drop_last)
        loader.load_state_dict(states)
        shares.append([x for b in loader for x in b.tolist()])
        # then the new world's next epoch, as without a resume
        sampler.set_epoch(2)
        plain, plain_sampler = rank_loader(new, rank, drop_last)
        plain_sampler.set_epoch(2)
        assert [b.tolist() for b in loader] == [b.tolist() for b in plain]
    flat = [x for share in shares for x in share]
    assert set(flat) <= left
    lengths = {len(share) for share in shares}
    assert len(lengths) == 1  # equal shares, as DistributedSampler makes them
    if drop_last:
        assert len(flat) == len(set(flat)) and len(left) - len(flat) < new
    else:
        assert set(flat) == left and len(flat) - len(left) < new  # padding only as it pads


def test_an_elastic_resume_of_ranks_at_their_epochs_end_is_the_next_epoch():
    # Every old rank had handed out its every batch (not yet StopIteration): nothing is left
    # of the epoch, and each new rank's first iter() is its next epoch, not an empty one.
    states = []
    for rank in range(2):
        loader, _ = rank_loader(2, rank)
        it = iter(loader)
        for _ in range(len(loader)):
            next(it)
        states.append(checkpointed(loader.state_dict()))
    for rank in range(3):
        resumed, sampler = rank_loader(3, rank)
        resumed.load_state_dict(states)
        fresh, fresh_sampler = rank_loader(3, rank)
        sampler.set_epoch(1)
        fresh_sampler.set_epoch(1)
        assert [b.tolist() for b in resumed] == [b.tolist() for b in fresh] != []


def states_after_one_batch(world):
    """Every rank's state after it took one batch."""
    states = []
    for rank in range(world):
        loader, _ = rank_loader(world, rank)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
    return states


def test_elastic_states_must_be_a_whole_job():
    states = states_after_one_batch(2)
    loader, _ = rank_loader(4, 0)
    with pytest.raises(ValueError, match="every rank"):
        loader.load_state_dict(states[:1] + states[:1])


def test_a_stateful_iterable_dataset_resumes_from_its_own_state():
    def make(nw, g):
        return rloader.DataLoader(StatefulStream(N), batch_size=4)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # restored from its state: nothing fetched again
        assert interrupted(make, 0, 0, 0, 3, 2, True) == uninterrupted(make, 0, 2, True)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_without_state_is_resumed_by_fetching(workers):
    def make(nw, g):
        return rloader.DataLoader(PlainStream(N), batch_size=4, num_workers=nw)

    with pytest.warns(UserWarning, match="fetching and dropping the 3 batches"):
        got = interrupted(make, workers, workers, 0, 3, 2, True)
    assert got == uninterrupted(make, workers, 2, True)


# ---------------------------------------------------------------- review: hazards


def test_a_loader_pickles_after_iteration_as_torchs_does():
    for lib in (tud, rloader):
        loader = lib.DataLoader(list(range(8)), batch_size=2, shuffle=True)
        list(loader)
        assert pickle.loads(pickle.dumps(loader)).batch_size == 2


def test_the_global_rng_is_the_users_after_a_resume_with_persistent_workers():
    def make(nw, g):
        return rloader.DataLoader(
            list(range(N)), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
        )

    assert interrupted(make, 2, 2, 1, 3, 3, False) == uninterrupted(make, 2, 3, False)
    assert interrupted(make, 2, 0, 2, 3, 3, False) == uninterrupted(make, 2, 3, False)


def test_a_sampler_generator_resumes_into_a_loader_whose_sampler_has_none():
    data = list(range(40))
    g = torch.Generator().manual_seed(8)
    loader = rloader.DataLoader(
        data, batch_size=4, sampler=rloader.RandomSampler(data, generator=g)
    )
    it = iter(loader)
    next(it)
    state, rest = loader.state_dict(), [b.tolist() for b in it]
    other = rloader.DataLoader(data, batch_size=4, sampler=rloader.RandomSampler(data))
    other.load_state_dict(state)
    assert [b.tolist() for b in other] == rest


@pytest.mark.parametrize("taken", ["one", "all"])
def test_a_resume_that_fails_in_iter_leaves_the_rng_alone_and_stays_pending(monkeypatch, taken):
    # (taken all: the resume is the next epoch, made as the saved one's draws are made again)
    monkeypatch.setattr(FailsToLoadOnce, "failures", 1)
    loader = rloader.DataLoader(list(range(N)), batch_size=4, sampler=FailsToLoadOnce(N))
    it = iter(loader)
    for _ in range(len(loader) if taken == "all" else 1):
        next(it)
    state = loader.state_dict()
    rest = [b.tolist() for b in (loader if taken == "all" else it)]
    other = rloader.DataLoader(list(range(N)), batch_size=4, sampler=FailsToLoadOnce(N))
    other.load_state_dict(state)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="not yet"):
        iter(other)
    assert torch.equal(torch.get_rng_state(), before)
    assert [b.tolist() for b in other] == rest  # the resume waited for the next iter()


def test_a_failed_batch_of_an_iterable_dataset_counts_as_handed_out():
    calls = []

    def collate(batch):
        calls.append(batch)
        if len(calls) == 2:
            raise ValueError("one bad batch")
        return torch.tensor(batch)

    loader = rloader.DataLoader(StatefulStream(N), batch_size=4, collate_fn=collate)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError):
        next(it)
    assert loader.state_dict()["position"] == 2


def test_elastic_resume_over_torchs_distributed_sampler_and_another_batch_size():
    def rank_loader(world, rank, batch_size, lib):
        sampler = lib.DistributedSampler(range(N), num_replicas=world, rank=rank, seed=4)
        sampler.set_epoch(1)
        return rloader.DataLoader(list(range(N)), batch_size=batch_size, sampler=sampler)

    for lib in (rloader, tud.distributed):
        states, consumed, epoch = [], set(), set()
        for rank in range(2):
            loader = rank_loader(2, rank, 6, lib)
            epoch |= {x for b in loader for x in b.tolist()}
            it = iter(loader)
            consumed |= set(next(it).tolist())
            states.append(checkpointed(loader.state_dict()))
        shares = []
        for rank in range(3):  # 3 ranks, each with half the batch size
            loader = rank_loader(3, rank, 3, lib)
            loader.load_state_dict(states)
            shares.append([x for b in loader for x in b.tolist()])
        flat = [x for share in shares for x in share]
        assert set(flat) == epoch - consumed and len(flat) - len(set(flat)) < 3, lib


def test_a_rank_state_cannot_be_resumed_on_another_world_alone():
    loader, _ = rank_loader(3, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other, _ = rank_loader(5, 0)
    with pytest.raises(ValueError, match="list of every old rank's state"):
        other.load_state_dict(state)


def test_states_saved_during_an_elastic_epoch_resume_on_that_world_only():
    states = states_after_one_batch(2)
    resumed, _ = rank_loader(3, 1)
    resumed.load_state_dict(states)
    it = iter(resumed)
    next(it)
    mid = resumed.state_dict()
    rest = [b.tolist() for b in it]
    again, _ = rank_loader(3, 1)
    again.load_state_dict(checkpointed(mid))
    assert [b.tolist() for b in again] == rest
    with pytest.raises(ValueError, match="itself resumed on another world size"):
        rank_loader(4, 0)[0].load_state_dict([mid, mid, mid])


# ---------------------------------------------------------------- stateful iterable datasets, workers


def sharded(nw, persistent=False, in_order=True, batch_size=4, **kw):
    def make(workers, g):
        return rloader.DataLoader(
            ShardedStream(N),
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=persistent and workers != 0,
            in_order=in_order,
            **kw,
        )

    return make


# (epoch, batches taken): "all" and "all-2" count from the end of that epoch.
STREAM_POINTS = {**POINTS, "a worker has ended": (1, "all-2")}


def stream_point(expected, point):
    epoch, batch = STREAM_POINTS[point]
    if isinstance(batch, str):  # the epoch's length, from the uninterrupted run
        batch = len(expected[epoch]) - (2 if batch == "all-2" else 0)
    return epoch, batch


@pytest.mark.parametrize("point", STREAM_POINTS)
@pytest.mark.parametrize(
    "workers,persistent,worker_type",
    [(0, False, "process")]
    + [(w, p, k) for w in (1, 2, 3) for p in (False, True) for k in ("process", "thread")],
)
def test_a_stateful_iterable_dataset_resumes_from_each_workers_state(
    workers, persistent, worker_type, point
):
    # Each worker's copy (a process's, or a thread's shallow one) says where it is.
    make = sharded(workers, persistent, worker_type=worker_type)
    expected = uninterrupted(make, workers, 3, True)
    epoch, batch = stream_point(expected, point)
    with warnings.catch_warnings():  # restored from the workers' states: nothing fetched again
        warnings.filterwarnings("error", "resuming an IterableDataset by fetching")
        assert interrupted(make, workers, workers, epoch, batch, 3, True) == expected


@pytest.fixture
def auto_reads_with_two(quick, monkeypatch):
    """num_workers="auto" asks for 2 workers whenever it decides: an IterableDataset's first
    epoch is read in the main process, the later ones by 2 workers."""
    two = auto_policy.Decision(2, "test")
    monkeypatch.setattr(auto_policy, "decide", lambda w: None if w.workers == 2 else two)


AUTO_POINTS = {
    **STREAM_POINTS,
    "workers' middle": (1, 3),
    "workers' epoch end": (1, None),
    # (no batch left to measure: the next epoch is read as the saved loader had chosen)
    "main's last batch": (0, "all"),
}


@pytest.mark.parametrize("point", AUTO_POINTS)
@pytest.mark.parametrize(
    "worker_type,persistent",
    [("process", False), ("process", True), ("thread", False), ("thread", True)],
)
def test_a_stateful_iterable_dataset_resumes_under_auto(
    auto_reads_with_two, worker_type, persistent, point
):
    # The resumed epoch is read by its saved readers (the main process, or 2 workers that load
    # their states), whatever the new loader would have chosen, and goes on where it was.
    make = sharded("auto", persistent, worker_type=worker_type)
    expected = uninterrupted(make, "auto", 3, True)
    tails = [max(x % 1000 for b in e for x in b) for e in expected]
    assert tails[0] < N <= min(tails[1:])  # worker 1's shard runs past N: 2 readers
    epoch, batch = AUTO_POINTS[point]
    if isinstance(batch, str):  # the epoch's length, from the uninterrupted run
        batch = len(expected[epoch]) - (2 if batch == "all-2" else 0)
    with warnings.catch_warnings():  # restored from the states: nothing fetched again
        warnings.filterwarnings("error", "resuming an IterableDataset by fetching")
        assert interrupted(make, "auto", "auto", epoch, batch, 3, True) == expected


def test_auto_resumes_an_iterable_epoch_with_its_readers(quick, monkeypatch):
    # A state of a fixed loader (3 processes; a plain sharded stream: fetched and dropped) is
    # resumed by an auto loader with 3, and one saved by auto with 3 by a fixed loader; worker
    # states saved mid-epoch are not for thread workers.
    def make(nw, g):
        return rloader.DataLoader(PlainStream(N), batch_size=2, num_workers=nw)

    monkeypatch.setattr(auto_policy, "decide", lambda w: None)  # auto on its own stays in main
    for saved, loaded in [(3, "auto"), ("auto", 3)]:
        if saved == "auto":
            monkeypatch.setattr(auto_policy, "decide", lambda w: auto_policy.Decision(3, "test"))
        reference = make(3, None)
        expected = [b.tolist() for b in reference]
        loader = make(saved, None)
        if saved == "auto":
            list(loader)  # the first epoch in main asks for 3
        it = iter(loader)
        head = [next(it).tolist() for _ in range(5)]
        state = checkpointed(loader.state_dict())
        assert state["readers"] == [3, "process"]
        del it
        resumed = make(loaded, None)
        resumed.load_state_dict(state)
        with pytest.warns(UserWarning, match="fetching and dropping the 5 batches"):
            assert head + [b.tolist() for b in resumed] == expected
    loader = sharded(2, persistent=True)(2, None)
    it = iter(loader)
    next(it)
    threads = sharded("auto", worker_type="thread")("auto", None)
    with pytest.raises(ValueError, match="worker_type='process' or 'auto'"):
        threads.load_state_dict(loader.state_dict())  # mid-epoch
    list(it)
    with pytest.raises(ValueError, match="worker_type='process' or 'auto'"):
        threads.load_state_dict(loader.state_dict())  # persistent workers' places, between
    plain = make(3, None)  # a stream without state: its count alone
    it = iter(plain)
    next(it)
    with pytest.raises(ValueError, match="num_workers=3 .*it has 2"):
        make(2, None).load_state_dict(plain.state_dict())


def test_auto_resumes_a_persistent_pool_only_where_the_next_epoch_keeps_it(quick, monkeypatch):
    # The first epoch (main) asks for 2 workers, a pool of 2 for 3: saved between the epochs
    # of 2 and 3 workers, the next epoch starts 3 fresh workers, as the uninterrupted run did
    # (not the 2 workers' places, which it would go on from had it kept them).
    plan = {0: auto_policy.Decision(2, "test"), 2: auto_policy.Decision(3, "test")}
    monkeypatch.setattr(auto_policy, "decide", lambda w: plan.get(w.workers))
    make = sharded("auto", persistent=True)
    expected = uninterrupted(make, "auto", 4, True)
    assert [max(x % 1000 for b in e for x in b) >= N for e in expected] == [False] + [True] * 3
    for epoch, batch in [(1, None), (2, 3), (1, 3)]:
        assert interrupted(make, "auto", "auto", epoch, batch, 4, True) == expected


@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("batch", [None, 0, 1, 3])
def test_an_auto_state_resumes_in_a_fixed_loader(auto_reads_with_two, worker_type, batch):
    # Saved in the second epoch (2 workers; between the epochs: None), resumed by a fixed loader
    # of 2: the loader's own copy (where fresh workers, and those with no place saved yet,
    # start) is the auto loader's, as is the stream. With 0 workers: refused, naming 2.
    def make(nw):
        return rloader.DataLoader(
            ShardedStream(N), batch_size=4, num_workers=nw, worker_type=worker_type
        )

    reference = make("auto")
    list(reference)
    expected = epochs_of(reference, 1)[0]
    loader = make("auto")
    list(loader)
    it = iter(loader)
    head = [] if batch is None else [as_lists(next(it)) for _ in range(batch)]
    state = checkpointed(loader.state_dict())
    assert state["readers"] == [2, worker_type]
    del it
    resumed = make(2)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "resuming an IterableDataset by fetching")
        assert head + epochs_of(resumed, 1)[0] == expected
    if batch is not None:
        with pytest.raises(ValueError, match="num_workers=2 .*it has 0"):
            make(0).load_state_dict(state)


def test_the_sharded_stream_is_torchs():
    # The uninterrupted stream the resumes are compared with is torch's (round robin over the
    # workers still going), persistent workers' epochs included.
    for persistent in (False, True):
        make = sharded(3, persistent)
        torch_loader = tud.DataLoader(
            ShardedStream(N), batch_size=4, num_workers=3, persistent_workers=persistent
        )
        assert uninterrupted(make, 3, 3, True) == epochs_of(torch_loader, 3)


def test_worker_states_resume_through_the_pin_thread(monkeypatch):
    # With pin_memory the batches reach the user through a thread: what counts is what the
    # user got (the thread may hold one more).
    monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: lambda b: b)
    make = sharded(2, persistent=True)
    expected = uninterrupted(make, 2, 3, True)
    for epoch, batch in [(0, 3), (1, len(expected[1]) - 2)]:
        assert interrupted(make, 2, 2, epoch, batch, 3, True) == expected


def test_worker_states_survive_a_resume_of_a_resume():
    make = sharded(3)
    expected = uninterrupted(make, 3, 2, True)[0]
    loader = make(3, None)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(4)]
    state = checkpointed(loader.state_dict())
    again = make(3, None)
    again.load_state_dict(state)
    it = iter(again)
    seen += [next(it).tolist() for _ in range(3)]
    state = checkpointed(again.state_dict())
    last = make(3, None)
    last.load_state_dict(state)
    assert seen + [b.tolist() for b in last] == expected


@pytest.mark.parametrize("saved,loaded", [(2, 3), (2, 0), (0, 2), (3, 1)])
def test_worker_states_need_the_same_number_of_workers(saved, loaded):
    loader = sharded(saved)(saved, None)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = sharded(loaded)(loaded, None)
    with pytest.raises(ValueError, match=f"num_workers={saved}.*it has {loaded}"):
        other.load_state_dict(state)
    list(it)  # between epochs, any number of workers goes on
    other.load_state_dict(loader.state_dict())
    assert len([b for b in other]) > 0


def test_worker_states_are_small_and_plain():
    loader = sharded(3)(3, None)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["workers"]["num_workers"] == 3 and state["workers"]["next_worker"] == 1
    assert state["workers"]["states"][0] == {"epoch": 1, "next": 4}
    assert checkpointed(state) == state


def test_a_stateful_iterable_dataset_out_of_order_gives_each_batch_once():
    # Out of order the interleaving is the workers' timing, but each worker resumes its own
    # stream exactly: together, every batch of the epoch once.
    make = sharded(3, in_order=False)
    expected = sorted(b for b in uninterrupted(make, 3, 1, True)[0])
    loader = make(3, None)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(5)]
    resumed = make(3, None)
    resumed.load_state_dict(checkpointed(loader.state_dict()))
    assert sorted(seen + [b.tolist() for b in resumed]) == expected


# ---------------------------------------------------------------- torchdata as a reference


def stateful_dataloader():
    return pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


# Not "last batch": there torchdata (0.11) resumes into what was left of the epoch, nothing,
# and only the iter() after that into the next epoch: a loop that counts epochs (Lightning's)
# loses one. rloader resumes into the next epoch (test_resume_is_the_uninterrupted_run).
@pytest.mark.parametrize("point", ["start", "middle", "epoch end"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sequential_resume_is_torchdatas(workers, point):
    # The same points are checked against the uninterrupted run by test_resume_with_workers and
    # test_resume_is_the_uninterrupted_run ("sequential"), without torchdata.
    theirs = stateful_dataloader()
    data = list(range(N))

    def ours(nw, g):
        return rloader.DataLoader(data, batch_size=4, num_workers=nw)

    def reference(nw, g):
        return theirs(data, batch_size=4, num_workers=nw)

    epoch, batch = POINTS[point]
    assert interrupted(ours, workers, workers, epoch, batch, 3, True) == interrupted(
        reference, workers, workers, epoch, batch, 3, True
    )


# Not "last batch" nor "a worker has ended": there a worker's stream had ended with a short
# batch, and torchdata (0.11) asks it for one more batch after a resume ("always force fetcher to
# request at least one batch"), which this dataset, back at its start, answers with a new pass:
# batches an uninterrupted run never yields. rloader keeps that worker ended (checked against
# the uninterrupted run by test_a_stateful_iterable_dataset_resumes_from_each_workers_state).
@pytest.mark.parametrize("point", ["start", "middle", "epoch end"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_states_resume_as_torchdatas(workers, point):
    # The same points are checked against the uninterrupted run by
    # test_a_stateful_iterable_dataset_resumes_from_each_workers_state, without torchdata.
    theirs = stateful_dataloader()

    def reference(nw, g):
        return theirs(ShardedStream(N), batch_size=4, num_workers=nw)

    make = sharded(workers)
    epoch, batch = stream_point(uninterrupted(make, workers, 2, True), point)
    ours = interrupted(make, workers, workers, epoch, batch, 2, True)
    assert ours == interrupted(reference, workers, workers, epoch, batch, 2, True)


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_an_iterable_datasets_state_that_does_not_pickle_is_its_batchs_error(worker_type):
    # Its stream could not be resumed without it: the batch fails, on threads as on processes
    # (a thread worker's state is copied through pickle, as a process sends it).
    loader = rloader.DataLoader(
        UnpicklableStateStream(), batch_size=3, num_workers=2, worker_type=worker_type
    )
    with pytest.raises(TypeError, match=f"in DataLoader worker {worker_type} 0"):
        next(iter(loader))


def test_an_auto_loader_of_the_other_kind_refuses_a_threads_places():
    loader = sharded(2, persistent=True, worker_type="thread")(2, None)
    it = iter(loader)
    next(it)
    processes = sharded("auto", worker_type="process")("auto", None)
    with pytest.raises(ValueError, match="2 worker threads.*worker_type='thread' or 'auto'"):
        processes.load_state_dict(loader.state_dict())
    sharded("auto", worker_type="auto")("auto", None).load_state_dict(loader.state_dict())


def test_a_stateful_iterable_dataset_on_thread_workers_resumes_from_their_states():
    # Each thread worker's copy says where it is: nothing is fetched again (it once restarted
    # the epoch silently, then fetched and dropped what was handed out, with a warning).
    def loader():
        return rloader.DataLoader(
            TorchdataStyleStream(), batch_size=3, num_workers=2, worker_type="thread"
        )

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    seen = [next(it).tolist() for _ in range(4)]
    state = checkpointed(first.state_dict())
    del it
    assert state["workers"]["kind"] == "thread"
    resumed = loader()
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "resuming an IterableDataset by fetching")
        rest = [b.tolist() for b in resumed]
    assert seen + rest == full
