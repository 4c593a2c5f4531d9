"""Samplers against torch.utils.data: identical where deterministic, right properties where random."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
import torch.utils.data as tud
from _children import thread_names

import rloader
from rloader import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)


def draws_one(
    generator_before: torch.Generator, generator_after: torch.Generator, k: int = 1
) -> bool:
    """True when generator_after is generator_before advanced by exactly k int64 draws."""
    g = torch.Generator()
    g.set_state(generator_before.get_state())
    for _ in range(k):
        torch.empty((), dtype=torch.int64).random_(generator=g)
    return torch.equal(g.get_state(), generator_after.get_state())


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def chi_square(counts, expected) -> float:
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected))


# A chi-square statistic above this for <= 20 degrees of freedom has p < 1e-6.
CHI2_LIMIT_20DOF = 75.0


# ---------------------------------------------------------------- types and interop


@pytest.mark.parametrize(
    "name",
    [
        "Sampler",
        "SequentialSampler",
        "RandomSampler",
        "SubsetRandomSampler",
        "WeightedRandomSampler",
        "BatchSampler",
    ],
)
def test_rloader_samplers_are_torch_samplers(name):
    assert issubclass(getattr(rloader, name), getattr(tud, name))
    assert issubclass(getattr(rloader, name), tud.Sampler)


def test_distributed_sampler_is_torchs_and_lives_in_both_places():
    from rloader.distributed import DistributedSampler

    assert DistributedSampler is rloader.DistributedSampler
    assert issubclass(DistributedSampler, tud.distributed.DistributedSampler)


def test_sampler_generics():
    assert rloader.Sampler[int] is not None

    class MySampler(rloader.Sampler[int]):
        def __iter__(self):
            return iter([2, 0, 1])

    assert list(BatchSampler(MySampler(), 2, False)) == [[2, 0], [1]]


def test_samplers_pickle():
    for s in [
        SequentialSampler(range(5)),
        RandomSampler(range(5), generator=gen(1)),
        SubsetRandomSampler([1, 2, 3]),
        WeightedRandomSampler([1.0, 2.0], 3),
        BatchSampler(SequentialSampler(range(5)), 2, False),
        rloader.DistributedSampler(range(10), num_replicas=2, rank=1),
    ]:
        clone = pickle.loads(pickle.dumps(s))
        assert type(clone) is type(s)
        assert len(clone) == len(s)


# ---------------------------------------------------------------- SequentialSampler


@pytest.mark.parametrize("n", [0, 1, 7, 10_000])
def test_sequential_matches_torch(n):
    assert list(SequentialSampler(range(n))) == list(tud.SequentialSampler(range(n)))
    assert len(SequentialSampler(range(n))) == n


# ---------------------------------------------------------------- RandomSampler


@pytest.mark.parametrize("n", [1, 2, 5, 1000])
def test_random_is_a_permutation(n):
    out = list(RandomSampler(range(n), generator=gen(3)))
    assert sorted(out) == list(range(n))
    assert all(type(i) is int for i in out)


def test_random_num_samples_beyond_n_concatenates_fresh_permutations():
    out = list(RandomSampler(range(10), num_samples=25, generator=gen(0)))
    assert len(out) == 25
    assert sorted(out[:10]) == list(range(10))
    assert sorted(out[10:20]) == list(range(10))
    assert len(set(out[20:])) == 5
    assert out[:10] != out[10:20]


def test_random_with_replacement():
    s = RandomSampler(range(7), replacement=True, num_samples=1000, generator=gen(0))
    out = list(s)
    assert len(out) == len(s) == 1000
    assert set(out) == set(range(7))


def test_random_reproducible_from_generator_and_global_seed():
    assert list(RandomSampler(range(100), generator=gen(5))) == list(
        RandomSampler(range(100), generator=gen(5))
    )
    assert list(RandomSampler(range(100), generator=gen(5))) != list(
        RandomSampler(range(100), generator=gen(6))
    )
    torch.manual_seed(11)
    a = list(RandomSampler(range(100)))
    torch.manual_seed(11)
    b = list(RandomSampler(range(100)))
    assert a == b


def test_random_epochs_differ_and_take_one_draw_each():
    g = gen(9)
    s = RandomSampler(range(50), generator=g)
    before = torch.Generator().set_state(g.get_state())
    e1 = list(s)
    assert draws_one(before, g)
    e2 = list(s)
    assert e1 != e2


def test_random_draws_seed_lazily_like_torchs_generator():
    g = gen(2)
    state = g.get_state()
    it = iter(RandomSampler(range(10), generator=g))
    assert torch.equal(g.get_state(), state)  # nothing drawn until the first index
    next(it)
    assert not torch.equal(g.get_state(), state)


def test_random_global_rng_consumption_matches_torch():
    torch.manual_seed(0)
    list(tud.RandomSampler(range(10)))
    after_torch = torch.rand(3)
    torch.manual_seed(0)
    list(RandomSampler(range(10)))
    after_rloader = torch.rand(3)
    assert torch.equal(after_torch, after_rloader)


def test_random_position_uniformity():
    # Where index 0 lands over many permutations of 10: uniform.
    counts = [0] * 10
    s = RandomSampler(range(10), generator=gen(123))
    trials = 20_000
    for _ in range(trials):
        counts[list(s).index(0)] += 1
    assert chi_square(counts, [trials / 10] * 10) < CHI2_LIMIT_20DOF


@pytest.mark.parametrize(
    "kwargs",
    [dict(replacement=1), dict(num_samples=0), dict(num_samples=-3), dict(num_samples=2.5)],
)
def test_random_validation_matches_torch(kwargs):
    with pytest.raises(Exception) as theirs:
        tud.RandomSampler(range(5), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        RandomSampler(range(5), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_random_on_empty_dataset_raises_like_torch():
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        RandomSampler([])


# ---------------------------------------------------------------- SubsetRandomSampler


def test_subset_random_yields_exactly_the_indices():
    idx = [5, 3, 99, 1000, 7]
    out = list(SubsetRandomSampler(idx, generator=gen(0)))
    assert sorted(out) == sorted(idx)
    assert len(SubsetRandomSampler(idx)) == 5


def test_subset_random_keeps_non_int_indices_as_they_are():
    idx = torch.tensor([4, 8, 15])
    out = list(SubsetRandomSampler(idx, generator=gen(0)))
    theirs = list(tud.SubsetRandomSampler(idx, generator=gen(0)))
    assert sorted(int(x) for x in out) == sorted(int(x) for x in theirs)
    assert {type(x) for x in out} == {type(x) for x in theirs}
    neg = list(SubsetRandomSampler([-1, -2, 3], generator=gen(0)))
    assert sorted(neg) == [-2, -1, 3]


def test_subset_random_same_order_in_python_and_rust_paths():
    idx = [10, 20, 30, 40, 50]
    fast = list(SubsetRandomSampler(idx, generator=gen(4)))
    slow = [int(x) for x in SubsetRandomSampler([torch.tensor(i) for i in idx], generator=gen(4))]
    assert fast == slow


# ---------------------------------------------------------------- WeightedRandomSampler


def test_weighted_with_replacement_follows_weights():
    weights = [1.0, 2.0, 3.0, 4.0, 0.0, 10.0]
    n = 200_000
    out = list(WeightedRandomSampler(weights, n, generator=gen(1)))
    counts = [out.count(i) for i in range(len(weights))]
    assert counts[4] == 0
    total = sum(weights)
    nz = [(c, n * w / total) for c, w in zip(counts, weights) if w > 0]
    assert chi_square([c for c, _ in nz], [e for _, e in nz]) < CHI2_LIMIT_20DOF


def test_weighted_without_replacement_is_distinct_and_first_pick_follows_weights():
    weights = [1.0, 2.0, 3.0, 4.0]
    firsts = [0] * 4
    s = WeightedRandomSampler(weights, 4, replacement=False, generator=gen(2))
    trials = 20_000
    for _ in range(trials):
        out = list(s)
        assert sorted(out) == [0, 1, 2, 3]
        firsts[out[0]] += 1
    assert chi_square(firsts, [trials * w / 10 for w in weights]) < CHI2_LIMIT_20DOF


def test_weighted_zero_weights_come_last_without_replacement():
    out = list(WeightedRandomSampler([0.0, 1.0, 0.0, 2.0], 4, replacement=False, generator=gen(0)))
    assert set(out[:2]) == {1, 3}
    assert set(out[2:]) == {0, 2}


def test_weighted_reproducible():
    w = torch.rand(1000, generator=gen(0))
    for replacement in (True, False):
        a = list(WeightedRandomSampler(w, 500, replacement, generator=gen(3)))
        b = list(WeightedRandomSampler(w, 500, replacement, generator=gen(3)))
        assert a == b


def test_weighted_beyond_torchs_category_cap():
    n = 2**24 + 10
    w = torch.ones(n, dtype=torch.double)
    w[-1] = 1e12  # nearly all the mass on the last category
    out = list(WeightedRandomSampler(w, 5, replacement=True, generator=gen(0)))
    assert out.count(n - 1) >= 4
    out = list(WeightedRandomSampler(w, 3, replacement=False, generator=gen(0)))
    assert out[0] == n - 1 and len(set(out)) == 3


@pytest.mark.parametrize(
    "args",
    [
        ([1.0, 2.0], 0),
        ([1.0, 2.0], True),
        ([1.0, 2.0], 2.0),
        ([1.0, 2.0], 2, "yes"),
        ([[1.0, 2.0]], 2),
    ],
)
def test_weighted_construction_errors_match_torch(args):
    with pytest.raises(Exception) as theirs:
        tud.WeightedRandomSampler(*args)
    with pytest.raises(type(theirs.value)) as ours:
        WeightedRandomSampler(*args)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "weights,k,replacement",
    [
        ([1.0, -1.0], 1, True),
        ([0.0, 0.0], 1, True),
        ([1.0, float("nan")], 1, True),
        ([1.0, float("inf")], 1, False),
        ([1.0, 2.0], 3, False),
        ([0.0, 0.0], 1, False),
    ],
)
def test_weighted_iteration_errors_match_torch(weights, k, replacement):
    with pytest.raises(RuntimeError) as theirs:
        list(tud.WeightedRandomSampler(weights, k, replacement))
    with pytest.raises(RuntimeError) as ours:
        list(WeightedRandomSampler(weights, k, replacement))
    assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------- BatchSampler


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 1000])
@pytest.mark.parametrize("bs", [1, 3, 10])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_matches_torch_over_sequential(n, bs, drop_last):
    theirs = tud.BatchSampler(tud.SequentialSampler(range(n)), bs, drop_last)
    ours = BatchSampler(SequentialSampler(range(n)), bs, drop_last)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_over_any_iterable(drop_last):
    for inner in ([5, "a", None, 3.5, (1, 2)], range(7), tud.SequentialSampler(range(5))):
        assert list(BatchSampler(inner, 2, drop_last)) == list(
            tud.BatchSampler(inner, 2, drop_last)
        )


def test_batch_over_random_sampler_is_a_partition():
    out = list(BatchSampler(RandomSampler(range(1000), generator=gen(0)), 64, False))
    assert [len(b) for b in out] == [64] * 15 + [40]
    flat = [i for b in out for i in b]
    assert sorted(flat) == list(range(1000))
    # The same order as iterating the sampler itself.
    assert flat == list(RandomSampler(range(1000), generator=gen(0)))


def test_batch_honours_a_subclass_that_overrides_iter():
    class Reversed(SequentialSampler):
        def __iter__(self):
            return iter(reversed(range(len(self.data_source))))

    assert list(BatchSampler(Reversed(range(5)), 2, False)) == [[4, 3], [2, 1], [0]]


def test_batch_calls_iter_lazily_like_torch():
    calls = []

    class Spy:
        def __iter__(self):
            calls.append(1)
            return iter(range(3))

    it = iter(BatchSampler(Spy(), 2, False))
    assert calls == []
    assert next(it) == [0, 1]
    assert calls == [1]


@pytest.mark.parametrize(
    "bs,drop_last", [(0, False), (-1, False), (True, False), (2.0, False), (2, 1), (2, None)]
)
def test_batch_validation_matches_torch(bs, drop_last):
    with pytest.raises(Exception) as theirs:
        tud.BatchSampler(range(3), bs, drop_last)
    with pytest.raises(type(theirs.value)) as ours:
        BatchSampler(range(3), bs, drop_last)
    assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------- DistributedSampler


CASES = [(n, r, d) for n in (0, 1, 3, 10, 17, 100) for r in (1, 2, 3, 8) for d in (False, True)]


@pytest.mark.parametrize("n,replicas,drop_last", CASES)
def test_distributed_unshuffled_matches_torch_exactly(n, replicas, drop_last):
    for rank in range(replicas):
        theirs = tud.distributed.DistributedSampler(
            range(n), replicas, rank, shuffle=False, drop_last=drop_last
        )
        ours = rloader.DistributedSampler(
            range(n), replicas, rank, shuffle=False, drop_last=drop_last
        )
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
        assert len(ours) == len(theirs)
        if n == 0 and not drop_last:
            continue  # torch divides by zero padding an empty dataset
        assert list(ours) == list(theirs)


@pytest.mark.parametrize("n,replicas,drop_last", [c for c in CASES if c[0] > 0])
def test_distributed_shuffled_partition(n, replicas, drop_last):
    shards = [
        list(rloader.DistributedSampler(range(n), replicas, r, seed=7, drop_last=drop_last))
        for r in range(replicas)
    ]
    theirs = tud.distributed.DistributedSampler(range(n), replicas, 0, drop_last=drop_last)
    assert all(len(s) == theirs.num_samples for s in shards)
    # Interleaving the shards rebuilds the (padded or trimmed) order, as torch builds it.
    order = [shards[i % replicas][i // replicas] for i in range(theirs.total_size)]
    if drop_last:
        assert len(set(order)) == len(order)
    else:
        base = order[:n]
        assert sorted(base) == list(range(n))
        padding = order[n:]
        assert padding == (base * math.ceil(max(len(padding), 1) / n))[: len(padding)]


def test_distributed_set_epoch_and_seed():
    s = rloader.DistributedSampler(range(1000), 4, 1, seed=3)
    e0 = list(s)
    assert list(s) == e0
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    other = rloader.DistributedSampler(range(1000), 4, 1, seed=4)
    assert list(other) != e0
    # seed + epoch decides: (3, epoch 1) == (4, epoch 0), as in torch.
    assert list(other) == e1


@pytest.mark.parametrize("rank", [-1, 4, 10])
def test_distributed_bad_rank_matches_torch(rank):
    with pytest.raises(ValueError) as theirs:
        tud.distributed.DistributedSampler(range(10), 4, rank)
    with pytest.raises(ValueError) as ours:
        rloader.DistributedSampler(range(10), 4, rank)
    assert str(ours.value) == str(theirs.value)


def test_distributed_without_process_group_raises_like_torch():
    with pytest.raises(Exception) as theirs:
        tud.distributed.DistributedSampler(range(10))
    with pytest.raises(type(theirs.value)) as ours:
        rloader.DistributedSampler(range(10))
    assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------- interop with torch's DataLoader


def test_rloader_samplers_work_in_torchs_dataloader():
    data = list(range(20))
    loader = tud.DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 6, False))
    assert [b.tolist() for b in loader] == [list(range(i, min(i + 6, 20))) for i in range(0, 20, 6)]
    loader = tud.DataLoader(data, sampler=RandomSampler(data, generator=gen(0)), batch_size=5)
    assert sorted(x for b in loader for x in b.tolist()) == data


def _indices_threads() -> int:
    # The thread is Rust's, not Python's: count it through /proc.
    return thread_names().count("rloader-indices")


def test_weighted_draws_ahead_on_a_thread_that_goes_with_the_iterator():
    # NOTE [Prefetched indices]: the draws run ahead on a thread of their own; the order is the
    # stream's, and a half-read iterator takes its thread with it.
    import gc

    weights = torch.rand(100_000, generator=torch.Generator().manual_seed(3)).double()
    sampler = rloader.WeightedRandomSampler(
        weights, 100_000, generator=torch.Generator().manual_seed(4)
    )
    whole = list(sampler)
    sampler.generator = torch.Generator().manual_seed(4)
    it = iter(sampler)
    head = [next(it) for _ in range(10)]
    assert head == whole[:10]
    assert _indices_threads() == 1
    del it
    gc.collect()
    assert _indices_threads() == 0
