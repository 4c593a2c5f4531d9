"""``len()`` of a loader over an IterableDataset, as torch reads it: once more batches than
it said are handed out, torch warns. What both kinds of worker pool hand their iterator."""

from __future__ import annotations


def reported_len(loader):
    """``(dataset, len(loader))`` when ``len()`` of a loader over an IterableDataset was asked:
    torch warns once more batches than that are handed out."""
    if loader._IterableDataset_len_called is None:
        return None
    return (loader.dataset, loader._IterableDataset_len_called)
