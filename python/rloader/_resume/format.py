"""What a saved state holds of the generators and the sampler, and its format's name:
the pieces ``state_dict()`` writes, ``check`` reads and an epoch's resume sets back."""

from __future__ import annotations

import pickle
import zlib
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data as tud

from ..sampler import _InfiniteConstantSampler

FORMAT = "rloader.DataLoader/1"


def pack(generator: Optional[torch.Generator]) -> bytes:
    """A generator's state, small: a CPU generator's Mersenne Twister words are stored as
    64-bit integers whose upper halves are zero, so the halves are split before compressing
    (about 2.5 KB instead of 5 KB)."""
    raw = (generator if generator is not None else torch.default_generator).get_state().numpy()
    if raw.size % 8:
        return b"\0" + zlib.compress(raw.tobytes(), 9)
    words = raw.view(np.uint32)
    return b"\1" + zlib.compress(np.concatenate([words[0::2], words[1::2]]).tobytes(), 9)


def unpack(blob: bytes) -> torch.Tensor:
    data = np.frombuffer(zlib.decompress(blob[1:]), dtype=np.uint8)
    if blob[:1] == b"\1":
        halves = data.view(np.uint32)
        words = np.empty_like(halves)
        words[0::2], words[1::2] = halves[: halves.size // 2], halves[halves.size // 2 :]
        data = words.view(np.uint8)
    return torch.from_numpy(data.copy())


def snapshot(dataset) -> Optional[bytes]:
    """A map-style dataset's state as a worker sends it after a batch: pickled (a copy taken
    then, small, in the batch's message), or None where ``state_dict()`` fails or its state
    does not pickle. Loading goes on as without a state; a resume starts that worker afresh."""
    try:
        return pickle.dumps(dataset.state_dict(), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - a state is an extra: the batch must not fail for it
        return None


def drawing_sampler(loader) -> Optional[Any]:
    """The sampler whose draws order the epoch: the one the batch sampler wraps (or a batch
    sampler of the user's, which draws itself), else the loader's sampler."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None:
        return getattr(batch_sampler, "sampler", batch_sampler)
    if isinstance(loader.sampler, _InfiniteConstantSampler):
        return None
    return loader.sampler


def generators_of(loader) -> dict:
    """The generators an epoch draws from, by role: "loader" (its ``generator``, None for
    torch's global RNG) and "sampler" (the drawing sampler's ``generator``, if it has one and
    it is another generator). A ``generator`` that is no torch.Generator has no state: the
    epoch's first draw from it raises torch's TypeError."""
    roles: dict = {}
    if loader.generator is None or isinstance(loader.generator, torch.Generator):
        roles["loader"] = loader.generator
    sampler = drawing_sampler(loader)
    gen = getattr(sampler, "generator", None) if sampler is not None else None
    if (
        sampler is not None
        and hasattr(sampler, "generator")
        and (gen is None or isinstance(gen, torch.Generator))
    ):
        if gen is not loader.generator:
            roles["sampler"] = gen
    return roles


def sampler_state(sampler) -> Optional[dict]:
    state: dict = {}
    if callable(getattr(sampler, "state_dict", None)) and callable(
        getattr(sampler, "load_state_dict", None)
    ):
        try:  # taken at every iter(): a sampler whose state_dict fails must still iterate
            state["state_dict"] = sampler.state_dict()
        except Exception:  # then a resume draws its keys again instead
            pass
    if isinstance(sampler, tud.distributed.DistributedSampler):
        from ..distributed import DistributedSampler

        state["distributed"] = dict(
            # rloader's order or torch's (isinstance cannot tell them apart: _twin.py)
            order="rloader" if DistributedSampler in type(sampler).__mro__ else "torch",
            epoch=int(sampler.epoch),
            seed=int(sampler.seed),
            num_replicas=int(sampler.num_replicas),
            rank=int(sampler.rank),
            shuffle=bool(sampler.shuffle),
            drop_last=bool(sampler.drop_last),
            length=len(sampler.dataset),
        )
    return state or None


def set_generators(loader, packed: dict, role: Optional[str] = None, borrow_global: bool = True):
    """Puts the generator that plays ``role`` (every saved role when None) in this loader in its
    saved state: the loader's ``generator``, or its sampler's; a sampler that draws from the
    same generator as the loader has it set just before its draw. torch's global RNG is set only
    with ``borrow_global`` (the caller has its state, to put back)."""
    current = generators_of(loader)
    for name in [role] if role is not None else list(packed):
        if name not in packed:
            continue
        if name in current:
            gen = current[name]
        else:  # the sampler draws from the loader's generator here, if it draws at all
            sampler = drawing_sampler(loader)
            if sampler is None or not hasattr(sampler, "generator"):
                continue
            gen = loader.generator
        state = unpack(packed[name])
        if gen is not None:
            gen.set_state(state)
        elif borrow_global:
            torch.set_rng_state(state)
