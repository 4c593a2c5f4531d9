"""Where torch versions differ, rloader does what the user's torch does.

rloader is tested against the oldest and the newest torch that ``pyproject.toml`` claims
(``make test-oldest``, ``make test``). Each difference found between them is decided here
once, at import, by asking the installed torch (or, where asking costs too much, its version).
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch
import torch.utils.data as tud
from torch.torch_version import TorchVersion

TORCH = TorchVersion(torch.__version__)

# torch 2.10 gave its DataLoader's and DistributedSampler's assertions their texts
# ("prefetch_factor must be greater than 0 ...", "Number of indices (19) does not match ...");
# before, they were bare ``assert`` statements: an AssertionError with no message.
ASSERTIONS_HAVE_TEXT = TORCH >= "2.10"


def assertion(text: str) -> AssertionError:
    """The AssertionError torch raises where its assertion has ``text`` (or none, before 2.10)."""
    return AssertionError(text) if ASSERTIONS_HAVE_TEXT else AssertionError()


def _subset_requires_getitems() -> bool:
    """Whether torch refuses a Subset subclass that overrides ``__getitem__`` alone (2.11+)."""

    class Probe(tud.Subset):
        def __getitem__(self, idx):  # pragma: no cover - never called
            return idx

    try:
        Probe([], [])
    except NotImplementedError:
        return True
    return False


SUBSET_REQUIRES_GETITEMS = _subset_requires_getitems()


@functools.lru_cache(maxsize=None)
def worker_pickle_warning() -> Optional[str]:
    """The UserWarning torch gives when a worker process's arguments do not pickle (under
    spawn or forkserver, Python 3.14's default), read from the installed torch's source, which
    newer versions have and older ones lack: None where it gives none. Asked on that error's
    path only."""
    import ast
    import inspect

    from torch.utils.data import dataloader

    try:
        tree = ast.parse(inspect.getsource(dataloader._MultiProcessingDataLoaderIter))
    except (OSError, TypeError, SyntaxError, AttributeError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "warn"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("Got pickle error")
        ):
            return node.args[0].value
    return None


@functools.lru_cache(maxsize=None)
def pin_memory_warnings(pin_memory_device: str) -> tuple:
    """``(category, text)`` of each warning torch's DataLoader gives in ``iter()`` for
    ``pin_memory=True`` with this ``pin_memory_device`` on this machine (their texts and
    conditions changed from 2.6 to 2.10). Asked of torch once per device string, with a
    generator of its own so that no RNG moves."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iter(
            tud.DataLoader(
                [0],
                pin_memory=True,
                pin_memory_device=pin_memory_device,
                generator=torch.Generator(),
            )
        )
    return tuple((w.category, str(w.message)) for w in caught)
