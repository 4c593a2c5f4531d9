"""Run by test_distributed.py under torchrun: each rank writes its shards to a JSON file."""

import datetime
import json
import os
import signal
import sys

import torch.distributed as dist

import rloader


def main(out_dir: str) -> None:
    # torchrun starts each rank in a session of its own, so the test's timeout does not reach
    # it: a rank that hangs ends itself, and a collective waits a minute at most.
    signal.alarm(180)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = rloader.DistributedSampler(range(103), seed=5)  # replicas and rank from the group
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    loader = rloader.DataLoader(
        list(range(50)), batch_size=4, sampler=rloader.DistributedSampler(range(50), shuffle=False)
    )
    batches = [b.tolist() for b in loader]
    resume = resumed(rank, world)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "num_replicas": sampler.num_replicas,
                "epochs": epochs,
                "batches": batches,
                "resume": resume,
            },
            f,
        )
    finish()


def finish() -> None:
    """A rank's end, once its results are written: every rank reaches the barrier, then the
    process ends without tearing the group down. torch 2.6's teardown deadlocks now and then
    under load: `~ProcessGroupGloo` holds the GIL while it joins a gloo thread that waits for
    the GIL (seen with gdb in CI on 2 cores; it hung a rank past the test's timeout, and past
    a 30 s join of a teardown thread, which needed the GIL too). The kernel closes the
    sockets; the other ranks have passed the barrier. The alarm stays set until the end."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def resumed(rank: int, world: int) -> dict:
    """Each rank takes rank + 2 batches of a shuffled epoch and saves its state; the states are
    gathered over the process group, as a checkpoint would hold them; each rank then resumes
    from the list (the rule for another world size, here the same one) and takes the rest."""

    def loader():
        sampler = rloader.DistributedSampler(range(61), seed=9)
        sampler.set_epoch(3)
        return rloader.DataLoader(list(range(61)), batch_size=3, sampler=sampler)

    first = loader()
    it = iter(first)
    before = [x for _ in range(rank + 2) for x in next(it).tolist()]
    states = [None] * world
    dist.all_gather_object(states, first.state_dict())
    again = loader()
    again.load_state_dict(states)
    return {"before": before, "after": [x for b in again for x in b.tolist()]}


if __name__ == "__main__":
    main(sys.argv[1])
