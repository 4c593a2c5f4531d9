"""What the resume tests share: a batch as lists, a loader's epochs, a state through a
checkpoint."""

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
