"""Recycled batch memory of the single-process loop (NOTE [Batch memory] in
rust/rloader-memory/src/lib.rs): a batch's memory is reused once the user drops it,
never while they keep it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _datasets import PoolTensors, PoolViews

import rloader
from rloader._loader_record import record_of


def expected(ds: PoolViews, idx: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(ds.pool[(idx % 32).numpy()])


# Large batches of numpy arrays, and of tensors small and large (PoolTensors).
SAMPLES = pytest.mark.parametrize(
    "make",
    [
        PoolViews,
        PoolTensors,
        lambda n: PoolTensors(n, (3, 160, 160), np.uint8),
        lambda n: PoolTensors(n, (3, 64, 64)),
    ],
    ids=["arrays", "small-tensors", "large-tensors", "3MiB-tensors"],
)


# The single-process loop and thread workers (worker processes' batches are in shared memory).
@pytest.mark.parametrize("engine", ["main", "thread"], indirect=True)
@SAMPLES
def test_kept_batches_are_never_overwritten(engine, make):
    ds = make(640)
    loader = rloader.DataLoader(ds, batch_size=64, shuffle=True, **engine.kwargs(3))
    for _ in range(2):  # the second epoch reuses the first's blocks
        kept = list(loader)
        for images, idx in kept:
            assert torch.equal(images, expected(ds, idx))
        del kept


@SAMPLES
def test_dropped_batches_memory_is_reused(make):
    ds = make(640)
    loader = rloader.DataLoader(ds, batch_size=64, shuffle=False, num_workers=0)
    pointers = set()
    for images, idx in loader:
        pointers.add(images.data_ptr())
        assert torch.equal(images, expected(ds, idx))
        del images, idx
    # At most the batch being made and the one the loop variable still held.
    assert len(pointers) <= 2
    buffers = record_of(loader).buffers
    assert 1 <= buffers.free_blocks <= 4


@SAMPLES
def test_a_pooled_batch_behaves_like_torch_empty(make):
    ds = make(64)
    (images, _), (theirs, _) = (
        next(iter(lib.DataLoader(ds, batch_size=64, num_workers=0)))
        for lib in (rloader, torch.utils.data)
    )
    assert images._version == theirs._version == 0
    assert images._base is None and theirs._base is None
    assert images.stride() == theirs.stride() and images.is_contiguous()
    assert images.untyped_storage().nbytes() == theirs.untyped_storage().nbytes()
    assert torch.equal(images, theirs)
    images.add_(1)  # writable
    clone = images.clone()
    del images
    gc.collect()
    assert clone.sum() > 0  # a copy outlives the batch's block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc tunables")
@pytest.mark.parametrize(
    "dataset, item_bytes",
    [("PoolViews(64 * 50)", 3 * 64 * 64), ("PoolTensors(64 * 50, (3, 64, 64))", 4 * 3 * 64 * 64)],
    ids=["768KiB-arrays", "3MiB-tensors"],
)
def test_no_page_faults_per_batch_after_the_first_epoch(dataset, item_bytes):
    # glibc with a fixed mmap threshold serves every batch from a fresh mapping and unmaps it
    # when freed: memory from torch's allocator would fault all of its pages in for every batch
    # (as glibc's dynamic threshold may too, trimming its heap). Recycled blocks fault in during
    # the first epoch only.
    script = textwrap.dedent(
        """
        import resource, sys
        sys.path[:0] = sys.argv[1:]
        import rloader
        from _datasets import PoolTensors, PoolViews

        loader = rloader.DataLoader(DATASET, batch_size=64, shuffle=True)
        def epoch():
            for images, _ in loader:
                images.view(-1)[::4096].sum()  # one byte per page, as a model reads it all
        epoch()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        epoch()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        """
    ).replace("DATASET", dataset)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(128 * 1024))
    path = [os.path.dirname(__file__), os.path.dirname(os.path.dirname(rloader.__file__))]
    out = subprocess.run(
        [sys.executable, "-c", script, *path],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    faults = int(out.stdout.strip().splitlines()[-1])
    pages_per_epoch = 50 * 64 * item_bytes // 4096
    # The interpreter's own work faults a few pages; a fresh batch would fault all of its own.
    assert faults < pages_per_epoch // 10, (faults, pages_per_epoch)


@SAMPLES
def test_thread_workers_reuse_dropped_batches_memory(make):
    # Batches in flight (prefetch_factor x num_workers) hold blocks of their own; a dropped
    # batch's block serves a later batch.
    ds = make(64 * 40)
    loader = rloader.DataLoader(ds, batch_size=64, num_workers=2, worker_type="thread")
    pointers = set()
    for images, idx in loader:
        pointers.add(images.data_ptr())
        assert torch.equal(images, expected(ds, idx))
        del images, idx
    assert len(pointers) < 40
    # The blocks came from the loader's pool, and went back to it.
    assert 1 <= record_of(loader).buffers.free_blocks <= 4
