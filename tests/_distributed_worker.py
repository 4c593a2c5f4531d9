"""Run by test_distributed.py under torchrun: each rank writes its shards to a JSON file."""

import json
import os
import sys

import torch.distributed as dist

import rloader


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = rloader.DistributedSampler(range(103), seed=5)  # replicas and rank from the group
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    loader = rloader.DataLoader(list(range(50)), batch_size=4,
                                sampler=rloader.DistributedSampler(range(50), shuffle=False))
    batches = [b.tolist() for b in loader]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "num_replicas": sampler.num_replicas,
                   "epochs": epochs, "batches": batches}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
