"""Samplers: torch.utils.data's documented samplers, with their index orders made in Rust.

Each rloader sampler is a subclass of torch's sampler of the same name, keeps the same
constructor arguments and attributes, and validates them the same way. Its order comes from
``rloader-core`` through ``_index_stream()``; ``__iter__`` hands the same stream to Python.
A subclass that overrides ``__iter__`` is honoured everywhere: rloader only reads
``_index_stream()`` directly when ``__iter__`` is rloader's own (see :func:`native_stream`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Optional, TypeVar, Union

import torch
import torch.utils.data as tud

from . import _rloader, _twin
from ._seed import draw_seed

__all__ = [
    "BatchSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]

_T_co = TypeVar("_T_co", covariant=True)


class Sampler(tud.Sampler[_T_co], metaclass=_twin.TorchTwin):
    """Base class for samplers: subclasses provide ``__iter__`` and, optionally, ``__len__``."""


def _chunks(stream: _rloader.IndexChunks) -> Iterator[int]:
    # chain hands out the ints of each Rust-made list at C speed.
    return itertools.chain.from_iterable(stream)


class SequentialSampler(Sampler[int], tud.SequentialSampler):
    """Yields ``0, 1, ..., len(data_source) - 1``, as torch's.

    Args:
        data_source: anything with ``__len__`` (read at each pass).
    """

    data_source: Sized

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)

    def _index_stream(self) -> _rloader.IndexChunks:
        return _rloader.sequential(len(self.data_source))


class RandomSampler(Sampler[int], tud.RandomSampler):
    """Yields a random permutation of the indices, or ``num_samples`` draws with replacement.

    Args:
        data_source: anything with ``__len__``; indices run over ``range(len(data_source))``.
        replacement: draw with replacement (independent uniform draws).
        num_samples: how many indices a pass yields (default ``len(data_source)``); without
            replacement, a count above the length takes several permutations back to back.
        generator: where each pass's seed comes from (torch's global RNG when ``None``).

    Differs from torch: the order is rloader's own (xoshiro256++ from one 64-bit draw of
    ``generator`` per pass, Fisher-Yates permutations), with the same distribution; the
    generator advances exactly as torch's sampler advances it.
    """

    data_source: Sized
    replacement: bool

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={self.replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, "
                f"but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self) -> Iterator[int]:
        return _chunks(self._index_stream())

    def __len__(self) -> int:
        return self.num_samples

    def _index_stream(self) -> _rloader.IndexChunks:
        def start() -> _rloader.IndexChunks:
            n = len(self.data_source)
            seed = draw_seed(self.generator)
            if n == 0:  # num_samples > 0 was checked: torch's own errors for nothing to draw from
                if self.replacement:
                    raise RuntimeError(
                        "random_ expects 'from' to be less than 'to', but got from=0 >= to=0"
                    )
                raise ZeroDivisionError("integer division or modulo by zero")
            return _rloader.random_indices(n, self.num_samples, self.replacement, seed)

        return _rloader.IndexChunks.lazy(start)


def _plain_indices(indices: Sequence) -> Optional[list]:
    """``indices`` as a list when every element is a built-in int in ``[0, 2**64)``, else None
    (also when ``indices`` cannot be indexed, as torch indexes it: a set fails there as in torch)."""
    if not hasattr(type(indices), "__getitem__"):
        return None
    as_list = list(indices)
    if all(type(i) is int and 0 <= i < 1 << 64 for i in as_list):
        return as_list
    return None


class SubsetRandomSampler(Sampler[int], tud.SubsetRandomSampler):
    """Yields the given indices in a random order (a new order every pass).

    Args:
        indices: the sequence of indices to permute; its elements are yielded as they are.
        generator: where each pass's seed comes from (torch's global RNG when ``None``).

    Differs from torch: the order is rloader's own (see ``RandomSampler``).
    """

    indices: Sequence[int]

    def __init__(self, indices: Sequence[int], generator: Optional[torch.Generator] = None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        plain = _plain_indices(self.indices)
        if plain is not None:
            return _chunks(self._index_stream(plain))
        return self._iter_any()

    def _iter_any(self) -> Iterator:
        # Indices that are not plain ints (tensor elements, numpy ints, ...) are yielded as
        # they are, in the order of the same permutation the Rust stream would use.
        order = _rloader.permutation(len(self.indices), draw_seed(self.generator))
        for i in order:
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)

    def _index_stream(self, plain: Optional[list] = None) -> _rloader.IndexChunks:
        """The Rust stream over ``plain`` (the indices, already checked to be plain ints)."""
        if plain is None:
            plain = _plain_indices(self.indices)
            if plain is None:
                raise TypeError("SubsetRandomSampler's Rust stream needs non-negative int indices")

        def start() -> _rloader.IndexChunks:
            return _rloader.subset_indices(plain, draw_seed(self.generator))

        return _rloader.IndexChunks.lazy(start)


class WeightedRandomSampler(Sampler[int], tud.WeightedRandomSampler):
    """Yields ``num_samples`` indices drawn with probabilities proportional to ``weights``.

    Args:
        weights: a 1-d sequence of non-negative weights, not all zero (kept as a float64
            tensor in ``self.weights``).
        num_samples: how many indices a pass yields.
        replacement: draw with replacement; without, an index is drawn at most once and
            ``num_samples`` may not exceed the number of non-zero weights.
        generator: where each pass's seed comes from (torch's global RNG when ``None``).

    Differs from torch: the order is rloader's own, with the same distribution: with
    replacement each draw is O(1) (Vose's alias method); without, the order is that of
    successive weighted draws (exponential keys). torch's limit of 2^24 categories does not
    apply. Invalid weights raise torch's exception, in the installed torch's words.
    """

    weights: torch.Tensor
    num_samples: int
    replacement: bool

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        weights_tensor = torch.as_tensor(weights, dtype=torch.double)
        if len(weights_tensor.shape) != 1:
            raise ValueError(
                "weights should be a 1d sequence but given "
                f"weights have shape {tuple(weights_tensor.shape)}"
            )
        self.weights = weights_tensor
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        return _chunks(self._index_stream())

    def __len__(self) -> int:
        return self.num_samples

    def _index_stream(self) -> _rloader.IndexChunks:
        def start() -> _rloader.IndexChunks:
            weights = self.weights
            if not isinstance(weights, torch.Tensor) or weights.numel() == 0:
                _raise_torchs_error(weights, self.num_samples, self.replacement)
            array = weights.detach().to("cpu", torch.double).contiguous().numpy()
            seed = draw_seed(self.generator)
            try:
                return _rloader.weighted_indices(array, self.num_samples, self.replacement, seed)
            except RuntimeError:
                _raise_torchs_error(weights, self.num_samples, self.replacement)
                raise

        return _rloader.IndexChunks.lazy(start)


def _raise_torchs_error(weights: object, num_samples: int, replacement: bool) -> None:
    """Raises what ``torch.multinomial`` raises for these arguments, if it raises.

    Invalid weights get the error torch's sampler gives, word for word in the user's torch
    (whose texts change between versions); rloader's own validation decides only *whether*
    it is an error. torch's limit of 2^24 categories is not one of rloader's, so that error is
    not taken from it. The draw uses a generator of its own: the user's RNG is untouched.
    """
    try:
        torch.multinomial(weights, num_samples, replacement, generator=torch.Generator())  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError) as exc:
        if "categories cannot exceed" not in str(exc):
            raise exc.with_traceback(None) from None


class BatchSampler(Sampler[list[int]], tud.BatchSampler):
    """Groups the indices of ``sampler`` (any iterable) into lists of ``batch_size``.

    Args:
        sampler: any iterable of indices (a sampler, a list, a range).
        batch_size: indices per list, a positive int.
        drop_last: drop the last list when it is shorter than ``batch_size``.

    Over an rloader sampler (or torch's ``BatchSampler`` made by the DataLoader over one) the
    batches are cut in Rust, without a Python object per index until the list is made.
    """

    def __init__(
        self,
        sampler: Union[Sampler[int], Iterable[int]],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        stream = native_stream(self.sampler)
        if stream is not None:
            return _rloader.BatchStream.from_indices(stream, self.batch_size, self.drop_last)
        return _rloader.BatchStream.from_iterable(self.sampler, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size  # type: ignore[arg-type]


def iter_keys(index_sampler: object) -> Iterator:
    """``iter(index_sampler)`` for a DataLoader's sampler or batch sampler, with torch's own
    ``BatchSampler`` cut in Rust as rloader's is.

    The DataLoader makes torch's ``BatchSampler`` itself, not rloader's: frameworks that rebuild
    loaders (Lightning) take any other type for a user's custom batch sampler. Only that exact
    type is read here; its subclasses may change ``__iter__``, so they are iterated as they are.
    """
    if type(index_sampler) is tud.BatchSampler:
        return BatchSampler.__iter__(index_sampler)  # type: ignore[arg-type]
    return iter(index_sampler)  # type: ignore[call-overload]


class _InfiniteConstantSampler(Sampler[None]):
    """The sampler an IterableDataset's loader holds: ``None`` forever (keys are unused)."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


def native_stream(sampler: object) -> Optional[_rloader.IndexChunks]:
    """The Rust stream behind ``sampler`` when iterating it would give exactly that stream.

    True for rloader's samplers unless a subclass overrides ``__iter__``, and for a
    SubsetRandomSampler only when its indices are plain non-negative ints.
    """
    iter_fn = getattr(type(sampler), "__iter__", None)
    if iter_fn not in _NATIVE_ITERS:
        return None
    if isinstance(sampler, SubsetRandomSampler):
        plain = _plain_indices(sampler.indices)
        return None if plain is None else sampler._index_stream(plain)
    return sampler._index_stream()  # type: ignore[attr-defined]


def _register_native(*classes: type) -> None:
    _NATIVE_ITERS.update(cls.__iter__ for cls in classes)


_NATIVE_ITERS: set = set()
_register_native(SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
_twin.pair(
    (Sampler, tud.Sampler),
    (SequentialSampler, tud.SequentialSampler),
    (RandomSampler, tud.RandomSampler),
    (SubsetRandomSampler, tud.SubsetRandomSampler),
    (WeightedRandomSampler, tud.WeightedRandomSampler),
    (BatchSampler, tud.BatchSampler),
)
