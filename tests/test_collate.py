"""rloader._collate (collate, default_collate, default_convert, ...) against torch.utils.data's collate functions, the oracle.

Every test runs the same input through both and requires the same result: the same types all
the way down, the same tensor dtypes, shapes and values, the same exceptions (type and text) and
the same warnings.
"""

from __future__ import annotations

import collections
import copy
import importlib
import types
import warnings
from collections import OrderedDict, UserList, defaultdict, deque, namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud
import torch.utils.data._utils.collate as torch_collate
from _datasets import FloatRows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _compare import ANY_OUTCOME, INT64_OVERFLOW, assert_same, assert_same_outcome, ok, outcome

# (not `from rloader import collate`: the package re-exports the function `collate`, which
# shadows the submodule of the same name as a package attribute)
rl = importlib.import_module("rloader._collate")
_compat = importlib.import_module("rloader._compat")

Point = namedtuple("Point", ["x", "y"])
Triple = namedtuple("Triple", ["a", "b", "c"])

HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_collate(batch, *, expect):
    return assert_same_outcome(rl.default_collate, tud.default_collate, batch, expect=expect)


def check_convert(data, *, expect):
    return assert_same_outcome(rl.default_convert, tud.default_convert, data, expect=expect)


# ---------------------------------------------------------------------------------------------
# hypothesis: samples built from one random schema, so most batches collate successfully

NP_DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
]  # fmt: skip
TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
]  # fmt: skip

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
leaf_kinds = st.one_of(
    st.sampled_from(["int", "float", "bool", "number", "str", "np_str", "bytes"]).map(
        lambda k: (k,)
    ),
    st.tuples(st.just("tensor"), st.sampled_from(TORCH_DTYPES), shapes),
    st.tuples(st.just("array"), st.sampled_from(NP_DTYPES), shapes),
    st.tuples(st.just("np_scalar"), st.sampled_from(NP_DTYPES)),
)


def schemas(max_leaves=12):
    return st.recursive(
        leaf_kinds,
        lambda inner: st.one_of(
            st.tuples(
                st.just("dict"), st.dictionaries(st.text("abcxyz", min_size=1), inner, max_size=3)
            ),
            st.tuples(st.just("list"), st.lists(inner, max_size=3)),
            st.tuples(st.just("tuple"), st.lists(inner, max_size=3)),
            st.tuples(st.just("point"), st.tuples(inner, inner)),
        ),
        max_leaves=max_leaves,
    )


def sample_of(schema, draw):
    kind = schema[0]
    if kind == "int":
        return draw(st.integers(-(2**62), 2**62))
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True, width=64))
    if kind == "bool":
        return draw(st.booleans())
    if kind == "number":  # first element decides the handler: mixing exercises that
        return draw(st.one_of(st.integers(-100, 100), st.floats(-1e6, 1e6), st.booleans()))
    if kind == "str":
        return draw(st.text(max_size=4))
    if kind == "np_str":
        return np.str_(draw(st.text(max_size=4)))
    if kind == "bytes":
        return draw(st.binary(max_size=4))
    if kind in ("tensor", "array"):
        dtype, shape = schema[1], schema[2]
        numel = int(np.prod(shape))
        values = draw(st.lists(st.integers(0, 100), min_size=numel, max_size=numel))
        array = np.array(values, dtype=np.int64).reshape(shape)
        if kind == "array":
            return array.astype(dtype)
        return torch.from_numpy(array).to(dtype)
    if kind == "np_scalar":
        return schema[1](draw(st.integers(0, 100)))
    if kind == "dict":
        return {key: sample_of(sub, draw) for key, sub in schema[1].items()}
    if kind == "list":
        return [sample_of(sub, draw) for sub in schema[1]]
    if kind == "tuple":
        return tuple(sample_of(sub, draw) for sub in schema[1])
    if kind == "point":
        return Point(*(sample_of(sub, draw) for sub in schema[1]))
    raise AssertionError(kind)


@st.composite
def batches(draw):
    schema = draw(schemas())
    size = draw(st.integers(1, 4))
    return [sample_of(schema, draw) for _ in range(size)]


@HYPOTHESIS
@given(batches())
def test_default_collate_matches_torch_on_random_nested_batches(batch):
    check_collate(batch, expect=ANY_OUTCOME)


@HYPOTHESIS
@given(batches())
def test_default_convert_matches_torch_on_random_nested_samples(batch):
    check_convert(batch[0], expect=ANY_OUTCOME)
    check_convert(batch, expect=ANY_OUTCOME)


@HYPOTHESIS
@given(st.lists(st.one_of(st.integers(-5, 5), st.floats(-5, 5), st.booleans()), min_size=1))
def test_mixed_python_numbers_take_the_first_elements_handler(batch):
    check_collate(batch, expect=ok)


@HYPOTHESIS
@given(
    st.lists(
        st.tuples(st.sampled_from(NP_DTYPES), st.integers(0, 100)).map(lambda p: p[0](p[1])),
        min_size=1,
        max_size=4,
    )
)
def test_numpy_scalars_of_mixed_dtypes(batch):
    check_collate(batch, expect=ANY_OUTCOME)
    check_convert(batch, expect=ANY_OUTCOME)


# ---------------------------------------------------------------------------------------------
# leaves: ints, floats, bools, strings, numpy scalars


@pytest.mark.parametrize(
    "batch",
    [
        [0, 1, 2],
        [True, False],
        [True, 5],
        [1, 2.5],
        [2.5, 1],
        [1.0, float("nan"), float("inf")],
        [2**63 - 1, -(2**63)],
        [np.float64(1.5), 2],
        [np.int32(3), np.int32(4)],
        [np.bool_(True), np.bool_(False)],
        [np.float16(1.5)],
        [np.complex64(1 + 2j)],
    ],
)
def test_number_batches(batch):
    # torch 2.6 with numpy 2 cannot collate numpy bools (its own error, which rloader gives too)
    old_bools = _compat.TORCH < "2.7" and isinstance(batch[0], np.bool_)
    check_collate(batch, expect=ANY_OUTCOME if old_bools else ok)


def test_int_and_float_dtypes_are_torchs():
    assert rl.default_collate([1, 2]).dtype == torch.int64
    assert rl.default_collate([1.0, 2]).dtype == torch.float64
    assert rl.default_collate([True, False]).dtype == torch.bool


def test_python_int_too_large_for_int64_fails_like_torch():
    check_collate([2**64, 1], expect=INT64_OVERFLOW)


def test_int_subclass_goes_through_the_int_handler():
    class Small(int):
        pass

    check_collate([Small(1), Small(2)], expect=ok)


@pytest.mark.parametrize("batch", [["a", "b"], [b"a", b"b"], [np.str_("a"), np.str_("b")]])
def test_strings_and_bytes_come_back_as_the_same_list(batch):
    check_collate(batch, expect=ok)
    assert rl.default_collate(batch) is batch
    assert tud.default_collate(batch) is batch


def test_numpy_bytes_scalar():
    check_collate([np.bytes_(b"a"), np.bytes_(b"b")], expect=ok)
    check_convert(np.bytes_(b"a"), expect=TypeError)
    check_convert(np.str_("a"), expect=ok)


@pytest.mark.parametrize("leaf", [None, object(), 1j, {1, 2}, Ellipsis])
def test_unsupported_leaves_raise_torchs_type_error(leaf):
    check_collate([leaf, leaf], expect=TypeError)


def test_unsupported_leaf_inside_dict_raises_the_leafs_error():
    got = check_collate([{"a": None}, {"a": None}], expect=TypeError)
    assert "NoneType" in got[2]


def test_error_message_format_is_torchs():
    assert rl.default_collate_err_msg_format == torch_collate.default_collate_err_msg_format
    with pytest.raises(TypeError, match="found <class 'NoneType'>"):
        rl.default_collate([None])


# ---------------------------------------------------------------------------------------------
# tensors


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_tensor_batches_keep_dtype(dtype):
    batch = [torch.arange(6).reshape(2, 3).to(dtype) for _ in range(3)]
    check_collate(batch, expect=ok)


def test_stacked_tensor_is_a_new_tensor():
    batch = [torch.zeros(2), torch.ones(2)]
    out = rl.default_collate(batch)
    out[0, 0] = 5
    assert batch[0][0] == 0


def test_unequal_tensor_sizes_raise_torchs_error():
    check_collate([torch.zeros(2), torch.zeros(3)], expect=RuntimeError)


def test_unequal_tensor_dtypes_follow_torch():
    check_collate(
        [torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.float64)], expect=ok
    )


def test_zero_dim_and_empty_tensors():
    check_collate([torch.tensor(1.5), torch.tensor(2.5)], expect=ok)
    check_collate([torch.zeros(0, 3), torch.zeros(0, 3)], expect=ok)


def test_non_contiguous_tensors():
    base = torch.arange(12.0).reshape(3, 4)
    check_collate([base.t(), base.t() * 2], expect=ok)


def test_tensor_subclass_output_type():
    param = torch.nn.Parameter(torch.zeros(2))
    check_collate([param, param], expect=ok)


def quietly(make, *args):
    """Build a prototype/beta tensor kind without its construction warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(*args)


def test_nested_tensors_are_refused():
    nested = quietly(torch.nested.nested_tensor, [torch.zeros(2), torch.zeros(3)])
    got = check_collate([nested, nested], expect=RuntimeError)
    assert "nested tensors" in got[2]


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.to_sparse(),
        lambda t: t.to_sparse_csr(),
        lambda t: t.to_sparse_csc(),
        lambda t: t.to_sparse_bsr((1, 1)),
        lambda t: t.to_sparse_bsc((1, 1)),
    ],
)
def test_sparse_tensors_are_refused(make):
    sparse = quietly(make, torch.eye(2))
    got = check_collate([sparse, sparse], expect=RuntimeError)
    assert "sparse tensors" in got[2]


def test_stacks_into_shared_memory_inside_a_worker(monkeypatch):
    batch = [torch.arange(3.0), torch.arange(3.0) + 1]
    fake = types.SimpleNamespace(id=0, num_workers=1)
    assert not rl.default_collate(batch).is_shared()
    monkeypatch.setattr(rl, "get_worker_info", lambda: fake)
    monkeypatch.setattr(tud, "get_worker_info", lambda: fake)  # torch looks it up per call
    ours, theirs = rl.default_collate(batch), tud.default_collate(batch)
    assert ours.is_shared() and theirs.is_shared()
    assert_same(ours, theirs)


def _collate_reporting_shared(batch):
    out = rl.default_collate(batch)
    return out, out.is_shared()


@pytest.mark.timeout(120)
def test_real_dataloader_worker_stacks_into_shared_memory():
    loader = tud.DataLoader(
        FloatRows(4, 2), batch_size=2, num_workers=1, collate_fn=_collate_reporting_shared
    )
    got = list(loader)
    assert [shared for _, shared in got] == [True, True]
    assert_same([out for out, _ in got], list(tud.DataLoader(FloatRows(4, 2), batch_size=2)))


# ---------------------------------------------------------------------------------------------
# numpy arrays


@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_numpy_array_batches(dtype):
    batch = [np.arange(6).reshape(2, 3).astype(dtype) for _ in range(2)]
    check_collate(batch, expect=ok)
    check_convert(batch, expect=ok)


@pytest.mark.parametrize(
    "array",
    [np.array(["a", "bc"]), np.array([b"a", b"bc"]), np.array([1, "a"], dtype=object)],
    ids=["unicode", "bytes", "object"],
)
def test_numpy_string_and_object_arrays(array):
    got = check_collate([array, array], expect=TypeError)
    assert str(array.dtype) in got[2]
    # default_convert leaves them as they are (the very same object)
    assert rl.default_convert(array) is array
    check_convert([array], expect=ok)


def test_numpy_memmap(tmp_path):
    arrays = []
    for i in range(3):
        mm = np.memmap(tmp_path / f"m{i}.dat", dtype=np.float32, mode="w+", shape=(2, 3))
        mm[:] = np.arange(6, dtype=np.float32).reshape(2, 3) + i
        mm.flush()
        arrays.append(np.memmap(tmp_path / f"m{i}.dat", dtype=np.float32, mode="r+", shape=(2, 3)))
    check_collate(arrays, expect=ok)
    check_convert(arrays[0], expect=ok)
    check_convert(arrays, expect=ok)


def test_unequal_numpy_shapes():
    check_collate([np.zeros(2), np.zeros(3)], expect=RuntimeError)


def test_non_writable_arrays_warn_like_torch():
    array = np.arange(3)
    array.flags.writeable = False
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once per process otherwise
    try:
        check_collate([array, array], expect=ok)
        _, ours_warnings = outcome(rl.default_collate, [array, array])
        check_convert(array, expect=ok)
        _, convert_warnings = outcome(rl.default_convert, array)
    finally:
        torch.set_warn_always(previous)
    assert ours_warnings and all("not writable" in msg for _, msg in ours_warnings)
    assert convert_warnings and all(cat is UserWarning for cat, _ in convert_warnings)


def test_default_convert_shares_memory_with_the_array():
    ours_in, theirs_in = np.arange(3.0), np.arange(3.0)
    ours, theirs = rl.default_convert(ours_in), tud.default_convert(theirs_in)
    ours_in[0] = theirs_in[0] = 7
    assert_same(ours, theirs)
    assert ours[0] == 7


def test_default_convert_of_numpy_scalars_and_0d_arrays():
    for value in [np.float32(1.5), np.int8(-3), np.bool_(True), np.array(4.0), np.array(5)]:
        check_convert(value, expect=ok)


# ---------------------------------------------------------------------------------------------
# containers


@pytest.mark.parametrize(
    "batch",
    [
        [{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}],
        [(1, 2), (3, 4)],
        [[1, 2], [3, 4]],
        [Point(1, 2.0), Point(3, 4.0)],
        [Point(torch.zeros(2), "s"), Point(torch.ones(2), "t")],
        [{"p": [Point(1, (2, 3))]}, {"p": [Point(4, (5, 6))]}],
        [((),), ((),)],
        [[], []],
        [{}, {}],
        [(np.zeros(2), {"k": b"x"})],
    ],
)
def test_container_batches(batch):
    check_collate(batch, expect=ok)
    check_convert(batch, expect=ok)
    check_convert(batch[0], expect=ok)


def test_tuple_becomes_list_namedtuple_stays():
    assert type(rl.default_collate([(1, 2), (3, 4)])) is list
    assert type(rl.default_collate([Point(1, 2)])) is Point
    assert type(rl.default_convert((1, 2))) is list


def test_unequal_list_lengths():
    got = check_collate([[1, 2], [3]], expect=RuntimeError)
    assert got == ("err", RuntimeError, "each element in list of batch should be of equal size")
    got = check_collate([(1,), (2, 3)], expect=RuntimeError)


def test_namedtuples_of_unequal_length_are_truncated_like_torch():
    check_collate([Triple(1, 2, 3), Point(4, 5)], expect=TypeError)


def test_missing_dict_key():
    check_collate([{"a": 1, "b": 2}, {"a": 3}], expect=KeyError)


def test_ordered_and_default_dicts_keep_type_and_state():
    batch = [defaultdict(list, a=1), defaultdict(list, a=2)]
    ours = rl.default_collate(batch)
    check_collate(batch, expect=ok)
    assert ours.default_factory is list
    assert ours is not batch[0] and batch[0]["a"] == 1  # a copy, the input is untouched
    check_collate([OrderedDict(b=1, a=2), OrderedDict(b=3, a=4)], expect=ok)
    check_convert(defaultdict(int, a=np.zeros(1)), expect=ok)


class TaggedDict(dict):
    """A dict with extra state that a plain ``TaggedDict(values)`` would drop."""

    def __init__(self, *args, tag=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tag = tag


def test_mutable_mapping_is_copied_with_its_attributes():
    batch = [TaggedDict(a=1, tag="t"), TaggedDict(a=2, tag="u")]
    ours = rl.default_collate(batch)
    check_collate(batch, expect=ok)
    assert ours.tag == "t" and batch[0]["a"] == 1


class NoCopyDict(dict):
    def __copy__(self):
        raise TypeError("no copies")


class FrozenMapping(collections.abc.Mapping):
    """An immutable mapping whose constructor does not take a dict."""

    def __init__(self, a, b):
        self._data = {"a": a, "b": b}

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def test_mappings_that_cannot_be_rebuilt_fall_back_to_dict():
    assert type(rl.default_collate([NoCopyDict(a=1)])) is dict
    check_collate([NoCopyDict(a=1), NoCopyDict(a=2)], expect=ok)
    check_collate([FrozenMapping(1, 2), FrozenMapping(3, 4)], expect=ok)
    assert type(rl.default_convert(FrozenMapping(1, 2))) is dict
    check_convert(FrozenMapping(np.zeros(1), 2), expect=ok)
    check_convert(NoCopyDict(a=np.zeros(1)), expect=ok)


def test_read_only_mapping_proxy_is_rebuilt_as_its_type():
    proxy = types.MappingProxyType({"a": 1})
    check_collate([proxy, proxy], expect=ok)
    check_convert(proxy, expect=ok)


class Row(collections.abc.Sequence):
    """An immutable sequence whose constructor takes a list."""

    def __init__(self, items):
        self._items = list(items)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)


def test_sequence_types():
    check_collate([UserList([1, 2]), UserList([3, 4])], expect=ok)
    check_collate([deque([1, 2]), deque([3, 4])], expect=ok)
    check_collate([range(3), range(3)], expect=ok)  # range([...]) fails: plain list
    assert type(rl.default_collate([range(2), range(2)])) is list
    assert type(rl.default_collate([Row([1]), Row([2])])) is Row
    check_collate([Row([1, 2]), Row([3, 4])], expect=ok)
    check_convert(range(3), expect=ok)
    check_convert(UserList([np.zeros(1)]), expect=ok)
    check_convert(Row([np.zeros(1)]), expect=ok)
    check_convert(deque([np.zeros(1)]), expect=ok)


class TaggedList(list):
    """A list with extra state that a plain ``TaggedList(values)`` would drop."""

    def __init__(self, *args, tag=None):
        super().__init__(*args)
        self.tag = tag


def test_mutable_sequence_is_copied_with_its_attributes():
    batch = [TaggedList([1, 2], tag="t"), TaggedList([3, 4], tag="u")]
    ours = rl.default_collate(batch)
    check_collate(batch, expect=ok)
    assert type(ours) is TaggedList and ours.tag == "t"
    assert rl.default_convert(TaggedList([np.zeros(1)], tag="v")).tag == "v"
    check_convert(TaggedList([np.zeros(1)], tag="v"), expect=ok)


def test_mutable_sequence_is_copied_not_mutated():
    batch = [[1, 2], [3, 4]]
    snapshot = copy.deepcopy(batch)
    out = rl.default_collate(batch)
    assert batch == snapshot and out is not batch[0]
    data = [np.zeros(1)]
    converted = rl.default_convert(data)
    assert type(data[0]) is np.ndarray and type(converted[0]) is torch.Tensor


def test_batch_given_as_tuple_or_other_sequence():
    check_collate(((1, 2), (3, 4)), expect=ok)
    check_collate((torch.zeros(2), torch.ones(2)), expect=ok)
    check_collate(Row([[1, 2], [3, 4]]), expect=ok)


def test_default_convert_leaves_non_numpy_untouched():
    for data in [1, 2.0, "s", b"b", None, torch.zeros(2)]:
        assert rl.default_convert(data) is data
        check_convert(data, expect=ok)


# ---------------------------------------------------------------------------------------------
# the function map and `collate`


def test_default_map_has_torchs_keys_in_torchs_order():
    assert list(rl.default_collate_fn_map) == list(torch_collate.default_collate_fn_map)
    assert rl._DEFAULT_MAP_SNAPSHOT == rl.default_collate_fn_map
    assert rl._DEFAULT_MAP_SNAPSHOT is not rl.default_collate_fn_map
    for key, fn in rl.default_collate_fn_map.items():
        assert fn.__module__ == "rloader._collate", key


def test_collate_without_a_map_only_walks_containers():
    assert_same_outcome(rl.collate, torch_collate.collate, [1, 2], expect=TypeError)
    assert_same_outcome(rl.collate, torch_collate.collate, [[1, 2], [3, 4]], expect=TypeError)
    assert_same_outcome(rl.collate, torch_collate.collate, [{"a": (1,)}], expect=TypeError)


def test_custom_map_exact_type_wins_then_isinstance_in_order():
    calls = []

    def tag(name):
        def fn(batch, *, collate_fn_map):
            calls.append((name, collate_fn_map is custom))
            return name

        return fn

    custom = {int: tag("int"), bool: tag("bool"), object: tag("object")}
    for batch in ([True], [1], ["s"], [{"k": 1}], [[False, 1]]):
        calls.clear()
        ours = rl.collate(batch, collate_fn_map=custom)
        ours_calls = list(calls)
        calls.clear()
        theirs = torch_collate.collate(batch, collate_fn_map=custom)
        assert ours == theirs and ours_calls == calls
    assert rl.collate([True], collate_fn_map=custom) == "bool"
    assert rl.collate([{"k": 1}], collate_fn_map={int: tag("int")}) == {"k": "int"}


def test_tuple_keys_in_a_custom_map():
    custom = {(str, bytes): lambda batch, *, collate_fn_map: len(batch)}
    assert rl.collate([b"x", b"y"], collate_fn_map=custom) == 2
    assert_same_outcome(
        rl.collate, torch_collate.collate, [[b"x"], [b"y"]], collate_fn_map=custom, expect=ok
    )


def test_registering_a_handler_changes_default_collate(monkeypatch):
    class Custom:
        pass

    monkeypatch.setitem(
        rl.default_collate_fn_map, Custom, lambda batch, *, collate_fn_map: "custom"
    )
    assert rl.default_collate([Custom()]) == "custom"
    assert rl.default_collate([{"a": Custom()}]) == {"a": "custom"}
    assert rl._DEFAULT_MAP_SNAPSHOT != rl.default_collate_fn_map
    with pytest.raises(TypeError):
        tud.default_collate([Custom()])


def test_replacing_the_tensor_handler_reaches_numpy_arrays(monkeypatch):
    # numpy arrays are turned into tensors and collated again through the same map
    monkeypatch.setitem(
        rl.default_collate_fn_map, torch.Tensor, lambda batch, *, collate_fn_map: "tensors"
    )
    assert rl.default_collate([np.zeros(2), np.zeros(2)]) == "tensors"


@pytest.mark.parametrize(
    "name, batch",
    [
        ("collate_tensor_fn", [torch.zeros(2), torch.ones(2)]),
        ("collate_numpy_array_fn", [np.zeros(2), np.ones(2)]),
        ("collate_numpy_scalar_fn", [np.float32(1), np.float32(2)]),
        ("collate_float_fn", [1, 2.5]),
        ("collate_int_fn", [1, 2.5]),
        ("collate_str_fn", ["a", 1]),
    ],
)
def test_per_type_functions_called_directly(name, batch):
    assert_same_outcome(
        getattr(rl, name),
        getattr(torch_collate, name),
        batch,
        collate_fn_map=torch_collate.default_collate_fn_map,
        expect=ok,
    )


def test_numpy_array_fn_without_a_map_stops_at_the_tensor():
    assert_same_outcome(
        rl.collate_numpy_array_fn,
        torch_collate.collate_numpy_array_fn,
        [np.zeros(2)],
        expect=TypeError,
    )


def test_empty_batch_raises_index_error_like_torch():
    check_collate([], expect=IndexError)
