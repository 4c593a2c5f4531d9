"""One rank of tests/test_shared.py's torchrun job: every rank attaches to the same key with a
`build`, reads the container through 2 worker processes, and writes what it saw to
OUT/rank{RANK}.json: {"rank", "built" (whether its build ran), "inode", "worker_inodes",
"items"}.

    python -m torch.distributed.run --standalone --nproc_per_node=N _shared_rank.py OUT KEY
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from _datasets import Whereabouts
from _distributed_worker import finish

import rloader
from rloader.shared import SharedList


def main() -> None:
    out, key = sys.argv[1:3]
    rank = int(os.environ["RANK"])
    # The ranks stay until all have read: the copy goes with its last holder, and a rank that
    # came after every holder had left would build its own (as it should).
    dist.init_process_group("gloo")
    built = []

    def build():
        built.append(rank)
        return [f"item-{i:08d}" for i in range(3000)]

    paths = SharedList.attach(key, version=1, build=build)
    loader = rloader.DataLoader(Whereabouts(paths), batch_size=100, num_workers=2)
    inodes = set()
    items = []
    for _, inode, item in loader:
        inodes.update(inode.tolist())
        items.extend(item)
    report = {
        "rank": rank,
        "built": bool(built),
        "inode": paths._inode,
        "worker_inodes": sorted(inodes),
        "items": [items[0], items[-1], len(items)],
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    finish()


if __name__ == "__main__":
    main()
