"""Run by test_distributed.py under torchrun: each rank writes its shards to a JSON file."""

import datetime
import json
import os
import signal
import sys
import threading

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
    group is torn down. gloo's teardown has hung a rank past its work under load (torch 2.6 on
    2 cores, two CI runs of about ten). It runs on a thread of its own: a rank whose teardown
    takes over 30 s ends itself as the finished rank it is (the test checks the results it
    wrote). (A Python SIGALRM handler, tried first, never ran: Python runs handlers between
    bytecodes of the main thread, which was inside the teardown's C++.)"""
    dist.barrier()
    signal.alarm(0)
    teardown = threading.Thread(target=dist.destroy_process_group, daemon=True)
    teardown.start()
    teardown.join(30)
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
