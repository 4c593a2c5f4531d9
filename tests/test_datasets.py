"""rloader.dataset against torch.utils.data.dataset, the oracle.

Each behaviour is built twice, once from torch's classes and once from rloader's, and the two
must agree: the same items, lengths and attributes, the same exceptions (type and text), the
same warnings; random_split makes torch's split for every seed.
"""

from __future__ import annotations

import pickle
import typing

import pytest
import torch
import torch.utils.data as tud
from _datasets import Batched, ItemStream, RStream, ShortBatched, SquareInts
from hypothesis import given, settings
from hypothesis import strategies as st

import rloader
from rloader import _compat
from rloader import dataset as rl

from _compare import assert_same_outcome, ok, outcome, same

CLASSES = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
]


def tensors(n=5):
    return torch.arange(n * 2).reshape(n, 2), torch.arange(n) * 10.0


# ---------------------------------------------------------------------------------------------
# class relationships, generics


@pytest.mark.parametrize("name", CLASSES)
def test_each_class_subclasses_torchs(name):
    assert issubclass(getattr(rl, name), getattr(tud, name))
    assert getattr(rl, name) is not getattr(tud, name)


@pytest.mark.parametrize("name", [*CLASSES, "random_split"])
def test_package_exports_these_objects(name):
    assert getattr(rloader, name) is getattr(rl, name)


def test_isinstance_both_ways():
    t = tensors()
    ours = [
        rl.TensorDataset(*t),
        rl.ConcatDataset([SquareInts(2)]),
        rl.Subset(SquareInts(3), [0]),
        rl.StackDataset(SquareInts(2)),
    ]
    for ds in ours:
        assert isinstance(ds, tud.Dataset) and isinstance(ds, rl.Dataset)
        assert not isinstance(ds, tud.IterableDataset)
    chain = rl.ChainDataset([ItemStream([1])])
    assert isinstance(chain, tud.IterableDataset) and isinstance(chain, tud.Dataset)
    assert isinstance(RStream([]), tud.IterableDataset)
    # torch's objects pass checks against rloader's names too (rloader._twin)
    assert isinstance(tud.TensorDataset(*t), rl.Dataset) and isinstance(
        tud.TensorDataset(*t), rl.TensorDataset
    )
    assert isinstance(ItemStream([]), rl.IterableDataset)
    assert not isinstance(tud.TensorDataset(*t), rl.IterableDataset)


def test_generics():
    T = typing.TypeVar("T")
    assert typing.get_args(rl.Dataset[int]) == (int,)
    assert typing.get_origin(rl.IterableDataset[str]) is rl.IterableDataset

    class Ints(rl.Dataset[int]):
        def __getitem__(self, i) -> int:
            return i

    class Gen(rl.IterableDataset[T]):
        def __iter__(self):
            return iter([1, 2])

    assert Ints()[3] == 3 and list(Gen[int]()) == [1, 2]
    assert isinstance(Gen(), tud.IterableDataset)
    assert typing.Generic in rl.Dataset.__mro__
    assert typing.get_args(rl.Subset[str]) == (str,)


def test_base_dataset_behaves_like_torchs():
    assert_same_outcome(
        lambda: rl.Dataset()[0], lambda: tud.Dataset()[0], expect=NotImplementedError
    )
    # no __len__ and no __getitems__ (the fetcher treats its presence as batch support)
    assert_same_outcome(lambda: len(rl.Dataset()), lambda: len(tud.Dataset()), expect=TypeError)
    assert not hasattr(rl.Dataset(), "__getitems__")
    assert not hasattr(rl.IterableDataset, "__getitems__")


def test_iterable_dataset_stays_abstract():
    assert_same_outcome(rl.IterableDataset, tud.IterableDataset, expect=TypeError)


def test_add_builds_concat_and_chain():
    a, b = rl.Subset(SquareInts(4), [1, 2]), rl.Subset(SquareInts(4), [3])
    both = a + b
    assert type(both) is rl.ConcatDataset and both.datasets == [a, b]
    assert [both[i] for i in range(3)] == [1, 4, 9]
    chain = RStream([1, 2]) + RStream([3])
    assert type(chain) is rl.ChainDataset and list(chain) == [1, 2, 3]
    # torch's + on our objects and ours on torch's both work
    assert type(SquareInts(2) + a) is tud.ConcatDataset
    assert type(a + SquareInts(2)) is rl.ConcatDataset
    assert type(RStream([1]) + ItemStream([2])) is rl.ChainDataset
    assert list(ItemStream([0]) + RStream([1])) == [0, 1]


def test_add_mixing_kinds_fails_like_torch():
    assert_same_outcome(
        lambda: rl.Subset(SquareInts(2), [0]) + RStream([1]),
        lambda: tud.Subset(SquareInts(2), [0]) + ItemStream([1]),
        expect=AssertionError,
    )
    assert_same_outcome(
        lambda: list(RStream([1]) + rl.Subset(SquareInts(2), [0])),
        lambda: list(ItemStream([1]) + tud.Subset(SquareInts(2), [0])),
        expect=AssertionError,
    )


# ---------------------------------------------------------------------------------------------
# TensorDataset


@pytest.mark.parametrize("index", [0, 4, -1, -5, slice(1, 3), [0, 2], torch.tensor(2)])
def test_tensor_dataset_items(index):
    t = tensors()
    assert same(rl.TensorDataset(*t)[index], tud.TensorDataset(*t)[index])


def test_tensor_dataset_attributes():
    t = tensors()
    ours = rl.TensorDataset(*t)
    assert ours.tensors is not None and type(ours.tensors) is tuple
    assert all(a is b for a, b in zip(ours.tensors, t))
    assert len(ours) == 5 and type(len(ours)) is int


@pytest.mark.parametrize("index", [5, -6])
def test_tensor_dataset_out_of_range(index):
    t = tensors()
    assert_same_outcome(
        lambda: rl.TensorDataset(*t)[index],
        lambda: tud.TensorDataset(*t)[index],
        expect=IndexError,
    )


def test_tensor_dataset_bad_input():
    got = assert_same_outcome(
        rl.TensorDataset, tud.TensorDataset, torch.zeros(3), torch.zeros(4), expect=AssertionError
    )
    assert got == ("err", AssertionError, "Size mismatch between tensors")
    assert_same_outcome(rl.TensorDataset, tud.TensorDataset, torch.tensor(1.0), expect=IndexError)


def test_tensor_dataset_of_no_tensors_is_accepted_until_used():
    assert rl.TensorDataset().tensors == tud.TensorDataset().tensors == ()
    assert_same_outcome(
        lambda: len(rl.TensorDataset()), lambda: len(tud.TensorDataset()), expect=IndexError
    )
    got = assert_same_outcome(
        lambda: rl.TensorDataset()[0], lambda: tud.TensorDataset()[0], expect=ok
    )
    assert got == ("ok", ())


# ---------------------------------------------------------------------------------------------
# StackDataset


def test_stack_dataset_tuple_and_dict():
    t = tensors()
    parts = (tud.TensorDataset(*t), SquareInts(5))
    ours_t, theirs_t = rl.StackDataset(*parts), tud.StackDataset(*parts)
    ours_d, theirs_d = (
        rl.StackDataset(b=parts[1], a=parts[0]),
        tud.StackDataset(b=parts[1], a=parts[0]),
    )
    for ours, theirs in [(ours_t, theirs_t), (ours_d, theirs_d)]:
        assert len(ours) == len(theirs) == ours._length == 5
        assert type(ours.datasets) is type(theirs.datasets)
        for i in [0, 3, -1]:
            assert same(ours[i], theirs[i])
    assert ours_t.datasets == parts and list(ours_d.datasets) == ["b", "a"]


@pytest.mark.parametrize("indices", [[], [0], [4, 0, 4, -1]])
def test_stack_dataset_getitems(indices):
    def build(cls, **kw):
        b1, b2 = Batched(5), Batched(5)
        plain = SquareInts(5)
        if kw:
            return cls(x=b1, y=plain, z=b2), b1
        return cls(b1, plain, b2), b1

    for kw in ({}, {"dict": True}):
        (ours, ours_b), (theirs, theirs_b) = (
            build(rl.StackDataset, **kw),
            build(tud.StackDataset, **kw),
        )
        assert same(ours.__getitems__(indices), theirs.__getitems__(indices))
        assert ours_b.batched_calls == theirs_b.batched_calls == [indices]


def test_stack_dataset_nested_size_mismatch():
    for args, kwargs in [((ShortBatched(3), SquareInts(3)), {}), ((), {"a": ShortBatched(3)})]:
        got = assert_same_outcome(
            lambda: rl.StackDataset(*args, **kwargs).__getitems__([0, 1]),  # noqa: B023 - called at once
            lambda: tud.StackDataset(*args, **kwargs).__getitems__([0, 1]),  # noqa: B023 - called at once
            expect=ValueError,
        )
        message = "Nested dataset's output size mismatch. Expected 2, got 1"
        assert got == ("err", ValueError, message)


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        ((SquareInts(2),), {"b": SquareInts(2)}, ValueError),
        ((), {}, ValueError),
        ((SquareInts(2), SquareInts(3)), {}, ValueError),
        ((), {"a": SquareInts(2), "b": SquareInts(3)}, ValueError),
        ((SquareInts(2), 5), {}, TypeError),  # len(5)
    ],
)
def test_stack_dataset_bad_input(args, kwargs, error):
    assert_same_outcome(
        lambda: rl.StackDataset(*args, **kwargs),
        lambda: tud.StackDataset(*args, **kwargs),
        expect=error,
    )


# ---------------------------------------------------------------------------------------------
# ConcatDataset


def concat_parts():
    t = tensors(3)
    return [tud.TensorDataset(*t), rl.TensorDataset(*t[::-1]), SquareInts(0), SquareInts(4)]


def test_concat_dataset_items_and_attributes():
    parts = concat_parts()
    ours, theirs = rl.ConcatDataset(parts), tud.ConcatDataset(parts)
    assert ours.datasets == theirs.datasets and type(ours.datasets) is list
    assert ours.cumulative_sizes == theirs.cumulative_sizes == [3, 6, 6, 10]
    assert len(ours) == len(theirs) == 10
    for i in range(-10, 10):
        assert same(ours[i], theirs[i]), i
    assert rl.ConcatDataset.cumsum(parts) == tud.ConcatDataset.cumsum(parts)
    assert rl.ConcatDataset.cumsum([]) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=5))
def test_concat_dataset_every_index_random_parts(part_lengths):
    parts = [tud.TensorDataset(torch.arange(n) + 100 * k) for k, n in enumerate(part_lengths)]
    ours, theirs = rl.ConcatDataset(parts), tud.ConcatDataset(parts)
    assert ours.cumulative_sizes == theirs.cumulative_sizes
    total = len(theirs)
    for index in range(-total - 2, total + 2):
        if index < -total:
            expect = ValueError  # "absolute value of index should not exceed dataset length"
        else:
            expect = ok if index < total else IndexError
        assert_same_outcome(lambda: ours[index], lambda: theirs[index], expect=expect)  # noqa: B023 - called at once


def test_concat_dataset_takes_any_iterable():
    ours = rl.ConcatDataset(SquareInts(n) for n in (1, 2))
    assert type(ours.datasets) is list and len(ours) == 3


@pytest.mark.parametrize("index", [-11, -100, 10, 11])
def test_concat_dataset_out_of_range(index):
    parts = concat_parts()
    assert_same_outcome(
        lambda: rl.ConcatDataset(parts)[index],
        lambda: tud.ConcatDataset(parts)[index],
        expect=ValueError if index < 0 else IndexError,
    )


@pytest.mark.parametrize(
    "parts",
    [[], iter([]), [SquareInts(2), ItemStream([1])], [RStream([1])], [rl.ChainDataset([])]],
    ids=["empty", "empty-iter", "torch-iterable", "ours-iterable", "chain"],
)
def test_concat_dataset_bad_input(parts):
    parts = list(parts)
    assert_same_outcome(
        lambda: rl.ConcatDataset(parts), lambda: tud.ConcatDataset(parts), expect=AssertionError
    )


def test_concat_dataset_deprecated_attribute():
    parts = concat_parts()
    assert_same_outcome(
        lambda: rl.ConcatDataset(parts).cummulative_sizes,
        lambda: tud.ConcatDataset(parts).cummulative_sizes,
        expect=ok,
    )
    with pytest.warns(FutureWarning, match="renamed to `cumulative_sizes`"):
        assert rl.ConcatDataset(parts).cummulative_sizes == [3, 6, 6, 10]


def test_torch_concat_of_our_datasets():
    t = tensors(3)
    mixed = tud.ConcatDataset([rl.TensorDataset(*t), rl.Subset(SquareInts(5), [4, 0])])
    assert len(mixed) == 5 and mixed[-1] == 0 and mixed[3] == 16


# ---------------------------------------------------------------------------------------------
# ChainDataset


def test_chain_dataset():
    parts = [ItemStream([1, 2]), RStream([]), RStream([3])]
    ours, theirs = rl.ChainDataset(parts), tud.ChainDataset(parts)
    assert ours.datasets is parts
    assert list(ours) == list(theirs) == [1, 2, 3]
    assert len(ours) == len(theirs) == 3
    generator = (p for p in parts)
    assert rl.ChainDataset(generator).datasets is generator


def test_chain_dataset_checks_lazily():
    parts = [ItemStream([1]), SquareInts(2)]
    ours, theirs = rl.ChainDataset(parts), tud.ChainDataset(parts)  # no error yet
    got = assert_same_outcome(lambda: list(ours), lambda: list(theirs), expect=AssertionError)
    assert got == ("err", AssertionError, "ChainDataset only supports IterableDataset")
    assert_same_outcome(lambda: len(ours), lambda: len(theirs), expect=AssertionError)
    it = iter(ours)
    assert next(it) == 1  # items before the bad part are still yielded
    with pytest.raises(AssertionError):
        next(it)


def test_chain_dataset_unsized_part():
    parts = [ItemStream([1], sized=False)]
    got = assert_same_outcome(
        lambda: len(rl.ChainDataset(parts)), lambda: len(tud.ChainDataset(parts)), expect=TypeError
    )
    assert got == ("err", TypeError, "Stream has no length")


# ---------------------------------------------------------------------------------------------
# Subset


@pytest.mark.parametrize(
    "index, expect",
    [(0, ok), (2, ok), (-1, ok), ([0, 2], ok), ([], ok), (3, IndexError), (-4, IndexError)],
)
def test_subset_getitem(index, expect):
    t = tensors(6)
    base = tud.TensorDataset(*t)
    indices = [5, 1, 3]
    assert_same_outcome(
        lambda: rl.Subset(base, indices)[index],
        lambda: tud.Subset(base, indices)[index],
        expect=expect,
    )


def test_subset_attributes():
    base, indices = SquareInts(5), range(4, 0, -1)
    ours = rl.Subset(base, indices)
    assert ours.dataset is base and ours.indices is indices and len(ours) == 4
    assert [ours[i] for i in range(4)] == [16, 9, 4, 1]


@pytest.mark.parametrize("indices", [[], [0], [2, 0, 2, -1]])
def test_subset_getitems(indices):
    ours_base, theirs_base = Batched(6), Batched(6)
    ours = rl.Subset(ours_base, [5, 3, 1]).__getitems__(indices)
    theirs = tud.Subset(theirs_base, [5, 3, 1]).__getitems__(indices)
    assert ours == theirs and ours_base.batched_calls == theirs_base.batched_calls
    assert_same_outcome(
        lambda: rl.Subset(SquareInts(6), [5, 3, 1]).__getitems__(indices),
        lambda: tud.Subset(SquareInts(6), [5, 3, 1]).__getitems__(indices),
        expect=ok,
    )


def test_nested_subsets_mix_freely():
    inner_t, inner_r = (
        tud.Subset(SquareInts(10), range(0, 10, 2)),
        rl.Subset(SquareInts(10), range(0, 10, 2)),
    )
    ours, theirs = rl.Subset(inner_t, [4, 0]), tud.Subset(inner_r, [4, 0])
    assert [ours[0], ours[1]] == [theirs[0], theirs[1]] == [64, 0]
    assert ours.__getitems__([1, 0]) == theirs.__getitems__([1, 0]) == [0, 64]


def _subset_subclass(base, name, with_getitems):
    body = {"__getitem__": lambda self, idx: ("custom", idx)}
    if with_getitems:
        body["__getitems__"] = lambda self, indices: [self[i] for i in indices]
    return type(name, (base,), body)


def test_subset_subclass_must_override_getitems_too():
    ours_cls = _subset_subclass(rl.Subset, "MySubset", False)
    theirs_cls = _subset_subclass(tud.Subset, "MySubset", False)
    if _compat.TORCH >= "2.11":  # torch refuses such a subclass from 2.11
        got = assert_same_outcome(
            lambda: ours_cls(SquareInts(3), [0]),
            lambda: theirs_cls(SquareInts(3), [0]),
            expect=NotImplementedError,
        )
        assert got[2].startswith("MySubset overrides __getitem__ but not __getitems__.")
    else:  # and accepts it before
        assert ours_cls(SquareInts(3), [0]).indices == theirs_cls(SquareInts(3), [0]).indices == [0]
    ok = _subset_subclass(rl.Subset, "GoodSubset", True)(SquareInts(3), [0])
    assert ok.__getitems__([0]) == [("custom", 0)]
    only_getitems = type("X", (rl.Subset,), {"__getitems__": lambda self, i: []})
    assert only_getitems(SquareInts(3), [0])[0] == 0


# ---------------------------------------------------------------------------------------------
# pickling, DataLoader interop


def pickle_cases():
    t = tensors(4)
    return [
        rl.TensorDataset(*t),
        rl.StackDataset(rl.TensorDataset(*t), SquareInts(4)),
        rl.StackDataset(a=SquareInts(4)),
        rl.ConcatDataset([rl.TensorDataset(*t), SquareInts(3)]),
        rl.Subset(rl.TensorDataset(*t), [3, 0]),
        rl.ChainDataset([RStream([1, 2]), ItemStream([3])]),
    ]


@pytest.mark.parametrize("ds", pickle_cases(), ids=lambda d: type(d).__name__)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip(ds, protocol):
    back = pickle.loads(pickle.dumps(ds, protocol=protocol))
    assert type(back) is type(ds)
    if isinstance(ds, tud.IterableDataset):
        assert list(back) == list(ds)
    else:
        assert len(back) == len(ds)
        assert all(same(back[i], ds[i]) for i in range(len(ds)))
    assert vars(back).keys() == vars(ds).keys()


def test_random_split_result_pickles():
    parts = rl.random_split(SquareInts(7), [3, 4], generator=torch.Generator().manual_seed(1))
    back = pickle.loads(pickle.dumps(parts))
    assert [type(p) for p in back] == [rl.Subset, rl.Subset]
    assert [p.indices for p in back] == [p.indices for p in parts]


def test_torch_dataloader_over_our_datasets():
    t = tensors(7)
    pairs = [
        (rl.TensorDataset(*t), tud.TensorDataset(*t)),
        (rl.Subset(rl.TensorDataset(*t), [6, 2, 4]), tud.Subset(tud.TensorDataset(*t), [6, 2, 4])),
        (rl.StackDataset(SquareInts(7), Batched(7)), tud.StackDataset(SquareInts(7), Batched(7))),
        (
            rl.ConcatDataset([SquareInts(3), SquareInts(4)]),
            tud.ConcatDataset([SquareInts(3), SquareInts(4)]),
        ),
        (rl.ChainDataset([ItemStream([1, 2, 3])]), tud.ChainDataset([ItemStream([1, 2, 3])])),
    ]
    for ours, theirs in pairs:
        got = list(tud.DataLoader(ours, batch_size=2))
        want = list(tud.DataLoader(theirs, batch_size=2))
        assert len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))


# ---------------------------------------------------------------------------------------------
# random_split


def split_indices(parts):
    return [list(p.indices) for p in parts]


@pytest.mark.parametrize(
    "n, lengths",
    [
        (10, [3, 7]),
        (10, [10]),
        (10, [0, 10]),
        (0, []),
        (0, [0, 0]),
        (10, [0.3, 0.7]),
        (10, [0.5, 0.5]),
        (7, [0.5, 0.5]),
        (11, [0.1, 0.2, 0.3, 0.4]),
        (30, [0.3, 0.3, 0.4]),
        (2, [1 / 3, 1 / 3, 1 / 3]),
        (5, [1.0]),
        (5, [0.0, 1.0]),
        (1, [1]),
    ],
)
def test_random_split_lengths_match_torch(n, lengths):
    gen = torch.Generator().manual_seed(0)
    assert_same_outcome(
        lambda: [len(p) for p in rl.random_split(range(n), lengths, generator=gen)],
        lambda: [len(p) for p in tud.random_split(range(n), lengths, generator=gen)],
        expect=ok,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 60),
    st.lists(st.integers(0, 20), min_size=1, max_size=6),
    st.booleans(),
)
def test_random_split_lengths_match_torch_random(n, weights, as_fractions):
    if as_fractions:
        total = sum(weights) or 1
        lengths = [w / total for w in weights]
    else:
        lengths = weights
    seed = n * 1000 + len(weights)
    ours, _ = outcome(
        lambda: split_indices(
            rl.random_split(range(n), lengths, torch.Generator().manual_seed(seed))
        )
    )
    theirs, _ = outcome(
        lambda: split_indices(
            tud.random_split(range(n), lengths, torch.Generator().manual_seed(seed))
        )
    )
    assert ours == theirs


@pytest.mark.parametrize("n, lengths", [(0, [0.0]), (10, [5.0, 5.0]), (4, [0.0, 4.0])])
def test_random_split_float_total_is_a_type_error(n, lengths):
    for split in (rl.random_split, tud.random_split):
        with pytest.raises(TypeError):
            split(range(n), lengths)


def test_random_split_empty_split_warning():
    def ours():
        return rl.random_split(range(3), [0.5, 0.3, 0.2], generator=torch.Generator())

    def theirs():
        return tud.random_split(range(3), [0.5, 0.3, 0.2], generator=torch.Generator())

    got, ours_warnings = outcome(ours)
    assert [len(p) for p in got[1]] == [2, 1, 0]
    assert ours_warnings == [
        (UserWarning, "Length of split at index 2 is 0. This might result in an empty dataset.")
    ]
    assert ours_warnings == outcome(theirs)[1]
    with pytest.warns(UserWarning) as record:
        ours()
    assert record[0].filename == __file__  # points at the caller, as torch's does


@pytest.mark.parametrize(
    "n, lengths",
    [(10, [3, 8]), (10, [3, 6]), (10, [0.3, 0.6]), (10, [1.5, -0.5]), (10, [-0.2, 1.2]), (3, [])],
)
def test_random_split_errors_match_torch_and_take_no_draw(n, lengths):
    ours_gen, theirs_gen = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert_same_outcome(
        lambda: rl.random_split(range(n), lengths, generator=ours_gen),
        lambda: tud.random_split(range(n), lengths, generator=theirs_gen),
        expect=ValueError,
    )
    assert torch.equal(ours_gen.get_state(), torch.Generator().manual_seed(5).get_state())


def test_random_split_is_a_disjoint_cover_of_subsets():
    base = SquareInts(50)
    parts = rl.random_split(base, [10, 0, 25, 15], generator=torch.Generator().manual_seed(3))
    assert all(type(p) is rl.Subset and p.dataset is base for p in parts)
    assert [len(p) for p in parts] == [10, 0, 25, 15]
    flat = [i for p in parts for i in p.indices]
    assert sorted(flat) == list(range(50))
    assert all(type(i) is int for i in flat)
    assert [parts[0][k] for k in range(10)] == [i * i for i in parts[0].indices]


@pytest.mark.parametrize(
    "n, lengths",
    [
        (10, [3, 7]),
        (20, [0.25, 0.75]),
        (11, [0.1, 0.2, 0.3, 0.4]),
        (1000, [500, 300, 200]),
        (1, [1]),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 9, 2**40])
def test_random_split_is_torchs_split_for_the_same_seed(n, lengths, seed):
    ours_gen, theirs_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    got = split_indices(rl.random_split(range(n), lengths, generator=ours_gen))
    assert got == split_indices(tud.random_split(range(n), lengths, generator=theirs_gen))
    # ... and leaves the generator where torch's leaves it
    assert torch.equal(ours_gen.get_state(), theirs_gen.get_state())


def test_random_split_issue_example():
    parts = rl.random_split(range(10), [3, 7], generator=torch.Generator().manual_seed(1))
    assert split_indices(parts) == [[5, 6, 1], [2, 0, 8, 9, 3, 7, 4]]


@pytest.mark.parametrize("generator", ["default", None])
def test_random_split_with_the_global_rng_is_torchs(generator, restore_global_rng):
    kwargs = {} if generator == "default" else {"generator": None}
    torch.manual_seed(123)
    got = split_indices(rl.random_split(range(50), [0.3, 0.7], **kwargs))
    after_ours = torch.get_rng_state()
    torch.manual_seed(123)
    assert got == split_indices(tud.random_split(range(50), [0.3, 0.7], **kwargs))
    assert torch.equal(after_ours, torch.get_rng_state())


def test_random_split_reproducible_from_generator():
    def run(seed):
        return split_indices(
            rl.random_split(range(40), [0.5, 0.5], generator=torch.Generator().manual_seed(seed))
        )

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.fixture
def restore_global_rng():
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def test_random_split_of_torch_and_our_datasets():
    t = tensors(6)
    for base in (tud.TensorDataset(*t), rl.TensorDataset(*t)):
        parts = rl.random_split(base, [2, 4], generator=torch.Generator().manual_seed(0))
        for p in parts:
            assert all(same(p[k], base[i]) for k, i in enumerate(p.indices))
    # torch's random_split over our datasets works too
    theirs = tud.random_split(rl.TensorDataset(*t), [3, 3])
    assert [len(p) for p in theirs] == [3, 3]
