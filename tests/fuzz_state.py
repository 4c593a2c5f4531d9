"""Fuzzes ``DataLoader.load_state_dict()`` with malformed, truncated and hostile states.

    python tests/fuzz_state.py --states 100000 --seed 1     # make fuzz
    python tests/fuzz_state.py --states 3000                # tests/test_state_fuzz.py, in CI

Valid states are taken from loaders of several kinds (shuffled or not, a DistributedSampler,
a stateful IterableDataset, mid-epoch, between epochs, out of order with holes), then mutated
at random: a field deleted or replaced by a value of another type or out of range (negative,
2**70, NaN, a long list, nested junk), a generator state truncated, bit-flipped or swapped for
a zlib bomb, fields added, states swapped between loader kinds or wrapped in lists as an
elastic resume would be. Each mutated state is loaded into a new loader of the kind it came
from and an epoch is taken from it. Allowed outcomes: a ``TypeError`` or ``ValueError`` from
``load_state_dict``, or an epoch whose batches are batches
of the dataset, no more than an epoch's worth (a dataset's own part of the state goes to its
``load_state_dict`` as it is: its ValueError may come from ``iter()``). Anything else - another exception, a crash, a
hang (each state has ``--state-timeout`` seconds, then every stack is dumped and the run
fails) - is a failure, printed with the mutation that caused it.
"""

from __future__ import annotations

import argparse
import collections
import copy
import faulthandler
import itertools
import os
import random
import sys
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rloader  # noqa: E402
from rloader.distributed import DistributedSampler  # noqa: E402

N = 40  # samples in every dataset here


class Stream(rloader.IterableDataset):
    """0..N-1, saying where it is."""

    def __init__(self) -> None:
        self.at = 0

    def __iter__(self):
        while self.at < N:
            self.at += 1
            yield self.at - 1

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        at = state.get("at") if isinstance(state, dict) else None
        if type(at) is not int or not 0 <= at <= N:
            raise ValueError(f"Stream: not a state of mine: {state!r}")
        self.at = state["at"]


def make(kind: str):
    data = list(range(N))
    if kind == "plain":
        return rloader.DataLoader(data, batch_size=4)
    if kind == "shuffled":
        return rloader.DataLoader(
            data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
    if kind == "distributed":
        sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
        return rloader.DataLoader(data, batch_size=4, sampler=sampler)
    if kind == "stream":
        return rloader.DataLoader(Stream(), batch_size=4)
    if kind == "threads":  # out of order: its states name holes
        return rloader.DataLoader(
            data, batch_size=2, shuffle=True, num_workers=2, worker_type="thread",
            in_order=False, prefetch_factor=4,
        )  # fmt: skip
    if kind == "unbatched":
        return rloader.DataLoader(data, batch_size=None, shuffle=True)
    raise AssertionError(kind)


KINDS = ["plain", "shuffled", "distributed", "stream", "unbatched", "threads"]


def seeds() -> list:
    """Valid states of every kind: before iter(), after k batches, after an epoch, and a list
    of both ranks' states of a distributed job (an elastic resume)."""
    out = []
    for kind in KINDS:
        for taken in (None, 0, 1, 3, "all"):
            loader = make(kind)
            if taken is not None:
                it = iter(loader)
                for _ in itertools.islice(it, None if taken == "all" else taken):
                    pass
            out.append((kind, loader.state_dict()))
    job = []
    for rank in (0, 1):
        data = list(range(N))
        loader = rloader.DataLoader(
            data, batch_size=4, sampler=DistributedSampler(data, 2, rank, shuffle=True, seed=3)
        )
        it = iter(loader)
        next(it)
        job.append(loader.state_dict())
    out.append(("distributed", job))
    return out


HOSTILE = [
    None, True, False, 0, -1, 1, 7, 2**31, 2**63, 2**70, -(2**70), 0.5, float("nan"),
    float("inf"), "", "x", "rloader.DataLoader/1", b"", b"\0", b"\1", b"\1" + b"\xff" * 40,
    [], [0], [-1], [0, 0], list(range(1000)), {}, {"at": -5}, {"num_workers": 2}, (1, 2),
    {"format": "rloader.DataLoader/1"}, [[[]]], object, 1j,
]  # fmt: skip


def bomb() -> bytes:
    """A generator state that inflates to 1 GiB of zeros."""
    z = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"\1" + b"".join(z.compress(chunk) for _ in range(1024)) + z.flush()


def paths(obj, prefix=()):
    """Every (path, value) inside a state: dict keys and list indices."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, prefix + (i,))


def parent_of(root, path):
    node = root
    for p in path[:-1]:
        node = node[p]
    return node


def mutate(rng: random.Random, state, pool: list, big: bytes):
    """One to three random mutations of a deep copy of ``state``; returns (state, what)."""
    state = copy.deepcopy(state)
    what = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        spots = list(paths(state))
        path, value = rng.choice(spots)
        op = rng.random()
        if not path:
            if op < 0.3:
                state = [state] if rng.random() < 0.5 else copy.deepcopy(rng.choice(HOSTILE))
                what.append("wrap/replace root")
            else:
                other = copy.deepcopy(rng.choice(pool)[1])
                state = [state, other] if rng.random() < 0.5 else other
                what.append("swap root")
            continue
        parent = parent_of(state, path)
        key = path[-1]
        if isinstance(value, (bytes, bytearray)) and op < 0.5:
            blob = bytearray(value)
            choice = rng.random()
            if choice < 0.3 and blob:
                blob = blob[: rng.randrange(len(blob))]
                what.append(f"truncate {path}")
            elif choice < 0.6 and blob:
                for _ in range(rng.randint(1, 4)):
                    blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
                what.append(f"flip {path}")
            elif choice < 0.7:
                blob = bytearray(big)
                what.append(f"bomb {path}")
            else:
                blob = bytearray(value) + bytes(rng.randrange(1, 64))
                what.append(f"extend {path}")
            parent[key] = bytes(blob)
        elif isinstance(parent, dict) and op < 0.3:
            del parent[key]
            what.append(f"delete {path}")
        elif isinstance(value, int) and not isinstance(value, bool) and op < 0.6:
            parent[key] = value + rng.choice([-(2**64), -3, -1, 1, 3, 2**64, 10**18])
            what.append(f"shift {path}")
        elif isinstance(parent, dict) and op < 0.7:
            parent[
                rng.choice(["extra", "holes", "workers", "elastic_from", "world", "state_dict"])
            ] = copy.deepcopy(rng.choice(HOSTILE))
            what.append(f"add beside {path}")
        else:
            parent[key] = copy.deepcopy(rng.choice(HOSTILE))
            what.append(f"replace {path}")
    return state, what


def attempt(kind: str, state) -> str:
    """Loads ``state`` into a new loader of ``kind`` and takes an epoch: "refused" (a TypeError
    or ValueError from ``load_state_dict``, or from the dataset's own ``load_state_dict``,
    which gets the dataset's part of the state as it is) or "ran"; any other exception, or one
    raised later by rloader, propagates."""
    loader = make(kind)
    try:
        loader.load_state_dict(state)
    except (TypeError, ValueError):
        return "refused"
    try:
        batches = list(itertools.islice(iter(loader), N + 2))
    except ValueError as err:
        if not str(err).startswith("Stream:"):
            raise
        return "refused"
    assert len(batches) <= N, f"{len(batches)} batches from an epoch of at most {N}"
    for batch in batches:
        values = batch.tolist() if isinstance(batch, torch.Tensor) else batch
        values = values if isinstance(values, list) else [values]
        assert all(0 <= v < N for v in values), f"batch {batch!r} is not of the dataset"
    return "ran"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state-timeout", type=float, default=30.0)
    args = ap.parse_args(argv)

    faulthandler.enable()
    rng = random.Random(args.seed)
    pool = seeds()
    big = bomb()
    for kind, state in pool:  # the seeds themselves load and run
        assert attempt(kind, copy.deepcopy(state)) == "ran", (kind, state)
    outcomes: collections.Counter = collections.Counter()
    started = time.monotonic()
    for number in range(args.states):
        kind, state = rng.choice(pool)
        state, what = mutate(rng, state, pool, big)
        faulthandler.dump_traceback_later(args.state_timeout, exit=True)
        try:
            outcomes[attempt(kind, state)] += 1
        except BaseException as err:
            print(
                f"state {number} ({kind}; {'; '.join(what)}): {type(err).__name__}: {err}",
                flush=True,
            )
            return 1
        finally:
            faulthandler.cancel_dump_traceback_later()
        if (number + 1) % 10000 == 0:
            print(
                f"fuzz_state: {number + 1} states, {dict(outcomes)}, "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
    print(
        f"fuzz_state: {args.states} malformed states, {outcomes['refused']} refused with "
        f"TypeError/ValueError, {outcomes['ran']} ran a valid epoch, 0 failures, "
        f"{time.monotonic() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
