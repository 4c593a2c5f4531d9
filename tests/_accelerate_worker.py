"""Run by test_accelerate.py under torchrun (2 processes, gloo, CPU): each process prepares torch
and rloader loaders over the same data with accelerate, after rloader.integrations.accelerate's
install(), iterates both for two epochs and writes what it saw to rank<N>.json."""

import datetime
import json
import os
import signal
import sys

import torch
import torch.utils.data as tud
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import InitProcessGroupKwargs

import rloader
import rloader.integrations.accelerate

from _compare import same

N = 103  # not a multiple of 2 processes x batch 4: the last batch is padded (even_batches)


class Pairs(tud.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([i, -i], dtype=torch.float32), i


class Stream(tud.IterableDataset):
    """0..N-1, split between DataLoader workers."""

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(
            [(torch.tensor([i, -i], dtype=torch.float32), i) for i in range(start, N, step)]
        )


def cases():
    """name -> (accelerate's DataLoaderConfiguration options, a function building a loader with
    lib's DataLoader)."""

    def sampler():
        return rloader.RandomSampler(range(N), generator=torch.Generator().manual_seed(1))

    dispatch = {"dispatch_batches": True}
    split_seedable = {"split_batches": True, "use_seedable_sampler": True, "data_seed": 7}
    return {
        "sequential, 0 workers": ({}, lambda lib: lib.DataLoader(Pairs(), batch_size=4)),
        "sequential, 2 workers": (
            {},
            lambda lib: lib.DataLoader(Pairs(), batch_size=4, num_workers=2),
        ),
        "rloader's RandomSampler, 2 workers": (
            {},
            lambda lib: lib.DataLoader(Pairs(), batch_size=4, sampler=sampler(), num_workers=2),
        ),
        "dispatch_batches, 0 workers": (
            dispatch,
            lambda lib: lib.DataLoader(Pairs(), batch_size=4),
        ),
        "IterableDataset (dispatched), 2 workers": (
            {},
            lambda lib: lib.DataLoader(Stream(), batch_size=4, num_workers=2),
        ),
        # batches of 8 split in 4 + 4; accelerate replaces the RandomSampler by its own
        "split_batches, seedable sampler, shuffle, 0 workers": (
            split_seedable,
            lambda lib: lib.DataLoader(Pairs(), batch_size=8, shuffle=True),
        ),
    }


def plain(batch):
    return [x.tolist() if isinstance(x, torch.Tensor) else x for x in batch]


def main(out_dir: str) -> None:
    signal.alarm(180)  # ends this process if anything hangs, whatever torchrun does
    rloader.integrations.accelerate.install()
    handlers = [InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=60))]
    acc = Accelerator(cpu=True, kwargs_handlers=handlers)
    report = {"rank": acc.process_index, "world": acc.num_processes, "cases": {}}
    for name, (config, build) in cases().items():
        if config:
            acc = Accelerator(
                cpu=True,
                kwargs_handlers=handlers,
                dataloader_config=DataLoaderConfiguration(**config),
            )
        prepared = {lib.__name__: acc.prepare(build(lib)) for lib in (tud, rloader)}
        epochs = {lib: [list(loader) for _ in range(2)] for lib, loader in prepared.items()}
        ours, theirs = prepared["rloader"], prepared["torch.utils.data"]
        report["cases"][name] = {
            "same": same(epochs["rloader"], epochs["torch.utils.data"]),
            "batches": [[plain(b) for b in epoch] for epoch in epochs["rloader"]],
            "wrapper": type(ours).__name__,
            "base": f"{type(ours.base_dataloader).__module__}.{type(ours.base_dataloader).__name__}",
            "torch_wrapper": type(theirs).__name__,
            "torch_base": f"{type(theirs.base_dataloader).__module__}.{type(theirs.base_dataloader).__name__}",
        }
    with open(os.path.join(out_dir, f"rank{acc.process_index}.json"), "w") as f:
        json.dump(report, f)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
