"""PyTorch Lightning rebuilds a loader around a DistributedSampler (``_update_dataloader``, used
by ``Trainer`` and ``Fabric`` with any distributed strategy): an rloader loader comes out of
it as torch's does, and is still rloader's. Its ``Trainer`` saves and restores the loader's
state with its checkpoints: a resumed fit is the uninterrupted one."""

import pytest
import torch
import torch.utils.data as tud
from _datasets import Augmenting, SeedOfReader, ShardedStream
from torch.utils.data.distributed import DistributedSampler

import rloader
from rloader import _rloader

data_utils = pytest.importorskip("lightning.fabric.utilities.data")
pl = pytest.importorskip("lightning.pytorch")

pytestmark = [
    # Lightning's own notices: a resumed fit that checkpoints elsewhere, and its pytree helper
    # on the newest torch.
    pytest.mark.filterwarnings("ignore:The dirpath has changed:UserWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning"),
]

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


# ---------------------------------------------------------------- resuming a Trainer


def as_rows(batch):
    return batch.tolist() if isinstance(batch, torch.Tensor) else [t.tolist() for t in batch]


class Recorder(pl.LightningModule):
    """Trains on nothing: records each batch with its epoch."""

    def __init__(self, make_loader):
        super().__init__()
        self.make_loader = make_loader
        self.layer = torch.nn.Linear(1, 1)
        self.seen = []

    def train_dataloader(self):
        return self.make_loader()

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, as_rows(batch)))
        return self.layer.weight.sum() * 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(make_loader, root, checkpoint_every=None, ckpt_path=None, limit=None):
    """A 3-epoch fit: the batches it trained on, and its last global_step. With
    ``checkpoint_every``, a ModelCheckpoint saves every that many steps; ``limit``: its
    ``limit_train_batches``."""
    callbacks = []
    if checkpoint_every is not None:
        every = pl.callbacks.ModelCheckpoint(
            dirpath=root, every_n_train_steps=checkpoint_every, save_top_k=-1
        )
        callbacks.append(every)
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        default_root_dir=root,
        limit_train_batches=limit,
    )
    module = Recorder(make_loader)
    trainer.fit(module, ckpt_path=ckpt_path)
    return module.seen, trainer.global_step


def loader_of(dataset_kind, kwargs):
    """A loader shuffled by its generator (8 batches an epoch), over a DistributedSampler (rank
    1 of 2, 8 batches; the workers' seeds in its samples), or over a stateful stream without a
    length (its batches: as many as its readers' shards make)."""
    if dataset_kind == "shuffled":
        generator = torch.Generator().manual_seed(1)
        return rloader.DataLoader(
            list(range(32)), batch_size=4, shuffle=True, generator=generator, **kwargs
        )
    if dataset_kind == "distributed":
        dataset = SeedOfReader(64)
        sampler = DistributedSampler(dataset, num_replicas=2, rank=1, seed=3)
        generator = torch.Generator().manual_seed(2)
        return rloader.DataLoader(
            dataset, batch_size=4, sampler=sampler, generator=generator, **kwargs
        )
    return rloader.DataLoader(ShardedStream(32), batch_size=4, **kwargs)


def resumed_at_the_last_batch(tmp_path, dataset_kind, kwargs):
    """The uninterrupted fit, checkpointed after each epoch's last batch, and a fit resumed from
    the first checkpoint: what each trained on, by epoch, and the resumed one's global_step
    against the uninterrupted one's."""

    def make():
        return loader_of(dataset_kind, kwargs)

    loader = make()
    every = sum(1 for _ in loader)  # an epoch's batches
    full, steps = fit(make, tmp_path, checkpoint_every=every)
    assert steps == 3 * every
    checkpoint = str(tmp_path / f"epoch=0-step={every}.ckpt")
    resumed, resumed_steps = fit(
        make, tmp_path / "resumed", checkpoint_every=every, ckpt_path=checkpoint
    )
    return full, resumed, (resumed_steps, steps)


@pytest.mark.parametrize("dataset_kind", ["shuffled", "distributed", "stream"])
def test_a_fit_resumed_at_an_epochs_last_batch_is_the_uninterrupted_fit(
    tmp_path, engine, dataset_kind
):
    # Lightning counts the epoch as done and goes on with the next: so must the loader (it
    # once resumed into what was left of the epoch, nothing, and the fit lost an epoch).
    full, resumed, (steps, expected) = resumed_at_the_last_batch(
        tmp_path, dataset_kind, engine.kwargs()
    )
    assert steps == expected
    assert resumed == [(epoch, batch) for epoch, batch in full if epoch > 0]
    if dataset_kind != "stream":  # each epoch its own order
        assert full[:8] != full[8:16]


@pytest.mark.parametrize("dataset_kind", ["shuffled", "distributed"])
def test_a_fit_resumed_at_an_epochs_last_batch_is_the_uninterrupted_fit_under_auto(
    tmp_path, dataset_kind
):
    full, resumed, (steps, expected) = resumed_at_the_last_batch(
        tmp_path, dataset_kind, dict(num_workers="auto")
    )
    assert steps == expected
    assert resumed == [(epoch, batch) for epoch, batch in full if epoch > 0]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_fit_with_limit_train_batches_resumes_its_persistent_workers_draws(tmp_path, worker_type):
    # limit_train_batches leaves every epoch early, while persistent workers had made more
    # batches: a fit resumed mid-epoch goes on from where each worker was, and its samples'
    # random draws are the uninterrupted fit's.
    def make():
        return rloader.DataLoader(
            Augmenting(48),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(1),
            num_workers=3,
            worker_type=worker_type,
            persistent_workers=True,
        )

    full, steps = fit(make, tmp_path, checkpoint_every=4, limit=3)
    assert steps == 9 and [epoch for epoch, _ in full] == [0] * 3 + [1] * 3 + [2] * 3
    checkpoint = str(tmp_path / "epoch=1-step=4.ckpt")
    resumed, resumed_steps = fit(
        make, tmp_path / "resumed", checkpoint_every=4, ckpt_path=checkpoint, limit=3
    )
    assert resumed_steps == steps
    assert resumed == full[4:]
