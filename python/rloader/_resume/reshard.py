"""Elastic resume: the rest of a saved epoch, re-sharded over another number of ranks.

``load_state_dict([state of rank 0, ..., state of rank N-1])`` on a loader over a
``DistributedSampler`` with M ranks: the samples of the saved epoch that no old rank handed
out, in the epoch's order, are split as ``DistributedSampler`` splits a dataset (padded by
repeating the start, or trimmed with ``drop_last``), one share per new rank; later epochs are
the new world's normal ones. This module checks the saved states and works out this rank's
share; ``_resume`` makes the resumed epoch's keys of it (NOTE [Resume]).
"""

from __future__ import annotations

import math
from typing import Optional

import torch.utils.data as tud

from .. import _rloader

__all__ = ["check_rank", "remaining_share"]


def check_rank(sampler, num_replicas: int, rank: int) -> None:
    """A state saved by one rank resumes only on the same rank of a world of the same size."""
    if isinstance(sampler, tud.distributed.DistributedSampler) and (
        sampler.num_replicas,
        sampler.rank,
    ) != (num_replicas, rank):
        raise ValueError(
            f"this state is rank {rank}'s of a job of {num_replicas} ranks, and this loader's "
            f"sampler is rank {sampler.rank} of {sampler.num_replicas}: to resume on another "
            "world size, give load_state_dict() the list of every old rank's state"
        )


def remaining_share(sampler, states: list) -> Optional[tuple]:
    """``(this rank's samples, the saved epoch)``: the samples of the epoch in which every old
    rank saved its state in ``states`` that none of them handed out, shared over the new world
    of ``sampler`` (the loader's drawing sampler) as ``DistributedSampler`` shares a dataset; or
    None when the states were saved between epochs. Raises ValueError for states that do not
    make one saved job's epoch, or a sampler that is no ``DistributedSampler``."""
    if not states:
        raise ValueError("load_state_dict() was given an empty list of rank states")
    if not isinstance(sampler, tud.distributed.DistributedSampler):
        raise ValueError(
            "load_state_dict() with one state per rank needs a DataLoader over a "
            "DistributedSampler (the new world's rank and size)"
        )
    saved = []
    for state in states:
        if isinstance(state, dict) and state.get("elastic_from") is not None:
            raise ValueError(
                "these states were saved during an epoch that was itself resumed on another "
                "world size: resume them on that world size (one state per rank), and change the "
                "world size again once that epoch has ended"
            )
        info = (state.get("sampler") or {}).get("distributed") if isinstance(state, dict) else None
        if info is None:
            raise ValueError("each rank's state must come from a loader over a DistributedSampler")
        saved.append((info, state))
    infos = [info for info, _ in saved]
    first = infos[0]
    world = first["num_replicas"]
    if sorted(info["rank"] for info in infos) != list(range(world)) or any(
        (i["num_replicas"], i["epoch"], i["seed"], i["shuffle"], i["drop_last"], i["length"])
        != (
            world,
            first["epoch"],
            first["seed"],
            first["shuffle"],
            first["drop_last"],
            first["length"],
        )
        for i in infos
    ):
        raise ValueError(
            "load_state_dict() needs the states of every rank of one saved job and epoch "
            f"(ranks 0..num_replicas-1 of the same sampler): got ranks {[i['rank'] for i in infos]}"
        )
    if any(state["position"] is None for _, state in saved):
        return None  # between epochs on the old world: the new world starts its next epoch
    n = first["length"]
    if n != len(sampler.dataset):
        raise ValueError(
            f"the saved job's dataset had {n} samples, this one has {len(sampler.dataset)}"
        )
    num_samples = (
        math.ceil((n - world) / world) if first["drop_last"] and n % world else math.ceil(n / world)
    )
    consumed: set = set()
    order: list = [None] * (num_samples * world)
    for info, state in saved:
        if info.get("order", "rloader") == "torch":  # torch's DistributedSampler: its order
            theirs = tud.distributed.DistributedSampler(
                range(n), world, info["rank"], info["shuffle"], info["seed"], info["drop_last"]
            )
            theirs.set_epoch(info["epoch"])
            shard = list(theirs)
        else:
            shard = _rloader.distributed_indices(
                n,
                world,
                info["rank"],
                info["shuffle"],
                info["seed"] & (2**64 - 1),
                info["epoch"] & (2**64 - 1),
                num_samples,
            )
        order[info["rank"] :: world] = shard
        # What the rank handed out, in its own batch size (the new world's may differ).
        batch_size = state.get("batch_size")
        if batch_size is None:
            raise ValueError(
                "another world size needs each old rank's batch_size (a loader with a "
                "batch_sampler of its own, or without batching, cannot say how many samples "
                "its batches held)"
            )
        not_yet = set(state.get("holes", ()))  # out of order: not handed out yet
        for b in range(state["position"]) if not_yet else ():
            if b not in not_yet:
                consumed.update(shard[b * batch_size : (b + 1) * batch_size])
        if not not_yet:
            consumed.update(shard[: state["position"] * batch_size])
    limit = min(n, num_samples * world)
    left = [i for i in order[:limit] if i not in consumed]
    new_world, rank = sampler.num_replicas, sampler.rank
    if sampler.drop_last:
        left = left[: len(left) - len(left) % new_world]
    elif left and len(left) % new_world:
        padding = new_world - len(left) % new_world
        left += (left * math.ceil(padding / len(left)))[:padding]
    mine = left[rank::new_world]
    return mine, first["epoch"]
