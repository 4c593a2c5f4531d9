"""DistributedSampler under a real process group: gloo, 2 ranks, launched with torchrun."""

import json
import os
import subprocess
import sys

import torch.utils.data.distributed as tud_distributed
from _children import short_scratch_dir


def test_two_ranks_under_torchrun(tmp_path, request):
    worker = os.path.join(os.path.dirname(__file__), "_distributed_worker.py")
    # torchrun leaves a torchelastic_* folder in the temp dir: a scratch one, removed after.
    scratch = short_scratch_dir(request)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", TMPDIR=scratch)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            worker,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world"] == r["num_replicas"] == 2 for r in ranks)
    for epoch in range(2):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert len(a) == len(b) == 52
        # 103 indices, padded by one: together the shards cover everything, overlapping once.
        assert set(a) | set(b) == set(range(103))
        assert len(set(a) & set(b)) <= 1
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # set_epoch changes the order
    # Resumed from every rank's state, gathered over gloo: what no rank had taken, once each
    # (61 samples over 2 ranks: one padding sample).
    before = {x for r in ranks for x in r["resume"]["before"]}
    after = [x for r in ranks for x in r["resume"]["after"]]
    assert set(after) == set(range(61)) - before and len(after) - len(set(after)) <= 1
    assert len(ranks[0]["resume"]["after"]) == len(ranks[1]["resume"]["after"])
    # Without shuffling, each rank's batches are exactly what torch's sampler gives that rank.
    for r in ranks:
        theirs = list(tud_distributed.DistributedSampler(range(50), 2, r["rank"], shuffle=False))
        assert [i for b in r["batches"] for i in b] == theirs
