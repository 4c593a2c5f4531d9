"""Map-style and iterable datasets, and ``random_split``.

Every class here subclasses torch's class of the same name, so ``isinstance`` checks written
against ``torch.utils.data`` keep holding, and torch's datasets can be nested inside ours (and
ours inside torch's). The behaviour (attributes, ``__getitems__``, error types and texts) is
torch's, and so is the split ``random_split`` makes for a given seed: it runs once per job, so
there is no speed to win there, and a fixed seed must give the same train/validation split with
either library.

Each class lists rloader's base first and torch's class second: every method is ours (including
``__add__``, which therefore builds rloader containers); torch's class only lends its identity.
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch.utils.data as _torch_data
from torch import Generator, Tensor, default_generator, randperm

from . import _compat, _twin

__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
    "random_split",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
_TupleSample = tuple[T_co, ...]
_DictSample = dict[str, T_co]
T_stack = TypeVar("T_stack", _TupleSample, _DictSample)

# The checks below use torch's classes, not ours, so that a torch IterableDataset is
# refused by our ConcatDataset exactly as torch refuses ours (ours are subclasses of torch's).
_TorchIterableDataset = _torch_data.IterableDataset


def _has_batched_getitem(dataset: object) -> bool:
    return callable(getattr(dataset, "__getitems__", None))


class Dataset(_torch_data.Dataset[T_co], metaclass=_twin.TorchTwin):
    """A map from keys (usually ``0 .. len-1``) to samples; subclasses define ``__getitem__``.

    There is deliberately no ``__getitems__`` here: the DataLoader's fetcher treats its mere
    presence as "this dataset can fetch a whole batch at once".
    """

    def __getitem__(self, index) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: _torch_data.Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], _torch_data.IterableDataset[T_co]):
    """A stream of samples; subclasses define ``__iter__`` (it stays abstract here)."""

    def __add__(self, other: _torch_data.Dataset[T_co]) -> ChainDataset:
        return ChainDataset([self, other])


class TensorDataset(Dataset[tuple[Tensor, ...]], _torch_data.TensorDataset):
    """Sample ``i`` is ``tuple(t[i] for t in tensors)``, as torch's.

    Args:
        *tensors: tensors of the same size in their first dimension (else ``AssertionError``).
    """

    tensors: tuple[Tensor, ...]

    def __init__(self, *tensors: Tensor) -> None:
        # No tensors at all is accepted (as in torch); len() fails later.
        for tensor in tensors:
            if tensor.size(0) != tensors[0].size(0):
                raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].size(0)


class StackDataset(Dataset[T_stack], _torch_data.StackDataset[T_stack]):
    """Zips equally long datasets: positional ones give tuple samples, keyword ones dicts.

    Args:
        *args: datasets whose samples make up a tuple sample, or
        **kwargs: datasets whose samples make up a dict sample (not both).

    Raises ``ValueError`` when the lengths differ. ``__getitems__`` fetches each part's column
    in one call where the part has ``__getitems__`` itself.
    """

    datasets: tuple | dict

    def __init__(
        self, *args: _torch_data.Dataset[T_co], **kwargs: _torch_data.Dataset[T_co]
    ) -> None:
        if args and kwargs:
            # (torch's message has no space between "or" and "``dict``"; kept as is.)
            raise ValueError(
                "Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) "
                "like input/output, but both types are given."
            )
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        parts = list(args) if args else list(kwargs.values())
        self._length = len(parts[0])
        if any(len(part) != self._length for part in parts):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args if args else kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {key: part[index] for key, part in self.datasets.items()}
        return tuple(part[index] for part in self.datasets)

    def __getitems__(self, indices: list):
        is_dict = isinstance(self.datasets, dict)
        named = self.datasets.items() if is_dict else enumerate(self.datasets)
        # One column per part, each fetched in a single call when the part allows it.
        columns = [(key, self._fetch_column(part, indices)) for key, part in named]
        if is_dict:
            return [{key: column[row] for key, column in columns} for row in range(len(indices))]
        return [tuple(column[row] for _, column in columns) for row in range(len(indices))]

    @staticmethod
    def _fetch_column(part, indices: list) -> list:
        if not _has_batched_getitem(part):
            return [part[index] for index in indices]
        items = part.__getitems__(indices)
        if len(items) != len(indices):
            raise ValueError(
                f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}"
            )
        return list(items)

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset[T_co], _torch_data.ConcatDataset[T_co]):
    """Map-style datasets one after another; index ``i`` is looked up by cumulative length.

    Args:
        datasets: a non-empty iterable of map-style datasets (no ``IterableDataset``).

    ``cumulative_sizes`` holds the running totals; negative indices count from the end.
    """

    datasets: list[_torch_data.Dataset[T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence):
        totals, running = [], 0
        for part in sequence:
            running += len(part)
            totals.append(running)
        return totals

    def __init__(self, datasets: Iterable[_torch_data.Dataset]) -> None:
        # Skip torch's ConcatDataset.__init__ (this one replaces it) but keep the rest of the
        # cooperative chain, exactly where torch's own super().__init__() would continue it.
        super(_torch_data.ConcatDataset, self).__init__()
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        if any(isinstance(part, _TorchIterableDataset) for part in self.datasets):
            raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        part = bisect.bisect_right(self.cumulative_sizes, idx)
        sample_idx = idx if part == 0 else idx - self.cumulative_sizes[part - 1]
        # An index past the end makes `part` == len(datasets): IndexError, as in torch.
        return self.datasets[part][sample_idx]

    @property
    def cummulative_sizes(self):
        warnings.warn(
            "`cummulative_sizes` attribute is renamed to `cumulative_sizes`",
            FutureWarning,
            stacklevel=2,
        )
        return self.cumulative_sizes


class ChainDataset(IterableDataset, _torch_data.ChainDataset):
    """Iterable datasets streamed one after another, as torch's.

    Args:
        datasets: an iterable of ``IterableDataset`` (kept as given; checked as it is read).
    """

    def __init__(self, datasets: Iterable[_torch_data.Dataset]) -> None:
        super(_torch_data.ChainDataset, self).__init__()  # see ConcatDataset.__init__
        self.datasets = datasets

    @staticmethod
    def _check(part) -> None:
        if not isinstance(part, _TorchIterableDataset):
            raise AssertionError("ChainDataset only supports IterableDataset")

    def __iter__(self):
        for part in self.datasets:
            self._check(part)
            yield from part

    def __len__(self) -> int:
        total = 0
        for part in self.datasets:
            self._check(part)
            total += len(part)
        return total


class Subset(Dataset[T_co], _torch_data.Subset[T_co]):
    """The samples of ``dataset`` at ``indices``, in that order.

    Args:
        dataset: the whole dataset.
        indices: the indices of ``dataset`` this subset holds.

    A subclass that overrides ``__getitem__`` must override ``__getitems__`` too (the
    DataLoader calls the latter), so such a subclass is refused at construction, as in torch.
    """

    dataset: _torch_data.Dataset[T_co]
    indices: Sequence[int]

    def __init__(self, dataset: _torch_data.Dataset[T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        cls = type(self)
        if (
            _compat.SUBSET_REQUIRES_GETITEMS
            and cls.__getitem__ is not Subset.__getitem__
            and cls.__getitems__ is Subset.__getitems__
        ):
            raise NotImplementedError(
                f"{cls.__name__} overrides __getitem__ but not __getitems__. "
                "When subclassing Subset and overriding __getitem__, you must also override "
                "__getitems__ to ensure DataLoader works correctly with your custom logic. "
                "A simple implementation:\n\n"
                "def __getitems__(self, indices):\n"
                "    return [self.__getitem__(idx) for idx in indices]"
            )

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> list[T_co]:
        mapped = [self.indices[i] for i in indices]
        if _has_batched_getitem(self.dataset):
            return self.dataset.__getitems__(mapped)
        return [self.dataset[i] for i in mapped]

    def __len__(self) -> int:
        return len(self.indices)


def _lengths_from_fractions(fractions: Sequence[float], total: int) -> list[int]:
    """floor(total * f) each, then the leftover items one by one, round-robin from split 0."""
    lengths = []
    for i, frac in enumerate(fractions):
        if frac < 0 or frac > 1:
            raise ValueError(f"Fraction at index {i} is not between 0 and 1")
        lengths.append(math.floor(total * frac))
    for extra in range(total - sum(lengths)):
        lengths[extra % len(lengths)] += 1
    for i, length in enumerate(lengths):
        if length == 0:
            warnings.warn(
                f"Length of split at index {i} is 0. This might result in an empty dataset.",
                stacklevel=3,
            )
    return lengths


_twin.pair(
    (Dataset, _torch_data.Dataset),
    (IterableDataset, _torch_data.IterableDataset),
    (TensorDataset, _torch_data.TensorDataset),
    (StackDataset, _torch_data.StackDataset),
    (ConcatDataset, _torch_data.ConcatDataset),
    (ChainDataset, _torch_data.ChainDataset),
    (Subset, _torch_data.Subset),
)


def random_split(
    dataset: _torch_data.Dataset[T],
    lengths: Sequence[int | float],
    generator: Generator | None = default_generator,
) -> list[Subset[T]]:
    """Split ``dataset`` into disjoint random ``Subset``s of the given lengths, as torch does.

    ``lengths`` are item counts summing to ``len(dataset)``, or fractions summing to 1 (each
    split gets ``floor(frac * len)``, the remainder is handed out round-robin from split 0,
    and an empty split warns). The order is ``torch.randperm(len(dataset), generator=...)``,
    exactly torch's: the same seed gives the same split with either library, and the
    generator (torch's global RNG when it is the default or None) advances as with torch.
    """
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        lengths = _lengths_from_fractions(lengths, len(dataset))

    total = sum(lengths)
    if total != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")

    order = randperm(total, generator=generator).tolist()
    return [
        Subset(dataset, order[end - length : end])
        for end, length in zip(itertools.accumulate(lengths), lengths)
    ]
