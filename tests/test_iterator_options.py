"""The option objects the iterators are built with (`_rloader.HandOutOptions` for PoolIter and
ThreadIter, `_rloader.BatchOptions` for LoaderIter and ThreadPool) take keyword arguments
only, and a misspelled or missing one is a TypeError where it is built: nothing is silently
ignored or left at a default the caller did not choose. The iterators take the option objects
themselves, not a dict of options."""

from __future__ import annotations

import pytest
import torch.utils.data as tud

from rloader import _rloader

pytestmark = pytest.mark.timeout(60)


def hand_out_args():
    return dict(in_order=True, timeout=0.0, persistent=False, length_of=[0, 1])


def batch_args():
    return dict(
        auto_collation=True,
        batch_size=None,
        drop_last=False,
        collate_fn=tud.default_collate,
        collate_plan=None,
        pin=None,
    )


OPTIONS = [
    pytest.param(_rloader.HandOutOptions, hand_out_args, id="HandOutOptions"),
    pytest.param(_rloader.BatchOptions, batch_args, id="BatchOptions"),
]


@pytest.mark.parametrize("cls, args", OPTIONS)
def test_an_option_object_is_built_from_its_keywords(cls, args):
    assert isinstance(cls(**args()), cls)


@pytest.mark.parametrize("cls, args", OPTIONS)
def test_a_misspelled_option_is_a_type_error(cls, args):
    for name in args():
        kwargs = args()
        kwargs[name + "s"] = kwargs.pop(name)
        with pytest.raises(TypeError, match=name + "s"):
            cls(**kwargs)


@pytest.mark.parametrize("cls, args", OPTIONS)
def test_a_missing_option_is_a_type_error(cls, args):
    for name in args():
        kwargs = args()
        del kwargs[name]
        with pytest.raises(TypeError, match=name):
            cls(**kwargs)


@pytest.mark.parametrize("cls, args", OPTIONS)
def test_options_are_keyword_only(cls, args):
    with pytest.raises(TypeError):
        cls(*args().values())


def test_a_dict_of_options_is_a_type_error():
    loader_args = dict(dataset=[0, 1], keys=None, length_of=[0, 1], reported_len=None)
    # (the argument's name, or on older Pythons only its type: "BatchOptions")
    with pytest.raises(TypeError, match="(?i)batch"):
        _rloader.LoaderIter(**loader_args, batch=batch_args())
    built = _rloader.LoaderIter(**loader_args, batch=_rloader.BatchOptions(**batch_args()))
    assert len(built) == 2
    with pytest.raises(TypeError, match="(?i)batch"):
        _rloader.ThreadPool(workers=[object()], iterable=False, batch=batch_args())
