"""rloader: a drop-in, faster torch.utils.data with a Rust core.

Change ``from torch.utils.data import X`` to ``from rloader import X``: every documented name
is here, takes the same arguments and gives the same results. See README.md for what differs
(random orders are rloader's own, reproducible from a seed or a torch.Generator).
"""

from __future__ import annotations

from torch.utils.data import get_worker_info

from . import distributed, shared
from ._collate import collate, default_collate, default_collate_fn_map, default_convert
from ._rloader import __version__ as __version__
from .dataloader import DataLoader
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .distributed import DistributedSampler
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "collate",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "distributed",
    "shared",
    "get_worker_info",
    "random_split",
]
