"""What ``DataLoader.load_state_dict()`` accepts: every field of a saved state is checked here,
before anything is applied, so that a state that is malformed, truncated, edited by hand or
hostile is refused with a ``TypeError`` (a field of the wrong type) or a ``ValueError`` (a
value out of range, or what ``state_dict()`` never writes) that names the field, instead of an
``IndexError`` deep in the next ``iter()``, a generator in a half-set state, a skip of 10^18
batches (a hang) or a zlib bomb. The format is ``_resume.state_dict()``'s (NOTE [Resume]).

What the user's own objects saved (a sampler's ``state_dict``, an IterableDataset's, each
worker's dataset's) is theirs to check: it is passed to their ``load_state_dict`` as it is.
Fields this version does not know are ignored, as a newer version's would be.
"""

from __future__ import annotations

import numbers
import zlib
from typing import Any, Optional

import torch
import torch.utils.data

from .format import FORMAT, drawing_sampler, generators_of

_ROLES = ("loader", "sampler")
_FLAGS = ("in_order", "pulled", "base_drawn", "next_draws_base", "dataset_ended")


def check(loader, state: Any) -> None:
    """Raises TypeError or ValueError, naming the field, unless ``state`` is what
    ``state_dict()`` of a loader like ``loader`` can have returned (or a list of them, one per
    rank of a job over a DistributedSampler)."""
    if isinstance(state, (list, tuple)):
        _check_job(loader, state, "state")
        return
    _check_one(loader, state, "state", elastic_rank=False)


def _check_one(loader, state: Any, where: str, elastic_rank: bool) -> None:
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        if isinstance(state, dict) or not elastic_rank:
            raise ValueError(
                "load_state_dict() expects what rloader.DataLoader.state_dict() returned (a "
                f"dict with format={FORMAT!r}), or a list of them, one per rank of the saved "
                f"job; {where} is {_what(state)}"
            )
        raise TypeError(f"{where} must be a dict from state_dict(), not {_what(state)}")
    for key in ("position", "generators", "sampler"):
        if key not in state:
            raise ValueError(f"{where} has no '{key}': it is not whole")
    position = _optional_int(state, "position", where, least=0)
    for flag in _FLAGS:
        if flag in state and not isinstance(state[flag], bool):
            raise TypeError(f"{where}['{flag}'] must be True or False, not {_what(state[flag])}")
    _optional_int(state, "batch_size", where, least=1)
    _check_holes(state, position, where)
    _check_generators(loader, state.get("generators", {}), where)
    _check_sampler(loader, state.get("sampler"), where)
    _check_workers(state.get("workers"), where)
    _check_readers(state.get("readers"), state.get("workers"), where)
    _check_auto(state.get("auto"), where)
    if state.get("elastic_from") is not None:
        _check_elastic(loader, state, where)
    elif position is not None and elastic_rank:
        _check_rank_position(state, position, where)
    elif position is not None:
        _check_position(loader, position, where)


def _what(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _optional_int(d: dict, key: str, where: str, least: int) -> Optional[int]:
    if d.get(key) is None:
        return None
    value = d[key]
    if not _is_int(value):
        raise TypeError(f"{where}['{key}'] must be an int or None, not {_what(value)}")
    if value < least:
        raise ValueError(f"{where}['{key}'] must be at least {least}, not {value}")
    return int(value)


def _int_field(d: dict, key: str, where: str, least: int, below: Optional[int] = None) -> int:
    if key not in d:
        raise ValueError(f"{where} has no '{key}'")
    value = d[key]
    if not _is_int(value):
        raise TypeError(f"{where}['{key}'] must be an int, not {_what(value)}")
    if value < least or (below is not None and value >= below):
        bound = f"in [{least}, {below})" if below is not None else f"at least {least}"
        raise ValueError(f"{where}['{key}'] must be {bound}, not {value}")
    return int(value)


def _check_holes(state: dict, position: Optional[int], where: str) -> None:
    if "holes" not in state:
        return
    holes = state["holes"]
    if not isinstance(holes, (list, tuple)):
        raise TypeError(f"{where}['holes'] must be a list of batch numbers, not {_what(holes)}")
    if position is None and holes:
        raise ValueError(f"{where}['holes'] names batches, but the state is between epochs")
    for hole in holes:
        if not _is_int(hole):
            raise TypeError(f"{where}['holes'] must hold ints, not {_what(hole)}")
        if not 0 <= hole < (position or 0):
            raise ValueError(
                f"{where}['holes'] must name batches below position={position}, not {hole}"
            )
    if len(set(holes)) != len(holes):
        raise ValueError(f"{where}['holes'] names a batch twice: {sorted(holes)}")


def _check_generators(loader, generators: Any, where: str) -> None:
    if not isinstance(generators, dict):
        raise TypeError(f"{where}['generators'] must be a dict, not {_what(generators)}")
    current = generators_of(loader)
    for role, blob in generators.items():
        if role not in _ROLES:
            raise ValueError(
                f"{where}['generators'] has a generator {role!r}: only 'loader' and 'sampler'"
            )
        gen = current.get(role, loader.generator)
        expected = (gen if gen is not None else torch.default_generator).get_state().numel()
        _check_packed(blob, expected, f"{where}['generators'][{role!r}]")


def _check_packed(blob: Any, expected: int, where: str) -> None:
    """A generator state as ``format.pack`` writes it: a tag byte, then zlib data that
    inflates to exactly the generator's state (inflated no further than that, whatever the
    blob claims)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise TypeError(f"{where} must be bytes from state_dict(), not {_what(blob)}")
    if blob[:1] not in (b"\0", b"\1"):
        raise ValueError(f"{where} is not a generator state saved by state_dict()")
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(bytes(blob[1:]), expected + 1)
    except zlib.error as err:
        raise ValueError(f"{where} is corrupt ({err})") from None
    if len(data) != expected or not inflate.eof or inflate.unconsumed_tail:
        raise ValueError(
            f"{where} is not the state of this loader's generator ({expected} bytes): it is "
            "truncated, corrupt or another kind of generator's"
        )


def _check_sampler(loader, sampler: Any, where: str) -> None:
    if sampler is None:
        return
    if not isinstance(sampler, dict):
        raise TypeError(f"{where}['sampler'] must be a dict or None, not {_what(sampler)}")
    if "state_dict" in sampler and not callable(
        getattr(drawing_sampler(loader), "load_state_dict", None)
    ):
        raise ValueError(
            f"{where}['sampler'] holds a sampler's state_dict(), and this loader's sampler has "
            "no load_state_dict(): the state is another loader's"
        )
    if "distributed" not in sampler:
        return
    info = sampler["distributed"]
    here = f"{where}['sampler']['distributed']"
    if not isinstance(info, dict):
        raise TypeError(f"{here} must be a dict, not {_what(info)}")
    if info.get("order", "rloader") not in ("rloader", "torch"):
        raise ValueError(f"{here}['order'] must be 'rloader' or 'torch', not {info['order']!r}")
    replicas = _int_field(info, "num_replicas", here, least=1)
    _int_field(info, "rank", here, least=0, below=replicas)
    _int_field(info, "epoch", here, least=-(2**63), below=2**64)
    _int_field(info, "seed", here, least=-(2**63), below=2**64)
    _int_field(info, "length", here, least=0)
    for flag in ("shuffle", "drop_last"):
        if not isinstance(info.get(flag), bool):
            raise TypeError(f"{here}['{flag}'] must be True or False, not {_what(info.get(flag))}")


def _a_dict(value: Any, here: str) -> bool:
    """Whether an optional dict field is there (None: it is not); a TypeError if not a dict."""
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"{here} must be a dict or None, not {_what(value)}")
    return value is not None


def _check_workers(workers: Any, where: str) -> None:
    here = f"{where}['workers']"
    if not _a_dict(workers, here):
        return
    n = _int_field(workers, "num_workers", here, least=1)
    _int_field(workers, "next_worker", here, least=0, below=n)
    if workers.get("kind", "process") not in ("process", "thread"):
        raise ValueError(
            f"{here}['kind'] must be 'process' or 'thread', not {_what(workers.get('kind'))}"
        )
    for key in ("states", "ended"):
        value = workers.get(key)
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise ValueError(f"{here}['{key}'] must be a list of {n} (one per worker)")
    if not all(isinstance(e, bool) for e in workers["ended"]):
        raise TypeError(f"{here}['ended'] must hold True or False")


MAX_READERS = 1024  # workers a state may ask for (a hostile one: a fork bomb)


def _check_readers(readers: Any, workers: Any, where: str) -> None:
    """Who read an IterableDataset's saved epoch (or reads the next): ``[num_workers, kind]``,
    the workers whose places ``workers`` holds, if it does."""
    if readers is None:
        return
    ok = (
        isinstance(readers, (list, tuple))
        and len(readers) == 2
        and _is_int(readers[0])
        and 0 <= readers[0] <= MAX_READERS
        and readers[1] in (("main",) if readers[0] == 0 else ("process", "thread"))
    )
    if not ok:
        raise ValueError(
            f"{where}['readers'] must be [0, 'main'] or [num_workers, 'process' or 'thread'] "
            f"with num_workers at most {MAX_READERS}, not {_what(readers)}"
        )
    kind = workers.get("kind", "process") if workers is not None else None
    if workers is not None and list(readers) != [workers["num_workers"], kind]:
        whose = "worker processes" if kind == "process" else "worker threads"
        raise ValueError(
            f"{where}['readers'] is {list(readers)!r}, but {where}['workers'] holds the places "
            f"of {workers['num_workers']} {whose}: the state is corrupt"
        )


def _check_auto(auto: Any, where: str) -> None:
    """What an auto loader had chosen: ``workers``, ``kind``, ``wanted``, ``prefetch``."""
    here = f"{where}['auto']"
    if not _a_dict(auto, here):
        return
    _int_field(auto, "workers", here, least=0, below=MAX_READERS + 1)
    for key, least, below in (("wanted", 0, MAX_READERS + 1), ("prefetch", 1, 1 << 10)):
        if auto.get(key) is not None:
            _int_field(auto, key, here, least=least, below=below)
        elif key not in auto:
            raise ValueError(f"{here} has no '{key}': it is not whole")
    if auto.get("kind", "") not in (None, "process", "thread"):
        raise ValueError(
            f"{here}['kind'] must be 'process', 'thread' or None, not {_what(auto.get('kind'))}"
        )
    trial = auto.get("trial")
    if trial is not None and not (
        isinstance(trial, (list, tuple))
        and len(trial) == 2
        and _is_int(trial[0])
        and 1 <= trial[0] <= MAX_READERS
        and isinstance(trial[1], (int, float))
        and not isinstance(trial[1], bool)
        and 0 <= trial[1] < float("inf")
    ):
        raise ValueError(
            f"{here}['trial'] must be None or [threads, seconds a batch], not {_what(trial)}"
        )
    if not isinstance(auto.get("tried", False), bool):
        raise TypeError(f"{here}['tried'] must be True or False, not {_what(auto['tried'])}")


def _check_elastic(loader, state: dict, where: str) -> None:
    saved = state["elastic_from"]
    if not isinstance(saved, (list, tuple)):
        raise TypeError(f"{where}['elastic_from'] must be a list of states, not {_what(saved)}")
    _check_job(loader, saved, f"{where}['elastic_from']")
    world = state.get("world")
    if (
        not isinstance(world, (list, tuple))
        or len(world) != 2
        or not all(_is_int(x) for x in world)
        or not 0 <= world[1] < world[0]
    ):
        raise ValueError(f"{where}['world'] must be [num_replicas, rank], not {world!r}")
    if state.get("position") is None:
        raise ValueError(f"{where} was saved mid-epoch (elastic_from) but has no position")


def _check_job(loader, states, where: str) -> None:
    """The states of every rank of a saved job (an elastic resume): one per rank."""
    for rank, one in enumerate(states):
        _check_one(loader, one, f"{where}[{rank}]", elastic_rank=True)
        info = (one.get("sampler") or {}).get("distributed")
        if info is not None and info["num_replicas"] != len(states):
            raise ValueError(
                f"{where}[{rank}] is a state of a job of {info['num_replicas']} ranks, but "
                f"{len(states)} states were given: give every rank's state, one per rank"
            )


def _check_rank_position(state: dict, position: int, where: str) -> None:
    """One old rank's state in an elastic resume: its position is within its share."""
    info = (state.get("sampler") or {}).get("distributed")
    if info is None:
        return  # refused as not a DistributedSampler's by the resume itself
    batch_size = state.get("batch_size") or 1
    share = -(-info["length"] // info["num_replicas"])
    if position > -(-share // batch_size):
        raise ValueError(
            f"{where}['position'] is batch {position}, past the end of that rank's share of "
            f"{share} samples in batches of {batch_size}"
        )


def _check_position(loader, position: int, where: str) -> None:
    """A position past the end of a sized epoch is no place in it (and skipping to it would
    draw keys for as long as the sampler gives them). An IterableDataset's length is the
    user's estimate (torch warns past it), so its streams are not held to it."""
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return
    try:
        batches = len(loader)
    except TypeError:
        return  # an epoch of unknown length: its end is where the stream ends
    if position > batches:
        raise ValueError(
            f"{where}['position'] is batch {position}, but an epoch of this loader has "
            f"{batches} batches: the state is another loader's, or corrupt"
        )
