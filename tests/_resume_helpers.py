"""What the resume tests share: a batch as lists, a loader's epochs, a state through a
checkpoint, and a run interrupted and resumed beside the uninterrupted one."""

import io

import torch


def as_lists(batch):
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


def epochs_of(loader, count):
    return [[as_lists(b) for b in loader] for _ in range(count)]


def checkpointed(state):
    """What a checkpoint gives back: torch.save, then torch.load with weights_only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def restarted(loader, make):
    """A new loader (``make()``) loaded from ``loader``'s state, as a restarted job would: the
    state and torch's global RNG go through a checkpoint, and the new process seeds its RNG
    its own way until the checkpoint is loaded. Drop ``loader``'s iterator after (its state
    is the iterator's progress)."""
    state, rng = checkpointed(loader.state_dict()), torch.get_rng_state()
    del loader
    torch.manual_seed(12345)
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    return resumed


def interrupted(make, save_workers, load_workers, epoch, batch, total, explicit):
    """Epochs of a run stopped at `batch` of `epoch` (None: after the epoch ended; "all": after
    its last batch, before StopIteration), saved, and continued by a new loader, as a restarted
    job would: from a state at an epoch's end the new loader's first iter() is the next epoch.
    With the global RNG, the checkpoint holds its state too, as a training loop's would."""
    g = torch.Generator().manual_seed(11) if explicit else None
    torch.manual_seed(3)
    loader = make(save_workers, g)
    seen = epochs_of(loader, epoch)
    it = iter(loader)
    current = []
    if batch is None:
        current = [as_lists(b) for b in it]
    else:
        current = [as_lists(next(it)) for _ in range(len(loader) if batch == "all" else batch)]
    g2 = torch.Generator().manual_seed(999) if explicit else None
    resumed = restarted(loader, lambda: make(load_workers, g2))
    del it, loader
    if batch is None or batch == "all":
        seen.append(current)
    else:
        seen.append(current + [as_lists(b) for b in resumed])
    return seen + epochs_of(resumed, total - len(seen))


def uninterrupted(make, workers, total, explicit):
    g = torch.Generator().manual_seed(11) if explicit else None
    torch.manual_seed(3)
    return epochs_of(make(workers, g), total)


# (epoch, batches taken before the save): "all" takes every batch without ending the epoch.
POINTS = {"start": (0, 0), "middle": (0, 4), "last batch": (1, "all"), "epoch end": (0, None)}
