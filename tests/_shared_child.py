"""A process of its own (started fresh, not forked: as torchrun starts a rank) that builds or
attaches to a shared container, reads it through a DataLoader's worker processes, reports
what it holds as one JSON line, and waits for stdin to close.

    python _shared_child.py build KEY VERSION N WORKERS CONTEXT
    python _shared_child.py attach KEY VERSION - WORKERS CONTEXT

The report: {"pid", "workers": worker pids, "inode": of the memfd, "worker_inodes",
"items": first and last items, "len"}.
"""

from __future__ import annotations

import json
import os
import sys

from _datasets import Whereabouts

import rloader
from rloader.shared import SharedList


def main() -> None:
    role, key, version, n, workers, context = sys.argv[1:7]
    if role == "build":
        count = int(n)
        paths = SharedList.attach(
            key, version=version, build=lambda: [f"item-{i:08d}" for i in range(count)]
        )
    else:
        paths = SharedList.attach(key, version=version)
    pids, inodes = set(), set()
    if int(workers):
        loader = rloader.DataLoader(
            Whereabouts(paths),
            batch_size=64,
            num_workers=int(workers),
            persistent_workers=True,  # the workers stay, holding the container, until killed
            multiprocessing_context=context,
        )
        for pid, inode, _ in loader:
            pids.update(pid.tolist())
            inodes.update(inode.tolist())
    report = {
        "pid": os.getpid(),
        "workers": sorted(pids),
        "inode": paths._inode,
        "worker_inodes": sorted(inodes),
        "items": [paths[0], paths[-1]],
        "len": len(paths),
    }
    print(json.dumps(report), flush=True)
    sys.stdin.read()  # until the test closes stdin (or kills this process)


if __name__ == "__main__":
    main()
