"""One copy per node: the memory of N ranks x M worker processes over 2 million file paths and
labels, with Python lists (torch.utils.data) and with rloader.shared's containers; and what
building and reading a SharedList costs against a Python list.

The ranks are started by torchrun on the CPU (``python -m torch.distributed.run
--nproc_per_node N``, gloo), as a training job starts them: not forked from one another. Each
rank iterates one epoch of its DistributedSampler share with a DataLoader of M workers
(persistent, so they are alive when measured), then rank 0 sums the proportional set size
(PSS, /proc/<pid>/smaps_rollup) of every rank and worker: shared pages count once over all of
them. Each configuration runs twice, with the data and "bare" (a dataset that makes each path
when asked, holding nothing); the difference is the data's memory, compared with the bytes of
one copy (the containers' shared memory: paths and labels).

    torch     torch.utils.data.DataLoader, worker processes, each rank a Python list and a list
              of labels (the dataset as users write it)
    rl-proc   rloader.DataLoader, worker processes (forked), SharedList + SharedArray under a key
    rl-thread rloader.DataLoader, worker threads, SharedList + SharedArray under a key

    python benches/shared_memory.py                 # 4 ranks x 2 workers, 2M paths
    python benches/shared_memory.py --quick         # 2 ranks x 2 workers, 200k paths

The run is written to benches/results/ as a dated JSON file (bench_results.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_results  # noqa: E402
from side_by_side import child_pids, pss, release_freed_memory  # noqa: E402

MODES = ["torch", "rl-proc", "rl-thread"]
RANK_ARGS = "RLOADER_BENCH_RANK_ARGS"  # a rank's arguments, from the driver


def make_paths(n: int) -> list:
    """`n` file paths of ~60 bytes, as an image dataset's index holds them."""
    return [f"/datasets/imagenet/train/n{i % 1000:08d}/image_{i:09d}.JPEG" for i in range(n)]


def make_labels(n: int) -> list:
    return [i % 1000 for i in range(n)]


# ---- One rank (run by torchrun)


class Held:
    """Paths and labels held in the dataset (Python lists, or rloader.shared containers)."""

    def __init__(self, paths, labels):
        self.paths, self.labels = paths, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.paths[i], self.labels[i]

    def __getitems__(self, idx):
        if isinstance(self.paths, list):
            return [(self.paths[i], self.labels[i]) for i in idx]
        return list(zip(self.paths.take(idx), self.labels.take(idx).tolist()))


class Bare(Held):
    """The same samples, made when asked: the baseline holds no data."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return f"/datasets/imagenet/train/n{i % 1000:08d}/image_{i:09d}.JPEG", i % 1000

    def __getitems__(self, idx):
        return [self.__getitem__(i) for i in idx]


def rank_main(args) -> None:
    """One rank: `args` (a namespace of the driver's) as the driver passed them in the
    environment (torchrun's own options would take prefixes of command-line ones)."""
    import torch.distributed as dist
    import torch.utils.data as tud

    import rloader
    from rloader.shared import SharedArray, SharedList

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.n
    nbytes = 0
    if args.bare:
        dataset = Bare(n)
    elif args.mode == "torch":
        dataset = Held(make_paths(n), make_labels(n))
    else:
        key = f"bench-{args.run_id}"
        paths = SharedList.attach(key, version=n, build=lambda: make_paths(n))
        labels = SharedArray.attach(key, version=n, build=lambda: np.array(make_labels(n)))
        dataset = Held(paths, labels)
        nbytes = paths.nbytes + labels.nbytes
    release_freed_memory()  # the builder's Python list is gone: hand its pages back
    lib = tud if args.mode == "torch" else rloader
    sampler = lib.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    extra = {"worker_type": "thread"} if args.mode == "rl-thread" else {}
    loader = lib.DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=args.workers,
                            persistent_workers=True, **extra)  # fmt: skip
    start = time.perf_counter()
    samples = sum(len(b[0]) for b in loader)
    epoch = time.perf_counter() - start
    pids = [os.getpid(), *child_pids()]
    everything = [None] * world
    dist.all_gather_object(everything, {"pids": pids, "samples": samples, "epoch": epoch})
    if rank == 0:
        all_pids = [p for r in everything for p in r["pids"]]
        ranks = [r["pids"][0] for r in everything]
        report = {
            "pss": sum(pss(p) for p in all_pids),
            "ranks_pss": [pss(p) for p in ranks],
            "workers_pss": [pss(p) for p in all_pids if p not in ranks],
            "processes": len(all_pids),
            "samples": sum(r["samples"] for r in everything),
            "epoch": max(r["epoch"] for r in everything),
            "nbytes": nbytes,
        }
        print("REPORT " + json.dumps(report), flush=True)
    dist.barrier()
    del loader
    dist.destroy_process_group()


# ---- The driver


def run_ranks(mode: str, bare: bool, args) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}",
           f"--master_port={29500 + random.randrange(1000)}", os.path.abspath(__file__)]  # fmt: skip
    rank_args = {"mode": mode, "bare": bare, "n": args.n, "workers": args.workers,
                 "run_id": f"{os.getpid()}-{mode}-{time.time_ns()}"}  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", RANK_ARGS: json.dumps(rank_args)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("REPORT "):
            return json.loads(line[len("REPORT ") :])
    raise RuntimeError(f"{mode}: no report\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def timed(f, repeats=3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best


def costs(n: int) -> dict:
    """Building a SharedList from a Python list, against building the list; random single
    reads and batch reads of 256, against a Python list's."""
    from rloader.shared import SharedList

    list_build = timed(lambda: make_paths(n))
    release_freed_memory()
    before = pss(os.getpid())
    paths, labels = make_paths(n), make_labels(n)
    python_copy = pss(os.getpid()) - before
    del labels
    shared_build = timed(lambda: SharedList(paths))
    shared = SharedList(paths)
    rng = random.Random(0)
    idx = [rng.randrange(n) for _ in range(1_000_000)]

    def single(c):
        def go():
            for i in idx:
                c[i]

        return len(idx) / timed(go)

    batches = [idx[k : k + 256] for k in range(0, len(idx), 256)]

    def comprehension():
        for b in batches:
            [paths[i] for i in b]

    def take():
        for b in batches:
            shared.take(b)

    return {
        "python_copy": python_copy,
        "list_build": list_build,
        "shared_build": shared_build,
        "list_single": single(paths),
        "shared_single": single(shared),
        "list_batch": len(idx) / timed(comprehension),
        "shared_batch": len(idx) / timed(take),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--modes", default=",".join(MODES))
    if RANK_ARGS in os.environ:
        return rank_main(argparse.Namespace(**json.loads(os.environ[RANK_ARGS])))
    args = p.parse_args()
    if args.quick:
        args.ranks, args.n = 2, 200_000
    started = bench_results.now()

    print(f"{args.ranks} ranks x {args.workers} workers, {args.n:,} paths (torchrun, CPU, gloo)")
    rows = {}
    for mode in args.modes.split(","):
        bare = run_ranks(mode, True, args)
        full = run_ranks(mode, False, args)
        rows[mode] = (bare, full)
        print(f"  {mode:9s} {full['processes']:2d} processes  PSS {bare['pss'] / 2**20:8.0f} MiB bare,"
              f" {full['pss'] / 2**20:8.0f} MiB with the data  (epoch {full['epoch']:.1f} s)",
              flush=True)  # fmt: skip
    one_copy = max(full["nbytes"] for _, full in rows.values()) or None

    print("\nbuild and read costs (one process) ...", flush=True)
    c = costs(args.n)

    print(f"\n{'check':58s} {'figure':>14s}   {'target':>12s}")
    if one_copy:
        print(
            f"{'one copy of the data (SharedList + SharedArray bytes)':58s} {one_copy / 2**20:11.0f} MiB"
        )
    py_copy = c["python_copy"]
    print(
        f"{'one Python copy (the lists of paths and labels, PSS)':58s} {py_copy / 2**20:11.0f} MiB"
    )
    for mode, (bare, full) in rows.items():
        above = full["pss"] - bare["pss"]
        label = f"PSS above bare, {full['processes']} processes, {mode}"
        if mode == "torch":
            copies, target = f"{above / py_copy:.2f} Python", "(~12 Python)"
        else:
            copies, target = (
                (f"{above / one_copy:.2f} copies" if one_copy else "-"),
                "<= 1.30 copies",
            )
        print(f"{label:58s} {above / 2**20:7.0f} MiB = {copies:>12s}   {target}")
    ratio = c["shared_build"] / c["list_build"]
    print(
        f"{'build 2M-string SharedList from a list':58s} {c['shared_build']:13.3f} s   {'<= 1 s':>12s}"
    )
    print(
        f"{'  / time to build the list (' + format(c['list_build'], '.3f') + ' s)':58s} {ratio:13.2f}x   {'<= 3x':>12s}"
    )
    single = c["shared_single"] / c["list_single"]
    print(f"{'random single reads, shared[i] / lst[i] rate':58s} {single:13.2f}x   {'>= 0.5x':>12s}"
          f"   ({c['shared_single'] / 1e6:.2f}M vs {c['list_single'] / 1e6:.2f}M reads/s)")  # fmt: skip
    batch = c["shared_batch"] / c["list_batch"]
    print(f"{'batch reads of 256, take() / list comprehension rate':58s} {batch:13.2f}x   {'>= 2x':>12s}"
          f"   ({c['shared_batch'] / 1e6:.2f}M vs {c['list_batch'] / 1e6:.2f}M items/s)")  # fmt: skip
    above = {mode: full["pss"] - bare["pss"] for mode, (bare, full) in rows.items()}
    figures = {
        "ranks": args.ranks,
        "workers": args.workers,
        "paths": args.n,
        "modes": {mode: {"bare": bare, "with_data": full} for mode, (bare, full) in rows.items()},
        "one_copy_bytes": one_copy,
        "costs": c,
        # PSS the data adds on the node, torch's lists against each shared mode's (bytes).
        "comparisons": [
            bench_results.comparison(
                f"PSS the data adds, {args.ranks} ranks x {args.workers} workers: {mode} vs torch",
                [above["torch"]],
                [above[mode]],
                smoke=args.quick,
            )
            for mode in above
            if mode != "torch" and "torch" in above
        ],
    }
    path = bench_results.save("shared_memory", figures, smoke=args.quick, started=started)
    print(f"This run's figures: {path}")


if __name__ == "__main__":
    main()
