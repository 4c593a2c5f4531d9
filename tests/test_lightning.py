"""PyTorch Lightning rebuilds a loader around a DistributedSampler (``_update_dataloader``, used
by ``Trainer`` and ``Fabric`` with any distributed strategy): an rloader loader comes out of
it as torch's does, and is still rloader's."""

import pytest
import torch.utils.data as tud
from torch.utils.data.distributed import DistributedSampler

import rloader
from rloader import _rloader

data_utils = pytest.importorskip("lightning.fabric.utilities.data")

DATA = list(range(23))


def rebuilt(lib, rank, shuffle, **kwargs):
    loader = lib.DataLoader(DATA, batch_size=3, shuffle=True, drop_last=True, **kwargs)
    sampler = DistributedSampler(DATA, num_replicas=2, rank=rank, shuffle=shuffle, seed=7)
    return loader, data_utils._update_dataloader(loader, sampler)


def seen(loader):
    sampler = loader.sampler
    return dict(
        batch_size=loader.batch_size,
        drop_last=loader.drop_last,
        sampler=(type(sampler), sampler.num_replicas, sampler.rank, sampler.shuffle),
        batch_sampler=type(loader.batch_sampler),
        length=len(loader),
        batches=[b.tolist() for b in loader],
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("shuffle", [False, True])
def test_lightning_rebuilds_an_rloader_loader_as_it_rebuilds_torchs(num_workers, rank, shuffle):
    ours, ours_new = rebuilt(rloader, rank, shuffle, num_workers=num_workers)
    theirs, theirs_new = rebuilt(tud, rank, shuffle, num_workers=num_workers)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler) is tud.BatchSampler
    assert seen(ours_new) == seen(theirs_new)
    assert seen(ours_new)["batch_size"] == 3 and seen(ours_new)["drop_last"] is True
    # Still rloader's loader, with rloader's engine.
    assert type(ours_new) is rloader.DataLoader
    it = iter(ours_new)
    engine = _rloader.LoaderIter if num_workers == 0 else _rloader.PoolIter
    assert type(it) is engine


def test_lightning_rebuilds_thread_workers_as_thread_workers():
    ours, ours_new = rebuilt(rloader, 1, True, num_workers=2, worker_type="thread")
    theirs, theirs_new = rebuilt(tud, 1, True, num_workers=2)
    assert seen(ours_new) == seen(theirs_new)
    assert ours_new.worker_type == "thread"
    assert type(iter(ours_new)) is _rloader.ThreadIter


def test_lightning_rebuilds_an_auto_loader_as_an_auto_loader():
    ours, ours_new = rebuilt(rloader, 1, True, num_workers="auto", worker_type="auto")
    theirs, theirs_new = rebuilt(tud, 1, True, num_workers=2)
    assert seen(ours_new) == seen(theirs_new)
    assert isinstance(ours_new.num_workers, rloader._auto.AutoWorkers)
    assert ours_new.worker_type == "auto"
    assert type(iter(ours_new)) is rloader._auto.AutoIter
