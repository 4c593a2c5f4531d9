"""DataLoader against torch.utils.data.DataLoader as the oracle."""

from __future__ import annotations

import collections
import inspect
import pickle
import re
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _datasets import (
    GetItems,
    Ints,
    IntTensors,
    MadeSamples,
    SizedStream,
    Stream,
    StridedLayouts,
    ViewsOfLarge,
)

import rloader
from rloader import DataLoader, _compat

from _compare import both, same

Point = collections.namedtuple("Point", "x y")


SAMPLES = {
    "int": lambda i: i,
    "float": lambda i: i / 3,
    "bool": lambda i: i % 2 == 0,
    "tensor": lambda i: torch.full((2, 3), float(i)),
    "numpy": lambda i: np.full((3,), i, dtype=np.int16),
    "numpy_f32": lambda i: np.arange(4, dtype=np.float32) * i,
    "tuple": lambda i: (torch.tensor([i, i]), i, f"s{i}"),
    "list": lambda i: [i, float(i)],
    "dict": lambda i: {"x": torch.tensor(i), "y": [i, i + 1], "name": str(i)},
    "namedtuple": lambda i: Point(i, torch.tensor(float(i))),
    "np_scalar": lambda i: np.float32(i),
    "mixed_int_float": lambda i: i if i % 2 else float(i),
    "str": lambda i: "abc"[i % 3],
    "bytes": lambda i: b"xy",
    "big_int": lambda i: 2**62 + i,
}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
        dict(batch_size=4, drop_last=True),
        dict(batch_size=1),
        dict(batch_size=None),
        dict(batch_size=32),
    ],
    ids=["b4", "b4-drop", "b1", "none", "b32"],
)
def test_same_batches_as_torch_for_each_sample_kind(kind, kwargs):
    ds = MadeSamples(SAMPLES[kind], 10)
    theirs, ours = both(ds, **kwargs)
    assert same(ours, theirs)


def tensor_traits(batch):
    """What a user can see of each tensor in a batch besides its values: its strides, whether
    it is a view (`_base`), its version counter, where its storage starts."""
    if isinstance(batch, torch.Tensor):
        return (batch.stride(), batch._base is None, batch._is_view(), batch._version,
                batch.storage_offset(), batch.untyped_storage().nbytes())  # fmt: skip
    return [tensor_traits(x) for x in batch]


@pytest.mark.parametrize(
    "make",
    [
        lambda i: (np.full((3, 100, 100), i, np.float32), i),  # 1.2 MB batches: batch memory
        lambda i: (torch.full((3, 100, 100), float(i)), float(i)),
        lambda i: np.full(3, i, np.int16),
    ],
    ids=["arrays", "tensors", "small-arrays"],
)
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(num_workers=2), dict(num_workers=2, persistent_workers=True)],
    ids=["single-process", "workers", "persistent"],
)
def test_batch_tensors_are_made_like_torchs(make, kwargs):
    # Batches in recycled memory or in a worker's slot are no views, and their version counter
    # is torch's (0 when collated in this process, 1 when rebuilt from a worker's).
    theirs, ours = both(MadeSamples(make, 40), batch_size=10, **kwargs)
    assert [tensor_traits(b) for b in ours] == [tensor_traits(b) for b in theirs]
    assert same(ours, theirs)


@pytest.mark.parametrize(
    "make",
    [
        lambda i: np.full((3, 100, 100), i, np.float32),
        lambda i: torch.full((3, 100, 100), float(i)),
    ],
    ids=["arrays", "tensors"],
)
@pytest.mark.parametrize("kwargs", [dict(), dict(num_workers=2)], ids=["single-process", "workers"])
def test_batches_take_in_place_shape_changes_like_torchs(make, kwargs):
    # A batch in recycled memory or a worker's slot is a tensor of its own, not a detached
    # alias, which would refuse these.
    for lib in (tud, rloader):
        batch = next(iter(lib.DataLoader(MadeSamples(make, 20), batch_size=10, **kwargs)))
        batch.unsqueeze_(1).squeeze_(1).transpose_(0, 1)
        batch.resize_(5, 3, 100, 100)
        assert batch.shape == (5, 3, 100, 100)


def test_non_writable_numpy_warns_like_torch():
    # torch warns once per process, so each library gets a fresh interpreter.
    import subprocess
    import sys

    script = """
import warnings, numpy as np, torch, torch.utils.data as tud, rloader
arrays = []
for i in range(4):
    a = np.arange(3) + i
    a.flags.writeable = False
    arrays.append(a)
loader_cls = {cls}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    out = list(loader_cls(arrays, batch_size=2))
print([b.tolist() for b in out])
print([str(x.message)[:60] for x in w])
"""

    def run(cls):
        done = subprocess.run(
            [sys.executable, "-c", script.format(cls=cls)],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    ours, theirs = run("rloader.DataLoader"), run("tud.DataLoader")
    assert ours == theirs
    assert "not writable" in ours


@pytest.mark.parametrize(
    "bad",
    [
        [1, [2]],
        [(1, 2), (1,)],
        [np.array(["a"]), np.array(["b"])],
        [object(), object()],
        [torch.ones(2), torch.ones(3)],
    ],
)
def test_collate_errors_match_torch(bad):
    with pytest.raises(Exception) as theirs:
        list(tud.DataLoader(bad, batch_size=2))
    with pytest.raises(type(theirs.value)) as ours:
        list(DataLoader(bad, batch_size=2))
    assert str(ours.value) == str(theirs.value)


def test_custom_collate_fn_and_sampler_and_batch_sampler():
    data = list(range(20))
    collate_fn = lambda b: sum(b)  # noqa: E731
    sampler = [3, 1, 4, 1, 5, 9, 2, 6]
    theirs, ours = both(data, batch_size=3, sampler=sampler, collate_fn=collate_fn)
    assert ours == theirs
    batches = [[0, 1], [5], [19, 18, 17]]
    theirs, ours = both(data, batch_sampler=batches)
    assert same(ours, theirs)
    theirs, ours = both(data, batch_sampler=tud.BatchSampler(tud.SequentialSampler(data), 7, True))
    assert same(ours, theirs)


def test_non_integral_keys_through_a_custom_sampler():
    ds = {"a": 1, "b": 2, "c": 3}
    theirs, ours = both(ds, sampler=["c", "a", "b"], batch_size=2)
    assert same(ours, theirs)
    theirs, ours = both(ds, sampler=["c", "a"], batch_size=None)
    assert same(ours, theirs)


def test_getitems_is_used_like_torch():
    ds_t, ds_r = GetItems(), GetItems()
    theirs = list(tud.DataLoader(ds_t, batch_size=4))
    ours = list(DataLoader(ds_r, batch_size=4))
    assert same(ours, theirs)
    assert ds_r.calls == ds_t.calls
    ds_r.calls.clear()
    list(DataLoader(ds_r, batch_sampler=[(1, 2), [3]]))
    assert ds_r.calls == [[1, 2], [3]]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=3),
        dict(batch_size=3, drop_last=True),
        dict(batch_size=None),
        dict(batch_size=20),
    ],
)
def test_iterable_dataset_like_torch(kwargs):
    theirs, ours = both(Stream(10), **kwargs)
    assert same(ours, theirs)


def test_iterable_dataset_len_and_warning_like_torch():
    dataset = SizedStream(10)  # the warning names it

    def run(loader_cls):
        loader = loader_cls(dataset, batch_size=None)
        assert len(loader) == 3
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = list(loader)
        return out, [str(x.message) for x in w]

    assert run(DataLoader) == run(tud.DataLoader)


def test_lengths_match_torch():
    data = list(range(10))
    for kwargs in [
        dict(),
        dict(batch_size=3),
        dict(batch_size=3, drop_last=True),
        dict(batch_size=None),
        dict(batch_sampler=[[1], [2, 3]]),
    ]:
        assert len(DataLoader(data, **kwargs)) == len(tud.DataLoader(data, **kwargs))
        assert len(iter(DataLoader(data, **kwargs))) == len(iter(tud.DataLoader(data, **kwargs)))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(prefetch_factor=2),
        dict(num_workers=1, prefetch_factor=-1),
        dict(persistent_workers=True),
        dict(sampler=[0], shuffle=True),
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_sampler=[[0]], shuffle=True),
        dict(batch_sampler=[[0]], sampler=[0]),
        dict(batch_sampler=[[0]], drop_last=True),
        dict(batch_size=None, drop_last=True),
        dict(multiprocessing_context="spawn"),
        dict(num_workers=1, multiprocessing_context="nope"),
        dict(num_workers=1, multiprocessing_context=3),
    ],
)
def test_argument_errors_match_torch(kwargs):
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(list(range(4)), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(list(range(4)), **kwargs)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("value", ["Auto", "bogus", "2"])
def test_a_count_given_as_another_str_than_auto_says_auto_is_taken(value):
    # torch compares the str with 0 (TypeError); rloader, which takes "auto", raises the same
    # type saying so, in __init__ and at iter() when set afterwards.
    said = rf"must be an int or 'auto' .*but got {{}}={re.escape(repr(value))}$"
    with pytest.raises(TypeError):
        tud.DataLoader(list(range(4)), num_workers=value)
    with pytest.raises(TypeError, match=said.format("num_workers")):
        DataLoader(list(range(4)), num_workers=value)
    with pytest.raises(TypeError):
        tud.DataLoader(list(range(4)), num_workers=1, prefetch_factor=value)
    with pytest.raises(TypeError, match=said.format("prefetch_factor")):
        DataLoader(list(range(4)), num_workers=1, prefetch_factor=value)
    loader = DataLoader(list(range(4)))
    loader.num_workers = value
    with pytest.raises(TypeError, match=said.format("num_workers")):
        iter(loader)


@pytest.mark.parametrize(
    "kwargs", [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])]
)
def test_iterable_dataset_rejects_sampler_options_like_torch(kwargs):
    with pytest.raises(ValueError) as theirs:
        tud.DataLoader(Stream(3), **kwargs)
    with pytest.raises(ValueError) as ours:
        DataLoader(Stream(3), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_attributes_cannot_be_reassigned_like_torch():
    loader = DataLoader(list(range(4)))
    for attr in [
        "batch_size",
        "batch_sampler",
        "sampler",
        "drop_last",
        "dataset",
        "persistent_workers",
    ]:
        with pytest.raises(
            ValueError, match=f"{attr} attribute should not be set after DataLoader is initialized"
        ):
            setattr(loader, attr, None)
    loader.num_workers = 0  # others stay assignable


def test_signature_and_attributes_match_torch():
    # torch's, plus rloader's one keyword of its own (last, with torch's behaviour as default).
    ours = inspect.signature(DataLoader.__init__)
    theirs = inspect.signature(tud.DataLoader.__init__)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()
    ] + [("worker_type", inspect.Parameter.KEYWORD_ONLY, "process")]
    data = list(range(10))
    kw = dict(batch_size=3, shuffle=True, drop_last=True, generator=torch.Generator())
    assert set(vars(DataLoader(data, **kw))) == set(vars(tud.DataLoader(data, **kw))) | {
        "worker_type"
    }


def test_is_a_torch_dataloader_and_rebuilds_from_its_attributes():
    # What PyTorch Lightning does to shard a loader: rebuild type(loader)(**attributes).
    loader = DataLoader(list(range(10)), batch_size=3, shuffle=False, num_workers=0)
    assert isinstance(loader, tud.DataLoader)
    params = inspect.signature(type(loader).__init__).parameters
    attrs = {
        k: v
        for k, v in vars(loader).items()
        if k in params and k not in ("sampler", "batch_sampler")
    }
    attrs["sampler"] = tud.distributed.DistributedSampler(
        loader.dataset, num_replicas=2, rank=1, shuffle=False
    )
    attrs["shuffle"] = False
    rebuilt = type(loader)(**attrs)
    assert [b.tolist() for b in rebuilt] == [[1, 3, 5], [7, 9]]


def test_loader_pickles_before_iteration():
    loader = DataLoader(
        list(range(10)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    clone = pickle.loads(pickle.dumps(loader))
    assert same(list(clone), list(pickle.loads(pickle.dumps(loader))))


def test_typing_generics():
    assert DataLoader[int] is not None
    assert rloader.Dataset[int] is not None


def test_shuffle_is_a_permutation_and_reproducible():
    data = list(range(100))

    def epoch(seed):
        return [
            x
            for b in DataLoader(
                data, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(seed)
            )
            for x in b.tolist()
        ]

    assert sorted(epoch(0)) == data
    assert epoch(0) == epoch(0)
    assert epoch(0) != epoch(1)
    loader = DataLoader(data, batch_size=7, shuffle=True)
    torch.manual_seed(3)
    a = [b.tolist() for b in loader]
    torch.manual_seed(3)
    assert [b.tolist() for b in loader] == a


def test_global_rng_advances_exactly_as_with_torch():
    data = list(range(50))
    for kwargs in [dict(shuffle=True, batch_size=4), dict(shuffle=False), dict(batch_size=None)]:
        torch.manual_seed(0)
        list(tud.DataLoader(data, **kwargs))
        expected = torch.rand(2)
        torch.manual_seed(0)
        list(DataLoader(data, **kwargs))
        assert torch.equal(torch.rand(2), expected), kwargs


def test_pin_memory_without_accelerator_warns_like_torch():
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: pinning is tested by test_pin_memory_pins")

    def run(cls):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = list(cls(list(range(4)), batch_size=2, pin_memory=True))
        return out, [(x.category, str(x.message)) for x in w]

    ours, theirs = run(DataLoader), run(tud.DataLoader)
    assert same(ours[0], theirs[0])
    assert ours[1] == theirs[1]
    assert ours[1] or _compat.TORCH < "2.7"  # torch warns from 2.7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_pins():
    batch = next(
        iter(
            DataLoader([(torch.ones(2), {"a": torch.zeros(1)})] * 4, batch_size=2, pin_memory=True)
        )
    )
    assert batch[0].is_pinned() and batch[1]["a"].is_pinned()


def test_dataset_errors_propagate_unchanged():
    with pytest.raises(KeyError, match="sample 2 is missing"):
        list(DataLoader(IntTensors(4, bad=2), batch_size=1))


def test_timeout_without_workers_is_rejected_like_torch():
    with pytest.raises(AssertionError):
        iter(tud.DataLoader([1], timeout=1))
    with pytest.raises(AssertionError, match="timeout"):
        iter(DataLoader([1], timeout=1))


def test_modified_collate_map_is_honoured():
    class Money(float):
        pass

    data = [Money(1.5), Money(2.5)]
    rloader.default_collate_fn_map[Money] = lambda batch, *, collate_fn_map=None: "money!"
    try:
        assert list(DataLoader(data, batch_size=2)) == ["money!"]
    finally:
        del rloader.default_collate_fn_map[Money]
    rloader.default_collate_fn_map[int] = lambda batch, *, collate_fn_map=None: "ints!"
    try:
        assert list(DataLoader([1, 2], batch_size=2)) == ["ints!"]
    finally:
        rloader.default_collate_fn_map[int] = rloader.collate.__globals__["collate_int_fn"]
    assert same(list(DataLoader([1, 2], batch_size=2)), [torch.tensor([1, 2])])


def test_torchs_default_collate_passed_explicitly():
    data = [(i, np.ones(2) * i) for i in range(5)]
    theirs, ours = both(data, batch_size=2, collate_fn=tud.default_collate)
    assert same(ours, theirs)


def test_torch_datasets_and_samplers_in_rloader_loader():
    ds = tud.TensorDataset(torch.arange(10), torch.arange(10) * 2)
    theirs, ours = both(ds, batch_size=4, sampler=tud.SequentialSampler(ds))
    assert same(ours, theirs)


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_workers_give_torchs_batches(context):
    data = [(i, float(i)) for i in range(23)]
    kw = dict(batch_size=4, num_workers=2, multiprocessing_context=context)
    theirs, ours = both(data, **kw)
    assert same(ours, theirs)


class _Sentinel:
    pass


def test_an_iterator_in_a_reference_cycle_is_collected():
    import gc
    import weakref

    dataset = Ints(10)
    dataset.sentinel = _Sentinel()
    alive = weakref.ref(dataset.sentinel)
    it = iter(rloader.DataLoader(dataset, batch_size=2))
    next(it)
    dataset.it = it  # dataset -> iterator -> dataset, through the iterator's Rust side
    del it, dataset
    gc.collect()
    assert alive() is None


def layout(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(),
            t.untyped_storage().nbytes(), t.is_contiguous(), t.tolist())  # fmt: skip


@pytest.mark.parametrize("num_workers", [0, 1])
def test_tensors_from_workers_keep_their_layout_like_torchs(num_workers):
    # Strides, storage offsets and sizes, and storages shared within a batch, as torch's
    # workers send them (they share each tensor's whole storage).
    batches = {}
    for lib in (tud, rloader):
        loader = lib.DataLoader(StridedLayouts(), batch_size=None, num_workers=num_workers)
        batches[lib] = next(iter(loader))
    theirs, ours = batches[tud], batches[rloader]
    for name in theirs:
        assert layout(ours[name]) == layout(theirs[name]), name
    assert ours["channels_last"].is_contiguous(memory_format=torch.channels_last)
    ptr = ours["channels_last"].untyped_storage().data_ptr()
    assert ours["view"].untyped_storage().data_ptr() == ptr  # one storage, as torch's


def test_a_view_of_a_large_tensor_from_a_worker_keeps_its_strides_not_the_whole_storage():
    # torch's worker shares the whole 8 MB storage of the dataset's tensor; rloader sends the
    # bytes the view reaches (a view of a dataset must not send the dataset), strides kept.
    theirs = list(tud.DataLoader(ViewsOfLarge(), batch_size=None, num_workers=1))
    ours = list(rloader.DataLoader(ViewsOfLarge(), batch_size=None, num_workers=1))
    for a, b in zip(ours, theirs):
        assert (a.stride(), a.shape, a.tolist()) == (b.stride(), b.shape, b.tolist())
        assert b.untyped_storage().nbytes() == 8 << 20
        assert a.untyped_storage().nbytes() == (64 + 63) * 8  # from the first element to the last


# (torch's half-made worker iterator complains from its __del__)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(num_workers=2), dict()])
def test_a_generator_that_is_no_generator_raises_torchs_type_error(kwargs):
    # torch's first draw of the epoch (the base seed) refuses it: TypeError, not an
    # AttributeError from saving its state.
    for lib in (tud, rloader):
        with pytest.raises(TypeError, match="generator"):
            list(lib.DataLoader(range(4), generator=3, **kwargs))
