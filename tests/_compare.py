"""Comparing results of torch.utils.data and rloader: equal values (`same`, `assert_same`),
equal batches (`both`), and equal outcomes, stated by the test (`assert_parity`,
`assert_same_outcome`)."""

from __future__ import annotations

import collections.abc
import warnings
from collections import defaultdict

import numpy as np
import torch
import torch.utils.data as tud

import rloader


def same(a, b) -> bool:
    """Equal values and equal types, recursively (tensors and arrays: dtype, shape and values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def assert_same(ours, theirs, path="out"):
    """`same`, stricter and saying where they differ: equal types (and dtypes, layouts, instance
    attributes) at every level; NaN equals NaN."""
    assert type(ours) is type(theirs), f"{path}: {type(ours)} vs {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} vs {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: {ours.shape} vs {theirs.shape}"
        assert ours.layout == theirs.layout, path
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, equal_nan=True, msg=path)
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype, path
        assert ours.shape == theirs.shape, path
        assert np.array_equal(ours, theirs, equal_nan=theirs.dtype.kind in "fc"), path
    elif isinstance(theirs, collections.abc.Mapping):
        assert list(ours.keys()) == list(theirs.keys()), path
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
        if hasattr(theirs, "__dict__"):
            assert_same(vars(ours), vars(theirs), f"{path}.__dict__")
        if isinstance(theirs, defaultdict):
            assert ours.default_factory is theirs.default_factory, path
    elif isinstance(theirs, collections.abc.Sequence) and not isinstance(theirs, (str, bytes)):
        assert len(ours) == len(theirs), path
        if hasattr(theirs, "__dict__") and not _is_namedtuple(theirs):
            assert_same(vars(ours), vars(theirs), f"{path}.__dict__")
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, float) and theirs != theirs:
        assert ours != ours, path
    else:
        assert ours == theirs, f"{path}: {ours!r} vs {theirs!r}"


def both(dataset, engine=None, **kwargs):
    """(list of torch's batches, list of rloader's batches) over `dataset`: for the same
    arguments, or, given an `engine` (tests/conftest.py), for that engine's arguments (torch's
    worker processes standing in for rloader's threads)."""
    if engine is None:
        return list(tud.DataLoader(dataset, **kwargs)), list(rloader.DataLoader(dataset, **kwargs))
    theirs = list(tud.DataLoader(dataset, **engine.torch_kwargs(**kwargs)))
    return theirs, list(rloader.DataLoader(dataset, **engine.kwargs(**kwargs)))


class _Ok:
    def __repr__(self) -> str:
        return "ok"


class _AnyOutcome:
    def __repr__(self) -> str:
        return "ANY_OUTCOME"


ok = _Ok()
"""expect=ok: both calls return, and return equal results."""

ANY_OUTCOME = _AnyOutcome()
"""expect=ANY_OUTCOME: for inputs drawn at random (hypothesis), whose outcome the test cannot
name: both return equal results or both raise the same exception, whichever it is."""

# Raised by a broken test (a typo, a name used before it is bound), never by what a test
# compares: refused whatever the test expects.
_BROKEN_TEST = (NameError, SyntaxError)

INT64_OVERFLOW = (ValueError, RuntimeError)
"""expect=INT64_OVERFLOW: a Python int outside int64 given to torch, whose error for it is a
ValueError in the newest torch and a RuntimeError ('Overflow when unpacking long') in torch 2.6;
a tuple of exception types means any one of them, the same in both libraries."""


def outcome(fn, *args, **kwargs):
    """(("ok", result) or ("err", type, message), [(warning category, message), ...])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
            got = ("err", type(exc), str(exc))
        else:
            got = ("ok", result)
    return got, [(w.category, str(w.message)) for w in caught if not _forked_threads(w)]


def _forked_threads(w) -> bool:
    """Python 3.12+'s DeprecationWarning at each os.fork() of a process with threads (pytest-xdist
    runs some): it says whether workers are forked (torch's processes stand in for rloader's
    threads), not what either library does."""
    return issubclass(
        w.category, DeprecationWarning
    ) and "use of fork() may lead to deadlocks" in str(w.message)


def _check_expected(theirs, expect) -> None:
    if theirs[0] == "err" and issubclass(theirs[1], _BROKEN_TEST):
        raise AssertionError(f"the test itself is broken: torch raised {theirs[1:]}")
    if expect is ANY_OUTCOME:
        return
    if expect is ok:
        assert theirs[0] == "ok", f"expected both to succeed; torch raised {theirs[1:]}"
    else:
        allowed = expect if isinstance(expect, tuple) else (expect,)
        assert all(isinstance(e, type) and issubclass(e, BaseException) for e in allowed), expect
        names = " or ".join(e.__name__ for e in allowed)
        assert theirs[0] == "err", f"expected {names}; torch returned {theirs[1]!r}"
        assert theirs[1] in allowed, f"expected {names}; torch raised {theirs[1:]}"


def assert_same_outcome(ours_fn, torch_fn, *args, expect, **kwargs):
    """`ours_fn(*args, **kwargs)` and `torch_fn(*args, **kwargs)` both give `expect`: `ok`
    and equal results (`assert_same`), or raise exactly the exception type `expect` with the
    same text; and both warn the same. Returns torch's outcome ("ok", result) or ("err", type,
    message)."""
    theirs, their_warnings = outcome(torch_fn, *args, **kwargs)
    _check_expected(theirs, expect)
    ours, ours_warnings = outcome(ours_fn, *args, **kwargs)
    assert ours[0] == theirs[0], f"rloader: {ours}, torch: {theirs}"
    if theirs[0] == "ok":
        assert_same(ours[1], theirs[1])
    else:
        assert ours[1:] == theirs[1:]
    assert ours_warnings == their_warnings
    return theirs


def assert_parity(fn, *, expect, torch_lib=tud, ours_lib=rloader):
    """`fn(torch_lib)` and `fn(ours_lib)` both give `expect` (see `assert_same_outcome`): `fn`
    takes the library (torch.utils.data or rloader) and uses it as a user would."""
    return assert_same_outcome(lambda: fn(ours_lib), lambda: fn(torch_lib), expect=expect)
