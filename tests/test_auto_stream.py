"""num_workers="auto" hands out a fixed loader's stream whatever its engines (NOTE [Auto
workers] in python/rloader/_auto/__init__.py): the batches, seeds, worker_init_fn, errors,
timeouts, resume and prefetch tuning, across switches between pools. Decisions are scripted
(``_auto_helpers.scripted``); fixed loaders are the oracle."""

import gc
import os
import pickle

import pytest
import torch.utils.data as tud
from _auto_helpers import (
    N,
    batches,
    chosen,
    loader_of,
    outcomes,
    scripted,
    tight_budget,
)
from _datasets import (
    Blocks,
    SquarePairs,
    record_init,
)
from _samplers import CountedDraws

import rloader
from rloader import _auto, _rloader
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy
from rloader._engines import dispatch
from rloader._engines.process import pool as process_pool
from rloader.sampler import iter_keys


def test_engines_draw_the_epochs_keys_in_shares():
    # Each engine draws through a share of the epoch's keys: a closed share draws nothing
    # more and the next goes on with the stream. An rloader sampler's shares are taken in Rust.
    sampler = loader_of(0, 1, batch_size=3, shuffle=False, n=10)._index_sampler
    for keys, kind in [(iter_keys(sampler), _rloader.KeySegment), (iter(list(sampler)), None)]:
        source = _auto.keys.Source(keys)
        first = source.segment()
        assert kind is None or isinstance(first, kind)
        assert next(first) == [0, 1, 2] and not source.exhausted
        first.close()
        assert first.closed and next(first, None) is None
        second = source.segment()
        assert list(second) == [[3, 4, 5], [6, 7, 8], [9]]
        assert source.exhausted and list(source.segment()) == []


@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_are_a_fixed_loaders_across_growth_and_shrinkage(
    quick, monkeypatch, worker_type, shuffle
):
    scripted(monkeypatch, [2, None, 3, 1, 2])

    def make(nw, **kw):
        return loader_of(nw, 7, batch_size=3, shuffle=shuffle, **kw)

    auto = make("auto", worker_type=worker_type)
    got = batches(auto, epochs=2)
    assert chosen(auto) != [0]  # pools were started (the second epoch starts on the last)
    assert got == batches(make(0), epochs=2)
    assert got == batches(make(2, worker_type=worker_type), epochs=2)
    if not shuffle:
        torch_batches = [[b.tolist() for b in tud.DataLoader(SquarePairs(), batch_size=3)]] * 2
        assert got == torch_batches


def test_first_epoch_switches_are_recorded(quick, monkeypatch):
    scripted(monkeypatch, [2, None, 3] + [1] * 40)  # (turning back waits for a longer window)
    loader = rloader.DataLoader(SquarePairs(400), batch_size=2, num_workers="auto")
    assert batches(loader) == batches(tud.DataLoader(SquarePairs(400), batch_size=2))
    assert chosen(loader) == [0, 2, 3, 1]
    stats = loader.stats()
    assert stats["batches"] == 200
    assert stats["auto"]["num_workers"] == 1
    first = stats["auto"]["decisions"][1]
    assert first["reason"] == "scripted 0" and first["window"]["workers"] == 0


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_worker_init_fn_and_worker_info_in_each_pool(quick, monkeypatch, tmp_path, worker_type):
    log = tmp_path / "init.log"
    monkeypatch.setenv("RLOADER_TEST_INIT_LOG", str(log))
    scripted(monkeypatch, [2, None, 3])
    loader = rloader.DataLoader(
        SquarePairs(),
        batch_size=2,
        num_workers="auto",
        worker_init_fn=record_init,
        worker_type=worker_type,
    )
    batches(loader)
    lines = [tuple(int(x) for x in line.split()) for line in log.read_text().splitlines()]
    by_pool: dict = {}
    for n, worker_id, info_id, seed in lines:
        assert worker_id == info_id
        by_pool.setdefault(n, []).append((worker_id, seed))
    assert sorted(by_pool) == [2, 3]
    seeds = {seed - worker_id for pool in by_pool.values() for worker_id, seed in pool}
    assert len(seeds) == 1  # every pool of the epoch: torch's seeds from one base seed
    for n, pool in by_pool.items():
        assert sorted(w for w, _ in pool) == list(range(n))


def test_persistent_workers_keep_the_last_pool(quick, monkeypatch, tmp_path):
    log = tmp_path / "init.log"
    monkeypatch.setenv("RLOADER_TEST_INIT_LOG", str(log))
    scripted(monkeypatch, [2])

    def make(nw):
        return loader_of(nw, 3, persistent_workers=True, worker_init_fn=record_init)

    loader = make("auto")
    first = batches(loader)
    engine = loader._iterator._engines[-1].it
    second = batches(loader, epochs=2)
    assert loader._iterator._engines[-1].it is engine  # the same pool, kept
    assert chosen(loader) == [2]  # the later epochs start on it, kept
    assert loader.stats()["auto"]["decisions"][0]["reason"] == "kept (persistent workers)"
    started = log.read_text().splitlines()
    assert len(started) == 2  # worker_init_fn ran for the one pool's two workers only
    # persistent workers draw the base seed once: the order is a persistent fixed loader's
    assert first + second == batches(make(2), epochs=3)


def test_errors_are_a_fixed_loaders(quick, monkeypatch):
    scripted(monkeypatch, [2])

    auto = outcomes(rloader.DataLoader(SquarePairs(fail_at=30), batch_size=2, num_workers="auto"))
    fixed = outcomes(rloader.DataLoader(SquarePairs(fail_at=30), batch_size=2, num_workers=2))
    assert auto == fixed
    assert "ValueError: bad sample 30" in auto[15]


def test_resume_mid_epoch(quick, monkeypatch):
    scripted(monkeypatch, [2, None, 3])

    def make():
        return loader_of("auto", 5)

    whole = batches(make())[0]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(20)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert head + batches(resumed)[0] == whole


def test_a_resumed_auto_loader_starts_on_the_saved_choice(quick, monkeypatch):
    scripted(monkeypatch, [3])
    loader = loader_of("auto", 5, prefetch_factor="auto")
    it = iter(loader)
    for _ in range(20):
        next(it)
    assert loader.stats()["auto"]["num_workers"] == 3
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    assert state["auto"] == dict(
        workers=3, kind="process", wanted=None, prefetch=None, trial=None, tried=False
    )
    del it
    scripted(monkeypatch, [])
    resumed = loader_of("auto", 5, prefetch_factor="auto")
    resumed.load_state_dict(dict(state, auto=dict(state["auto"], prefetch=99)))
    got = batches(resumed)[0]
    assert chosen(resumed)[0] == 3  # at once, not the main process first
    assert resumed.stats()["auto"]["prefetch_factor"] == auto_policy.PREFETCH_MAX  # (bounded)
    assert len(got) == N // 2 - 20
    for field, value in [("kind", "fiber"), ("trial", [2, -1.0]), ("trial", [0, 1.0])]:
        bad = dict(state, auto=dict(state["auto"], **{field: value}))
        with pytest.raises(ValueError, match=rf"state\['auto'\]\['{field}'\]"):
            loader_of("auto", 5).load_state_dict(bad)
    ran = loader_of("auto", 5)
    list(ran)  # a loader that has run keeps what it learned
    ran.load_state_dict(state)
    batches(ran)
    assert chosen(ran)[0] == 0


@pytest.mark.parametrize("saved_with, resumed_with", [(2, "auto"), ("auto", 0)])
def test_resume_across_fixed_and_auto(quick, monkeypatch, saved_with, resumed_with):
    scripted(monkeypatch, [2])
    whole = batches(loader_of(0, 9))[0]
    loader = loader_of(saved_with, 9)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(15)]
    state = loader.state_dict()
    del it
    resumed = loader_of(resumed_with, 9)
    resumed.load_state_dict(state)
    assert head + batches(resumed)[0] == whole


def test_arguments():
    loader = rloader.DataLoader(SquarePairs(), num_workers="auto", prefetch_factor="auto")
    assert isinstance(loader.num_workers, int) and loader.num_workers == auto_measure.usable_cores()
    assert loader.prefetch_factor == 2
    rebuilt = type(loader)(SquarePairs(), num_workers=loader.num_workers)  # as frameworks rebuild
    assert isinstance(rebuilt.num_workers, _auto.AutoWorkers)
    assert rloader.DataLoader(SquarePairs(), prefetch_factor="auto").prefetch_factor is None
    assert (
        rloader.DataLoader(SquarePairs(), num_workers=1, prefetch_factor="auto").prefetch_factor
        == 2
    )
    tuned = rloader.DataLoader(SquarePairs(), num_workers="auto", prefetch_factor="auto")
    assert isinstance(tuned.prefetch_factor, _auto.AutoPrefetch) and tuned.prefetch_factor == 2
    again = type(tuned)(
        SquarePairs(), num_workers=tuned.num_workers, prefetch_factor=tuned.prefetch_factor
    )
    assert isinstance(again.prefetch_factor, _auto.AutoPrefetch)
    assert not isinstance(loader_of("auto", 1).prefetch_factor, _auto.AutoPrefetch)
    later = rloader.DataLoader(SquarePairs(), batch_size=5)
    later.num_workers = "auto"  # set after the loader was made, as torch allows
    it = iter(later)
    assert isinstance(it, _auto.AutoIter)
    assert [b.tolist() for b in it] == batches(tud.DataLoader(SquarePairs(), batch_size=5))[0]
    rloader.DataLoader(SquarePairs(), num_workers="auto", persistent_workers=True)
    rloader.DataLoader(SquarePairs(), num_workers="auto", multiprocessing_context="spawn")
    for bad in ("many", "AUTO"):  # torch's type for a str, in words that name "auto"
        with pytest.raises(TypeError):
            tud.DataLoader(SquarePairs(), num_workers=bad)
        with pytest.raises(TypeError, match=f"must be an int or 'auto'.*num_workers='{bad}'"):
            rloader.DataLoader(SquarePairs(), num_workers=bad)
    with pytest.raises(ValueError, match="non-negative"):
        rloader.DataLoader(SquarePairs(), num_workers=-1)
    with pytest.raises(ValueError, match="worker_type='auto'"):
        rloader.DataLoader(SquarePairs(), num_workers=2, worker_type="auto")
    with pytest.raises(ValueError, match="worker_type must be"):
        rloader.DataLoader(SquarePairs(), num_workers="auto", worker_type="fiber")


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_prefetch_is_tuned_in_place_and_the_batches_are_a_fixed_loaders(
    quick, monkeypatch, worker_type
):
    # 2 workers from the first window; then each window asks for a deeper prefetch, then a
    # shallower one: the pool is kept, and the batches are the fixed loaders'.
    scripted(monkeypatch, [2])
    asked = iter([(4, "deeper"), None, (8, "deeper"), (4, "memory"), None])
    monkeypatch.setattr(auto_policy, "decide_prefetch", lambda w: next(asked, None))
    loader = loader_of("auto", 5, n=400, prefetch_factor="auto", worker_type=worker_type)
    expected = batches(loader_of(0, 5, n=400), epochs=2)
    assert batches(loader) == expected[:1]
    decisions = loader.stats()["auto"]["decisions"]
    assert [(d["num_workers"], d["prefetch_factor"]) for d in decisions] == [
        (0, None),
        (2, 2),
        (2, 4),
        (2, 8),
        (2, 4),
    ]
    assert "prefetch_factor 8: deeper" in decisions[3]["reason"]
    assert loader.stats()["auto"]["prefetch_factor"] == 4
    # in flight (drawn and not handed out) after each hand-out: 2 workers × the prefetch
    scripted(monkeypatch, [2])
    sampler = CountedDraws(range(400))
    counted = rloader.DataLoader(
        SquarePairs(400),
        batch_size=2,
        sampler=sampler,
        num_workers="auto",
        prefetch_factor="auto",
        worker_type=worker_type,
    )
    asked = iter([(4, "deeper"), None, (8, "deeper"), (2, "memory"), None])
    got, in_flight = [], []
    for handed, batch in enumerate(counted, 1):
        got.append(batch.tolist())
        in_flight.append(sampler.drawn // 2 - handed)
    assert got == [b.tolist() for b in tud.DataLoader(SquarePairs(400), batch_size=2)]
    changes = [n for k, n in enumerate(in_flight) if k == 0 or in_flight[k - 1] != n]
    assert changes[:4] == [0, 4, 8, 16] and in_flight[-100] == 4, in_flight
    assert counted.stats()["auto"]["prefetch_factor"] == 2
    # the next epoch's pool starts with the last chosen
    asked = iter([(8, "deeper")])
    assert batches(loader) == expected[1:]
    assert loader.stats()["auto"]["decisions"][0]["prefetch_factor"] == 4
    assert loader.stats()["auto"]["prefetch_factor"] == 8


def test_a_fixed_prefetch_factor_is_not_tuned(quick, monkeypatch):
    scripted(monkeypatch, [2])
    monkeypatch.setattr(auto_policy, "decide_prefetch", lambda w: pytest.fail("tuned"))
    loader = loader_of("auto", 5, prefetch_factor=3)
    assert batches(loader) == batches(loader_of(0, 5))
    assert loader.stats()["auto"]["prefetch_factor"] == 3


def test_spawned_workers_under_auto(quick, monkeypatch):
    scripted(monkeypatch, [2])
    loader = loader_of("auto", 13, multiprocessing_context="spawn")
    assert batches(loader) == batches(loader_of(0, 13))
    assert chosen(loader) == [0, 2]


def test_timeout_is_a_fixed_loaders(quick, monkeypatch):
    import threading

    scripted(monkeypatch, [2])
    messages = []
    for nw in ("auto", 2):
        release = threading.Event()
        loader = rloader.DataLoader(
            Blocks(release), batch_size=2, num_workers=nw, worker_type="thread", timeout=0.2
        )
        it = iter(loader)
        got = [next(it).tolist() for _ in range(4)]  # samples 0-7
        with pytest.raises(RuntimeError) as error:
            next(it)
        release.set()
        messages.append((got, str(error.value)))
        del it
    assert messages[0] == messages[1]
    assert "timed out" in messages[0][1]


def test_a_dropped_persistent_loader_stops_its_workers_at_once(quick, monkeypatch):

    scripted(monkeypatch, [2])
    loader = loader_of("auto", 1, persistent_workers=True)
    batches(loader)
    pool = loader._iterator._engines[-1].it._rloader_pool
    assert len(pool.procs) == 2 and not pool.stopped
    gc.disable()  # not the garbage collector: the last reference going
    try:
        del loader
        assert pool.stopped
    finally:
        gc.enable()


def test_the_main_process_engine_recycles_the_loaders_batch_memory(monkeypatch):
    # The in-process engine collates into the loader's recycled memory (its record's
    # BatchBuffers), as a fixed num_workers=0 loader does, not into new memory each epoch
    # (which cost uint8 [3, 224, 224] batches of 64 half their speed).
    from rloader._loader_record import record_of

    monkeypatch.setattr(auto_policy, "decide", lambda window: None)  # the main process throughout
    loader = rloader.DataLoader(SquarePairs(), batch_size=4, num_workers="auto")
    first = batches(loader)
    buffers = record_of(loader).buffers
    assert buffers is not None
    assert batches(loader) == first == batches(tud.DataLoader(SquarePairs(), batch_size=4))
    assert record_of(loader).buffers is buffers
    assert chosen(loader) == [0]


def test_a_switch_the_budget_cannot_hold_both_pools_stops_the_old_one_first(quick, monkeypatch):

    scripted(monkeypatch, [2, None, 3])
    tight_budget(monkeypatch)
    # Each pool's worker pids as they start (NOTE [Staged start]), and whether the earlier
    # pools' were alive when the next pool started.
    pids_of: dict = {}
    real_start = process_pool._Starter.start_next

    def start_next(starter):
        took = real_start(starter)
        pids_of.setdefault(id(starter.pool), set()).update(p.pid for p in starter.pool.procs)
        return took

    monkeypatch.setattr(process_pool._Starter, "start_next", start_next)
    real = dispatch.engine

    def engine(view, keys, base_seed, kind):
        alive = [os.path.exists(f"/proc/{pid}") for pids in pids_of.values() for pid in pids]
        it = real(view, keys, base_seed, kind)
        engine.alive.append(alive)
        return it

    engine.alive = []
    monkeypatch.setattr(dispatch, "engine", engine)
    loader = loader_of("auto", 3)
    it = iter(loader)
    head = []
    while len(chosen(loader)) < 3:
        head.append(next(it).tolist())
    head.append(next(it).tolist())  # a batch the old pool had in flight (drained)
    assert chosen(loader) == [0, 2, 3]
    assert engine.alive == [[], [], [False, False]]  # the pool of 2 had stopped
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # (counts what was handed out)
    rest = [b.tolist() for b in it]
    whole = batches(loader_of(0, 3))[0]
    assert head + rest == whole
    resumed = loader_of("auto", 3)
    resumed.load_state_dict(state)
    assert head + batches(resumed)[0] == whole


def test_an_error_in_the_batches_of_a_drained_pool_is_a_fixed_loaders(quick, monkeypatch):
    scripted(monkeypatch, [2, None, 3])
    tight_budget(monkeypatch)
    dry = rloader.DataLoader(SquarePairs(), batch_size=2, num_workers="auto")
    batches(dry)
    switch = dry.stats()["auto"]["decisions"][2]["batch"]
    fail_at = 2 * switch + 2  # in the batch after the first one the old pool had in flight

    scripted(monkeypatch, [2, None, 3])  # (the same decisions again)
    auto_loader = rloader.DataLoader(SquarePairs(fail_at=fail_at), batch_size=2, num_workers="auto")
    auto = outcomes(auto_loader)
    assert chosen(auto_loader) == [0, 2, 3]
    fixed = outcomes(rloader.DataLoader(SquarePairs(fail_at=fail_at), batch_size=2, num_workers=2))
    assert auto == fixed
    assert f"ValueError: bad sample {fail_at}" in auto[switch + 1]
