"""DistributedSampler: one rank's shard of a dataset, the same partition as torch's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional, TypeVar

import torch
import torch.distributed as dist
import torch.utils.data.distributed as tud_distributed

from . import _compat, _rloader, _twin
from .sampler import Sampler, _register_native

__all__ = ["DistributedSampler"]

_T_co = TypeVar("_T_co", covariant=True)
_MASK64 = (1 << 64) - 1


class DistributedSampler(Sampler[_T_co], tud_distributed.DistributedSampler):
    """Restricts loading to a subset of the dataset, one per process of a distributed job.

    The partition is exactly torch's (``num_samples``, ``total_size``, padding by repeating the
    order's start when ``drop_last=False``, trimming when True, every ``num_replicas``-th index
    from ``rank``). With ``shuffle=True`` the order is a permutation seeded by
    ``seed + epoch``: every rank computes the same one, so shards are disjoint; call
    :meth:`set_epoch` at the start of each epoch to change it.
    """

    def __init__(
        self,
        dataset,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        # torch's arithmetic (the ceiling of a quotient that may be negative), in rloader-core.
        self.num_samples, self.total_size = _rloader.distributed_sizes(
            len(self.dataset), self.num_replicas, bool(self.drop_last)
        )
        self.shuffle = shuffle
        self.seed = seed

    def _args(self) -> tuple:
        """The Rust shard's arguments, after torch's checks of ``total_size`` and ``num_samples``
        (attributes a subclass may change, and that a dataset grown since no longer fits)."""
        n = len(self.dataset)
        if self.shuffle:
            torch.Generator().manual_seed(self.seed + self.epoch)  # torch's error for a bad seed
        total_size, num_samples = self.total_size, self.num_samples
        if self.drop_last:
            length = min(n, total_size)
        else:
            padding = total_size - n
            if padding > n:
                if n == 0:
                    raise ZeroDivisionError("division by zero")  # torch's padding / len(indices)
                length = n + padding
            else:
                length = n + len(range(n)[:padding])
        if length != total_size:
            raise _compat.assertion(
                f"Number of indices ({length}) does not match total_size ({total_size})"
            )
        subsampled = len(range(self.rank, total_size, self.num_replicas))
        if subsampled != num_samples:
            raise _compat.assertion(
                f"Number of subsampled indices ({subsampled}) does not match num_samples "
                f"({num_samples})"
            )
        return (
            n,
            self.num_replicas,
            self.rank,
            bool(self.shuffle),
            self.seed & _MASK64,
            self.epoch & _MASK64,
            num_samples,
        )

    def __iter__(self) -> Iterator[_T_co]:
        return iter(_rloader.distributed_indices(*self._args()))

    def _index_stream(self) -> _rloader.IndexChunks:
        return _rloader.IndexChunks.lazy(lambda: _rloader.distributed_stream(*self._args()))

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which (with ``seed``) chooses the order when ``shuffle=True``."""
        self.epoch = epoch


_register_native(DistributedSampler)
_twin.pair((DistributedSampler, tud_distributed.DistributedSampler))
