"""rloader.integrations.accelerate: Accelerator.prepare() keeps rloader's engine, with the
batches torch's prepared loader gives (one process here; two processes under torchrun below)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
from _datasets import ListIndexedRows, Pairs

pytest.importorskip("accelerate")

import accelerate.accelerator  # noqa: E402
import accelerate.data_loader  # noqa: E402
import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402
from _children import short_scratch_dir  # noqa: E402
from _datasets import ShardedDicts
from accelerate import Accelerator, DataLoaderConfiguration  # noqa: E402

import rloader  # noqa: E402
from rloader.integrations import accelerate as integration  # noqa: E402

from _compare import same  # noqa: E402

pytestmark = pytest.mark.timeout(240)

WORKERS = [0, 2]


@pytest.fixture
def installed():
    integration.install()
    yield
    integration.uninstall()


@pytest.fixture(scope="module")
def acc():
    return Accelerator(cpu=True)


def dispatching():
    return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))


def epochs(loader, n=2):
    return [list(loader) for _ in range(n)]


def is_ours(loader) -> bool:
    """The loader's engine is rloader's (isinstance answers as torch's, so look at the type)."""
    return type(loader) is rloader.DataLoader


def base_of(prepared):
    assert type(prepared) in (
        accelerate.data_loader.DataLoaderShard,
        accelerate.data_loader.DataLoaderDispatcher,
    )
    return prepared.base_dataloader


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
        dict(batch_size=5, drop_last=True),
        dict(batch_sampler=[[3, 1], [0], [5, 6, 7]]),
    ],
    ids=["batch_size", "drop_last", "batch_sampler"],
)
def test_same_batches_as_torch_prepared(acc, installed, num_workers, kwargs):
    theirs = acc.prepare(tud.DataLoader(Pairs(), num_workers=num_workers, **kwargs))
    ours = acc.prepare(rloader.DataLoader(Pairs(), num_workers=num_workers, **kwargs))
    assert is_ours(base_of(ours))
    assert ours.__class__ is rloader.DataLoader  # the adapter answers as its base loader
    assert same(epochs(ours), epochs(theirs))
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_shuffled_by_the_same_torch_sampler_as_torch_prepared(acc, installed, num_workers):
    def loader(lib):
        sampler = tud.RandomSampler(range(37), generator=torch.Generator().manual_seed(3))
        return lib.DataLoader(Pairs(), batch_size=4, sampler=sampler, num_workers=num_workers)

    theirs, ours = acc.prepare(loader(tud)), acc.prepare(loader(rloader))
    assert is_ours(base_of(ours))
    got = epochs(ours)
    assert same(got, epochs(theirs))
    assert not same(got[0], got[1])  # the sampler's generator moves on between epochs


@pytest.mark.parametrize("num_workers", WORKERS)
def test_shuffled_like_the_same_rloader_loader_unprepared(acc, installed, num_workers):
    def loader():
        return rloader.DataLoader(
            Pairs(),
            batch_size=4,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(5),
        )

    ours = acc.prepare(loader())
    assert is_ours(base_of(ours))
    assert same(epochs(ours), epochs(loader()))


@pytest.mark.parametrize(
    "kwargs",
    [
        lambda: dict(batch_size=4),
        lambda: dict(batch_size=4, drop_last=True),
        lambda: dict(batch_sampler=tud.BatchSampler(range(37), 6, False)),
        lambda: dict(
            batch_size=4,
            sampler=rloader.RandomSampler(range(37), generator=torch.Generator().manual_seed(9)),
        ),
    ],
    ids=["batch_size", "drop_last", "batch_sampler", "sampler"],
)
@pytest.mark.parametrize("split_batches", [False, True])
@pytest.mark.parametrize("even_batches", [True, False])
def test_each_shard_as_torch_prepared(installed, kwargs, split_batches, even_batches):
    # prepare_data_loader shards for the process it is told it is, without a process group.
    for rank in range(2):
        theirs, ours = (
            accelerate.data_loader.prepare_data_loader(
                lib.DataLoader(Pairs(), **kwargs()),
                num_processes=2,
                process_index=rank,
                split_batches=split_batches,
                even_batches=even_batches,
            )
            for lib in (tud, rloader)
        )
        assert is_ours(base_of(ours))
        assert type(base_of(theirs)) is tud.DataLoader
        assert same(list(ours), list(theirs))


def test_batch_sampler_as_sampler_shard_as_torch_prepared(installed):
    for rank in range(2):
        theirs, ours = (
            accelerate.data_loader.prepare_data_loader(
                lib.DataLoader(
                    ListIndexedRows(),
                    sampler=tud.BatchSampler(range(37), 4, False),
                    batch_size=None,
                ),
                num_processes=2,
                process_index=rank,
            )
            for lib in (tud, rloader)
        )
        assert is_ours(base_of(ours))
        got = list(ours)
        assert same(got, list(theirs))
        assert len(got) == 5


def test_persistent_workers_across_epochs(acc, installed):
    def loader(lib):
        return lib.DataLoader(Pairs(), batch_size=4, num_workers=2, persistent_workers=True)

    theirs, ours = acc.prepare(loader(tud)), acc.prepare(loader(rloader))
    assert is_ours(base_of(ours))
    assert same(epochs(ours, 3), epochs(theirs, 3))


@pytest.mark.parametrize("num_workers", WORKERS)
def test_dispatched_batches_as_torch_dispatched(installed, num_workers):
    dispatcher = dispatching()
    for dataset, kwargs in [(Pairs(), dict(batch_size=4)), (ShardedDicts(), dict(batch_size=3))]:
        theirs = dispatcher.prepare(tud.DataLoader(dataset, num_workers=num_workers, **kwargs))
        ours = dispatcher.prepare(rloader.DataLoader(dataset, num_workers=num_workers, **kwargs))
        assert type(ours) is accelerate.data_loader.DataLoaderDispatcher
        assert is_ours(base_of(ours))
        assert same(epochs(ours), epochs(theirs))


def test_iterable_dataset_is_dispatched_by_default(acc, installed):
    ours = acc.prepare(rloader.DataLoader(ShardedDicts(), batch_size=3, num_workers=2))
    assert type(ours) is accelerate.data_loader.DataLoaderDispatcher
    assert is_ours(base_of(ours))
    theirs = acc.prepare(tud.DataLoader(ShardedDicts(), batch_size=3, num_workers=2))
    assert same(epochs(ours), epochs(theirs))


def test_arguments_reach_the_rebuilt_loader(acc, installed):
    def init(worker_id):
        pass

    def collate(batch):
        return [x["i"] for x in batch]

    generator = torch.Generator().manual_seed(1)
    original = rloader.DataLoader(
        Pairs(),
        batch_size=4,
        num_workers=2,
        collate_fn=collate,
        timeout=30,
        worker_init_fn=init,
        multiprocessing_context="spawn",
        generator=generator,
        prefetch_factor=3,
        persistent_workers=True,
        in_order=False,
    )
    base = base_of(acc.prepare(original))
    assert is_ours(base)
    for name in (
        "dataset",
        "num_workers",
        "collate_fn",
        "pin_memory",
        "timeout",
        "worker_init_fn",
        "multiprocessing_context",
        "generator",
        "prefetch_factor",
        "persistent_workers",
        "pin_memory_device",
        "in_order",
    ):
        assert getattr(base, name) == getattr(original, name), name
    assert base.batch_sampler is original.batch_sampler  # one process: accelerate keeps it


def test_thread_workers_stay_thread_workers(acc, installed):
    original = rloader.DataLoader(Pairs(), batch_size=4, num_workers=2, worker_type="thread")
    prepared = acc.prepare(original)
    base = base_of(prepared)
    assert is_ours(base) and base.worker_type == "thread"
    it = iter(base)
    assert type(it) is rloader._rloader.ThreadIter
    del it
    torch_prepared = acc.prepare(tud.DataLoader(Pairs(), batch_size=4, num_workers=2))
    assert [b["i"].tolist() for b in prepared] == [b["i"].tolist() for b in torch_prepared]


def test_torch_loaders_are_left_to_accelerate(acc, installed):
    for kwargs in (dict(batch_size=4), dict(batch_size=4, num_workers=2)):
        prepared = acc.prepare(tud.DataLoader(Pairs(), **kwargs))
        assert type(base_of(prepared)) is tud.DataLoader
    prepared = dispatching().prepare(tud.DataLoader(ShardedDicts(), batch_size=3))
    assert type(base_of(prepared)) is tud.DataLoader


def test_skip_first_batches_keeps_the_engine(acc, installed):
    def skipped(lib):
        prepared = acc.prepare(lib.DataLoader(Pairs(), batch_size=4, num_workers=2))
        return acc.skip_first_batches(prepared, 2)

    theirs, ours = skipped(tud), skipped(rloader)
    assert is_ours(base_of(ours))
    assert same(list(ours), list(theirs))
    assert len(list(ours)) == 10 - 2
    # over a loader that was never prepared, accelerate returns a plain DataLoader
    plain = accelerate.skip_first_batches(rloader.DataLoader(Pairs(), batch_size=4), 3)
    assert is_ours(plain)
    assert same(list(plain), list(tud.DataLoader(Pairs(), batch_size=4))[3:])
    theirs = accelerate.skip_first_batches(tud.DataLoader(Pairs(), batch_size=4), 3)
    assert type(theirs) is tud.DataLoader


def test_install_is_idempotent_and_uninstall_restores_accelerate(acc):
    original = accelerate.data_loader.prepare_data_loader
    assert not integration.is_installed()
    integration.install()
    integration.install()
    try:
        assert integration.is_installed()
        wrapped = accelerate.data_loader.prepare_data_loader
        assert wrapped is not original
        assert wrapped._rloader_original is original  # wrapped once
        assert accelerate.accelerator.prepare_data_loader is wrapped  # the name Accelerator calls
        skip = accelerate.data_loader.skip_first_batches
        assert skip._rloader_original is not None
        assert accelerate.accelerator.skip_first_batches is accelerate.skip_first_batches is skip
        prepared = acc.prepare(rloader.DataLoader(Pairs(), batch_size=4))
    finally:
        integration.uninstall()
        integration.uninstall()
    assert not integration.is_installed()
    assert accelerate.data_loader.prepare_data_loader is original
    assert accelerate.accelerator.prepare_data_loader is original
    assert accelerate.skip_first_batches is accelerate.data_loader.skip_first_batches
    assert not hasattr(accelerate.data_loader.skip_first_batches, "_rloader_original")
    assert is_ours(base_of(prepared))  # prepared while installed: it keeps its base
    # Without install(), accelerate rebuilds the loader as torch's (the issue this fixes).
    assert type(base_of(acc.prepare(rloader.DataLoader(Pairs(), batch_size=4)))) is tud.DataLoader


def test_stateful_dataloader_is_left_to_torchdata(acc, installed):
    pytest.importorskip("torchdata.stateful_dataloader")
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    stateful = Accelerator(cpu=True, dataloader_config=config)
    with pytest.warns(UserWarning, match="StatefulDataLoader"):
        ours = stateful.prepare(rloader.DataLoader(Pairs(), batch_size=4))
    assert not is_ours(base_of(ours))
    assert same(list(ours), list(tud.DataLoader(Pairs(), batch_size=4)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stateful.prepare(tud.DataLoader(Pairs(), batch_size=4))
    assert not [w for w in caught if "rloader" in str(w.message)]  # torch loaders: no warning


def test_two_processes_under_torchrun(tmp_path, request):
    worker = os.path.join(os.path.dirname(__file__), "_accelerate_worker.py")
    # torchrun leaves a torchelastic_* folder in the temp dir: a scratch one, removed after.
    scratch = short_scratch_dir(request)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", TMPDIR=scratch)
    log = tmp_path / "torchrun.log"  # a file, not a pipe: nothing left running can block reading
    with open(log, "w") as out:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                worker,
                str(tmp_path),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            run.wait(timeout=200)
        except subprocess.TimeoutExpired:
            run.terminate()  # torchrun stops its workers on SIGTERM (each also has an alarm)
            try:
                run.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
            pytest.fail(f"torchrun did not finish in 200 s:\n{log.read_text()}")
    assert run.returncode == 0, log.read_text()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    names = ranks[0]["cases"].keys()
    assert len(names) == 6
    for name in names:
        cases = [r["cases"][name] for r in ranks]
        for case in cases:
            assert case["same"], name  # this process's batches are torch's prepared loader's
            assert case["base"] == "rloader.dataloader.DataLoader", name
            assert case["torch_base"] == "torch.utils.data.dataloader.DataLoader", name
            assert case["wrapper"] == case["torch_wrapper"], name
        expected = "DataLoaderDispatcher" if "dispatch" in name else "DataLoaderShard"
        assert cases[0]["wrapper"] == expected, name
        # The processes share the data: 103 samples, 4 per batch each, padded from the start.
        for epoch in range(2):
            seen = [[i for batch in case["batches"][epoch] for i in batch[1]] for case in cases]
            assert len(seen[0]) == len(seen[1]) == 52, name
            assert set(seen[0]) | set(seen[1]) == set(range(103)), name
            assert len(set(seen[0]) & set(seen[1])) <= 1, name
    for name in (
        "rloader's RandomSampler, 2 workers",
        "split_batches, seedable sampler, shuffle, 0 workers",
    ):
        shuffled = ranks[0]["cases"][name]["batches"]
        assert shuffled[0] != shuffled[1], name  # a new order each epoch
