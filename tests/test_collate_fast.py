"""The Rust fast path of default_collate gives exactly the general path's (and torch's) results."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

import rloader
from rloader._rloader import fast_collate

from _compare import same

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.uint16,
]

leaf_kinds = st.sampled_from(["int", "float", "bool", "str", "tensor", "array", "bytes"])


@st.composite
def structure(draw, depth=0):
    """A recipe: a function from sample index to one sample of a fixed shape."""
    if depth < 2 and draw(st.booleans()):
        kind = draw(st.sampled_from(["tuple", "list", "dict"]))
        width = draw(st.integers(1, 3))
        parts = [draw(structure(depth + 1)) for _ in range(width)]
        if kind == "tuple":
            return lambda i: tuple(p(i) for p in parts)
        if kind == "list":
            return lambda i: [p(i) for p in parts]
        keys = draw(
            st.lists(
                st.text("abc", min_size=1, max_size=2), min_size=width, max_size=width, unique=True
            )
        )
        return lambda i: {k: p(i) for k, p in zip(keys, parts)}
    kind = draw(leaf_kinds)
    if kind == "int":
        big = draw(st.booleans())
        return lambda i: i * (2**40 if big else 1) - 3
    if kind == "float":
        return lambda i: i / 7
    if kind == "bool":
        return lambda i: i % 3 == 0
    if kind == "str":
        return lambda i: f"s{i}"
    if kind == "bytes":
        return lambda i: b"b"
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    if kind == "tensor":
        dtype = draw(st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]))
        return lambda i: torch.full(shape, i % 2, dtype=dtype)
    dtype = draw(st.sampled_from(DTYPES))
    return lambda i: np.full(shape, i % 2, dtype=dtype)


@settings(max_examples=300, deadline=None)
@given(structure(), st.integers(1, 6))
def test_fast_path_equals_general_path_and_torch(make, n):
    batch = [make(i) for i in range(n)]
    general = rloader.collate(batch, collate_fn_map=rloader.default_collate_fn_map)
    theirs = tud.default_collate(batch)
    assert same(general, theirs)
    fast = fast_collate(batch)
    if fast is not None:
        assert same(fast, theirs)
    assert same(rloader.default_collate(batch), theirs)


@pytest.mark.parametrize(
    "batch",
    [
        [1, 2, 3],
        [1.5, 2.5],
        [True, False],
        [torch.ones(2), torch.zeros(2)],
        [np.ones(3, np.float32), np.zeros(3, np.float32)],
        [(1, 2.0), (3, 4.0)],
        [{"a": 1}, {"a": 2}],
        [[1, "x"], [2, "y"]],
        ["a", "b"],
    ],
)
def test_common_batches_take_the_fast_path(batch):
    out = fast_collate(batch)
    assert out is not None
    assert same(out, tud.default_collate(batch))


@pytest.mark.parametrize(
    "batch",
    [
        [1, 2.5],
        [2**70, 1],
        [np.float32(1), np.float32(2)],
        [np.ones(2), np.ones(3)],
        [np.ones(2, np.float32), np.ones(2, np.float64)],
        [np.ones((2, 2))[:, 0], np.ones(2)],
        [(1, 2), (1,)],
        [{"a": 1}, {"b": 2}],
        [torch.nn.Parameter(torch.ones(1))] * 2,
        [],
        [np.array(["a"]), np.array(["b"])],
        [np.ones(2, ">f4"), np.ones(2, ">f4")],
    ],
)
def test_unusual_batches_fall_back_to_the_general_path(batch):
    assert fast_collate(batch) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 7, 64])
def test_a_batch_of_arrays_copied_on_one_or_several_threads_is_torchs(threads, rows):
    # From 1 MiB (7 and 64 rows of 147 KiB) copied on torch.get_num_threads() threads (up to
    # 4), in chunks of rows that need not divide evenly; below it (1 and 2 rows) on one.
    rng = np.random.default_rng(rows)
    batch = [rng.integers(0, 255, (3, 224, 224), dtype=np.uint8) for _ in range(rows)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours = fast_collate(batch)
    finally:
        torch.set_num_threads(before)
    assert same(ours, tud.default_collate(batch))


def describe(x):
    """Where collation put a batch: device, dtype and shape of each tensor in it."""
    if isinstance(x, torch.Tensor):
        return (type(x).__name__, x.device.type, x.dtype, tuple(x.shape))
    if isinstance(x, dict):
        return {k: describe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [describe(v) for v in x]
    return x


MODE_BATCHES = [
    [np.ones((3, 100, 100), np.float32) for _ in range(8)],  # large: the recycled-memory copy
    [np.ones(3, np.float32), np.zeros(3, np.float32)],
    [1, 2, 3],
    [1.5, 2.5],
    [True, False],
    [torch.ones(3, 100, 100) for _ in range(8)],
    [(np.ones((300, 300), np.uint8), 3) for _ in range(4)],
    [{"a": 1.0, "b": np.zeros(4)} for _ in range(3)],
]


@pytest.mark.parametrize("batch", MODE_BATCHES)
def test_a_default_device_places_the_batch_as_torchs_collate_does(batch):
    # torch's collate makes numbers and numpy batches with torch.tensor / torch.as_tensor, so
    # under torch.device(...) or torch.set_default_device they land on that device. Writing
    # them through data_ptr() into a CPU-sized buffer crashed the interpreter here before.
    with torch.device("meta"):
        assert fast_collate(batch) is None
        assert describe(rloader.default_collate(batch)) == describe(tud.default_collate(batch))


@pytest.mark.parametrize("batch", MODE_BATCHES)
def test_fake_tensor_mode_gets_torchs_fake_batch(batch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        assert fast_collate(batch) is None
        assert describe(rloader.default_collate(batch)) == describe(tud.default_collate(batch))


def test_a_single_process_loader_under_a_device_context_collates_as_torch():
    dataset = [(np.full((300, 300), i, np.uint8), i) for i in range(32)]
    loaders = [lib.DataLoader(dataset, batch_size=8) for lib in (tud, rloader)]
    iterators = [iter(loader) for loader in loaders]  # the base seed needs a real device
    with torch.device("meta"):
        batches = [[describe(b) for b in it] for it in iterators]
    assert batches[0] == batches[1]
    assert batches[1][0] == [("Tensor", "meta", torch.uint8, (8, 300, 300))] + [
        ("Tensor", "meta", torch.int64, (8,))
    ]
