"""``DataLoader.state_dict()`` and ``load_state_dict()`` (NOTE [Resume] in __init__.py)."""

from __future__ import annotations

import torch.utils.data as tud

from .. import _auto
from .._loader_record import record_of
from . import reshard
from .epoch import skip_handed
from .format import FORMAT, drawing_sampler, generators_of, pack, sampler_state
from .readers import check_workers, is_auto, keeps_main_copy, planned_readers


def state_dict(loader) -> dict:
    record = record_of(loader)
    pending = record.pending
    if pending is not None:  # loaded, not yet iterated: the same position
        return {k: v for k, v in pending.items() if k != "elastic"}
    state = dict(
        format=FORMAT,
        position=None,
        sampler=None,
        in_order=bool(loader.in_order),
        batch_size=loader.batch_size,
    )
    if is_auto(loader):
        state["auto"] = _auto.learned_state(loader)  # what it chose: a resume starts there
    epoch = record.epoch
    progress = epoch.progress() if epoch is not None else None
    if progress is not None and not progress["finished"]:
        position = int(progress["position"])
        if progress["holes"]:  # out of order: batches below `position` not handed out yet
            state["holes"] = [int(h) for h in progress["holes"]]
        if epoch.elastic_from is not None:
            world = drawing_sampler(loader)
            return dict(
                state,
                position=position,
                generators={},
                elastic_from=epoch.elastic_from,
                world=[int(world.num_replicas), int(world.rank)],
            )
        state = dict(
            state,
            position=position,
            generators=dict(epoch.generators),
            sampler=epoch.sampler,
            pulled=position > 0 or epoch.pulls_in_iter,
            base_drawn=epoch.base_drawn,
            # (for a resume after every batch was handed out: NOTE [Epoch's end])
            next_draws_base=_next_draws_base(loader),
        )
        if epoch.iterable:
            state["readers"] = list(epoch.readers)
        if keeps_main_copy(loader, epoch.readers):
            state["dataset"] = loader.dataset.state_dict()
            # Its iterator may have ended with a short last batch: nothing more comes then.
            state["dataset_ended"] = bool(progress["exhausted"]) and epoch.readers[0] == 0
        if progress["workers"] is not None:
            state["workers"] = progress["workers"]
        return state
    state["generators"] = {role: pack(gen) for role, gen in generators_of(loader).items()}
    state["sampler"] = sampler_state(drawing_sampler(loader))
    readers = planned_readers(loader, None)  # the next epoch's
    if progress is not None and progress["workers"] is not None and loader.persistent_workers:
        # An epoch ended: where persistent workers are, if the next epoch goes on with them
        # (an auto loader's next epoch may start another pool, whose workers start fresh).
        if not is_auto(loader) or loader._iterator._keeps_pool(*readers):
            state["workers"] = progress["workers"]
    if isinstance(loader.dataset, tud.IterableDataset):
        state["readers"] = list(readers)
    if keeps_main_copy(loader, readers):
        state["dataset"] = loader.dataset.state_dict()  # where the next epoch starts from
    state["next_draws_base"] = _next_draws_base(loader)
    return state


def _next_draws_base(loader) -> bool:
    """Whether this loader's next iter() draws a base seed: persistent workers' next epoch
    does not, a fresh pool's does (Epoch.begin)."""
    it = loader._iterator
    return not (
        loader.persistent_workers
        and loader.num_workers > 0
        and it is not None
        and not it._rloader_pool.stopped
    )


def load_state_dict(loader, state) -> None:
    if isinstance(state, (list, tuple)):
        record_of(loader).pending = _elastic_plan(loader, list(state), 0)
        return
    if isinstance(state, dict) and state.get("elastic_from") is not None:
        # Saved during an epoch resumed from another world size: that epoch again, from here,
        # on the same new world.
        reshard.check_rank(drawing_sampler(loader), *state["world"])
        plan = _elastic_plan(
            loader, list(state["elastic_from"]), state["position"], list(state.get("holes", ()))
        )
        record_of(loader).pending = plan
        return
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            "load_state_dict() expects what rloader.DataLoader.state_dict() returned (a dict "
            f"with format={FORMAT!r}), or a list of them, one per rank of the saved job"
        )
    distributed = (state.get("sampler") or {}).get("distributed")
    if state["position"] is not None and distributed is not None:
        reshard.check_rank(
            drawing_sampler(loader), distributed["num_replicas"], distributed["rank"]
        )
    check_workers(loader, state)
    if is_auto(loader):
        _auto.seed_learned(loader, state.get("auto"))
    record_of(loader).pending = dict(state)


def _elastic_plan(loader, states: list, position: int, holes: list = ()) -> dict:
    """The pending resume of an epoch saved on another world size (``reshard``): this rank's
    share of what no old rank handed out, less its batches below ``position`` but ``holes``
    (those handed out on this world, when the resumed epoch was saved again)."""
    sampler = drawing_sampler(loader)
    share = reshard.remaining_share(sampler, states)
    # Between epochs on the old world, or every old rank at its epoch's end (no new rank has
    # anything left: NOTE [Epoch's end]): the new world starts its next epoch.
    if share is None or not share[0]:
        return dict(format=FORMAT, position=None, sampler=None, generators={})
    mine, epoch = share
    # (the plan waits beside the loader, in its record: it must not hold the loader itself)
    batch_size, drop_last = loader.batch_size, loader.drop_last

    def keys(_ignored):
        batches = tud.BatchSampler(mine, batch_size, drop_last) if batch_size is not None else mine
        return skip_handed(batches, position, holes)

    sampler.epoch = epoch
    return dict(
        format=FORMAT,
        position=position,
        holes=list(holes),
        sampler=None,
        generators={},
        elastic=keys,
        elastic_from=states,
    )
