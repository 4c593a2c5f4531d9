"""num_workers="auto" (NOTE [Auto workers] in python/rloader/_auto/__init__.py).

Decisions are made deterministic without timing: either ``auto_policy.decide`` is replaced by
a script (switch at given windows), or ``auto_measure.clock`` by a fake clock that the dataset
(in the main process) and the consumer advance, so the measured times are the test's numbers.
The batches are checked against fixed loaders, which are the oracle (torch's for what torch
does).
"""

import gc
import os
import pickle
import time

import pytest
import torch
import torch.utils.data as tud
from _children import thread_names

import rloader
from rloader import _auto, _rloader
from rloader._auto import learned as auto_learned
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy
from rloader._engines import dispatch
from rloader._engines.process import pool as process_pool
from rloader.sampler import iter_keys

N = 96


class Ints(tud.Dataset):
    def __init__(self, n=N, clock=None, cost=0.0, fail_at=None):
        self.n, self.clock, self.cost, self.fail_at = n, clock, cost, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"bad sample {i}")
        if self.clock is not None and tud.get_worker_info() is None:
            self.clock.now += self.cost  # the main process's fetch "takes" cost seconds
        return torch.tensor([i, i * i])


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def scripted(monkeypatch, plan):
    """``decide`` answers ``plan[k]`` at its k-th call (None: keep), then None."""
    calls = []

    def decide(window):
        calls.append(window)
        k = len(calls) - 1
        target = plan[k] if k < len(plan) else None
        if target is None or target == window.workers:
            return None
        return auto_policy.Decision(target, f"scripted {k}")

    monkeypatch.setattr(auto_policy, "decide", decide)
    return calls


def loader_of(num_workers, seed, batch_size=2, shuffle=True, n=N, **kw):
    return rloader.DataLoader(
        Ints(n),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        **kw,
    )


def batches(loader, epochs=1):
    out = []
    for _ in range(epochs):
        out.append([b.tolist() for b in loader])
    return out


def chosen(loader):
    return [d["num_workers"] for d in loader.stats()["auto"]["decisions"]]


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
        torch_batches = [[b.tolist() for b in tud.DataLoader(Ints(), batch_size=3)]] * 2
        assert got == torch_batches


def test_first_epoch_switches_are_recorded(quick, monkeypatch):
    scripted(monkeypatch, [2, None, 3] + [1] * 40)  # (turning back waits for a longer window)
    loader = rloader.DataLoader(Ints(400), batch_size=2, num_workers="auto")
    assert batches(loader) == batches(tud.DataLoader(Ints(400), batch_size=2))
    assert chosen(loader) == [0, 2, 3, 1]
    stats = loader.stats()
    assert stats["batches"] == 200
    assert stats["auto"]["num_workers"] == 1
    first = stats["auto"]["decisions"][1]
    assert first["reason"] == "scripted 0" and first["window"]["workers"] == 0


def fake_clock(monkeypatch):
    """Times in the main process are the test's: wall and CPU time both (so the work holds its
    CPU: no more workers than cores)."""
    clock = FakeClock()
    monkeypatch.setattr(auto_measure, "clock", clock)
    monkeypatch.setattr(auto_measure, "cpu_clock", clock)
    return clock


def test_grows_when_the_dataset_is_slow(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    it = iter(loader)
    got = []
    for b in it:
        got.append(b.tolist())
        clock.now += 0.001  # the training step: 1 ms against 20 ms of loading per batch
    assert got == batches(tud.DataLoader(Ints(), batch_size=2))[0]
    decisions = loader.stats()["auto"]["decisions"]
    assert decisions[1]["num_workers"] == 4  # work / user asks for more than the 4 cores
    assert "waits on the main process" in decisions[1]["reason"]


def test_a_pool_not_worth_starting_late_in_the_first_epoch_starts_the_next(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    # the rest of the epoch does not win 4 starts back (0.66 s), 4 whole epochs do (2.9 s)
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 0.5)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    loader = rloader.DataLoader(
        Ints(clock=clock, cost=0.01), batch_size=2, num_workers="auto", persistent_workers=True
    )
    assert batches(loader) == batches(tud.DataLoader(Ints(), batch_size=2))
    assert chosen(loader) == [0]
    assert loader.stats()["auto"]["next_num_workers"] == 4
    assert batches(loader) == batches(tud.DataLoader(Ints(), batch_size=2))
    assert chosen(loader) == [4]  # the second epoch starts on the pool


@pytest.mark.parametrize("persistent", [True, False])
def test_an_epoch_shorter_than_a_window_decides_for_the_next(quick, monkeypatch, persistent):
    clock = fake_clock(monkeypatch)
    monkeypatch.setattr(auto_policy, "MIN_WINDOW_S", 1e9)  # no window ends within the epoch
    loader = rloader.DataLoader(
        Ints(clock=clock, cost=0.01),
        batch_size=2,
        num_workers="auto",
        persistent_workers=persistent,
    )
    assert batches(loader) == batches(tud.DataLoader(Ints(), batch_size=2))
    assert chosen(loader) == [0]
    assert loader.stats()["auto"]["next_num_workers"] == 4
    assert batches(loader) == batches(tud.DataLoader(Ints(), batch_size=2))
    assert chosen(loader) == [4]


def test_stays_in_process_when_the_consumer_is_the_bottleneck(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.0001), batch_size=2, num_workers="auto")
    for _ in loader:
        clock.now += 0.1  # 100 ms steps against 0.2 ms of loading
    assert chosen(loader) == [0]


@pytest.mark.parametrize("slow_step, shrunk", [(0.1, 1), (10.0, 0)])
def test_shrinks_when_the_consumer_is_slow(quick, monkeypatch, slow_step, shrunk):
    # Once the pool is large, the training step becomes the bottleneck: the pool shrinks to
    # one worker; or, when the main process's 10 ms of work per batch would be under 5 % of
    # the step, to none (the main process).
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.01), batch_size=1, num_workers="auto")
    got = []
    step = 0.0
    for b in loader:
        got.append(b.tolist())
        if loader.stats()["auto"]["num_workers"] == 4:
            step = slow_step
        clock.now += step
    assert got == batches(tud.DataLoader(Ints(), batch_size=1))[0]
    assert chosen(loader)[:2] == [0, 4]
    assert chosen(loader)[2] == shrunk, loader.stats()["auto"]["decisions"]
    assert "idle" in loader.stats()["auto"]["decisions"][2]["reason"]


def test_the_memory_budget_bounds_the_pool(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "300M")
    monkeypatch.setattr(
        auto_measure, "process_memory", lambda pid: 100 << 20
    )  # each worker: 100 MiB
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 100 << 20)  # ... and the estimate
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.01), batch_size=1, num_workers="auto")
    assert len(batches(loader)[0]) == N
    assert max(chosen(loader)) == 3  # not the 4 cores: 4 × 100 MiB > 300 MiB
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "50M")  # below one worker: none is started
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.01), batch_size=1, num_workers="auto")
    assert len(batches(loader)[0]) == N
    assert chosen(loader) == [0]


def test_bad_memory_budget_is_named(monkeypatch):
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match=auto_measure.MEMORY_ENV):
        iter(rloader.DataLoader(Ints(), num_workers="auto"))


class Shards(tud.IterableDataset):
    """Yields (sample, the num_workers of the worker yielding it), sharded by worker."""

    def __init__(self, clock=None, cost=0.0):
        self.clock, self.cost = clock, cost

    def __iter__(self):
        info = tud.get_worker_info()
        n, w = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(w, 40, n):
            if info is None and self.clock is not None:
                self.clock.now += self.cost
            yield torch.tensor([i, 0 if info is None else info.num_workers])


def test_an_iterable_dataset_keeps_one_count_per_epoch(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(Shards(clock, 0.01), batch_size=2, num_workers="auto")
    counts = []
    for _ in range(3):
        epoch = [b for b in loader]
        seen = {int(n) for b in epoch for n in b[:, 1]}
        samples = sorted(int(i) for b in epoch for i in b[:, 0])
        assert samples == list(range(40))  # each worker's shard, once
        assert len(seen) == 1, seen  # one count for the whole epoch
        counts.append(seen.pop())
    assert counts[0] == 0  # the first epoch: the main process, as torch's default
    assert counts[1] >= 1 and counts[2] == counts[1]


def ticking_clock(monkeypatch):
    """The loader's clock, each reading 1 s more than the last."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(auto_measure, "clock", lambda: float(next(ticks)))


@pytest.mark.parametrize("gil_bound, affordable", [(True, True), (False, True), (True, False)])
def test_worker_type_auto_moves_gil_bound_work_to_processes_between_epochs(
    quick, monkeypatch, gil_bound, affordable
):
    ticking_clock(monkeypatch)
    scripted(monkeypatch, [2])
    monkeypatch.setattr(auto_policy, "GROW_WAIT_SHARE", -1.0)  # every window counts as busy
    # any measured slowdown of the threads' work reads as the GIL, or none does
    monkeypatch.setattr(auto_policy, "GIL_SHARE", 0.0 if gil_bound else 1e12)
    # (processes whose start an epoch would not win back stay threads)
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 1e-3 if affordable else 1e9)
    loader = loader_of("auto", 11, worker_type="auto")
    got = batches(loader, epochs=2)
    assert got == batches(loader_of(0, 11), epochs=2)
    kinds = [d["worker_type"] for d in loader.stats()["auto"]["decisions"]]
    moved = gil_bound and affordable
    assert kinds == (["process"] if moved else ["thread"])  # epoch 2 starts on its kind
    assert loader.stats()["auto"]["num_workers"] == 2


@pytest.mark.parametrize("keeps", [True, False])
@pytest.mark.parametrize("resumed", [False, True])
def test_worker_type_auto_puts_processes_on_trial_after_threads_short_of_their_promise(
    quick, monkeypatch, keeps, resumed
):
    # (the main process gave no verdict on its loading, as on a busy machine: threads first)
    monkeypatch.setattr(auto_policy, "holds_cpu", lambda share: False)
    ticking_clock(monkeypatch)
    monkeypatch.setattr(auto_measure, "cpu_clock", auto_measure.clock)  # (work that holds its CPU)
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "1T")  # (the budget holds processes on any machine)
    scripted(monkeypatch, [2])
    monkeypatch.setattr(auto_policy, "GIL_SHARE", 1e12)  # (no verdict of the GIL)
    monkeypatch.setattr(auto_policy, "CONSUMER_GIL", 1e12)
    monkeypatch.setattr(auto_policy, "TRIAL_EFFICIENCY", 1e12)  # any thread pool is short of it
    # the processes' epoch is faster than the threads' by any margin, or by none
    monkeypatch.setattr(auto_policy, "TRIAL_MARGIN", 1e12 if keeps else 0.0)
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 1e-3)

    def make():
        return loader_of("auto", 11, worker_type="auto", persistent_workers=True)

    loader = make()
    kinds, got = [], []
    for epoch in range(5):
        if resumed and epoch == 2:  # a checkpoint with processes on trial next: judged all the same
            state = pickle.loads(pickle.dumps(loader.state_dict()))
            loader = make()
            loader.load_state_dict(state)
        got.append([b.tolist() for b in loader])
        kinds.append(loader.stats()["auto"]["worker_type"])
    assert got == batches(loader_of(2, 11, persistent_workers=True), epochs=5)
    # epoch 1: the main process, then threads; 2: threads (a whole epoch, not the pool's
    # first); 3: processes on trial; then the faster kind, and no trial again
    assert kinds == ["thread", "thread", "process"] + (["process"] * 2 if keeps else ["thread"] * 2)
    assert _auto.learned_of(loader).tried


def test_a_trial_is_made_only_where_the_threads_shortfall_pays_for_it():
    worth = auto_policy.trial_worth
    # tensor pairs: 2 threads at 138 us a batch against 128 us promised, 512 batches an epoch,
    # against 2 processes' start of a 1.6 GiB process (0.22 s)
    assert not worth(138e-6, 128e-6, 512, True, 0.22)
    # JPEG decoding: 67 ms against 59 ms, 23 batches an epoch, 2 starts of 0.05 s
    assert worth(0.067, 0.059, 23, True, 0.1)
    assert not worth(0.067, 0.059, 23, False, 0.2)  # (each epoch starts them again)
    assert not worth(0.067, 0.059, None, True, 0.1)  # (an epoch of unknown length)


def test_processes_on_trial_are_kept_only_if_faster():
    assert auto_policy.trial_keeps_processes(1.0, 0.9)
    assert not auto_policy.trial_keeps_processes(1.0, 0.98)
    assert not auto_policy.trial_keeps_processes(1.0, 1.5)


@pytest.mark.parametrize("slowed", [True, False])
@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("loaded", [False, True])
def test_threads_that_slow_the_consumers_step_make_way_for_processes(
    quick, monkeypatch, slowed, uneven, loaded
):
    # 10 ms of work a batch and a 2 ms step beside the main process; beside 2 threads the step
    # takes 4 ms (they take the GIL from the consumer): the next epoch starts processes.
    # Uneven: a 30 ms step every 10th batch beside the main process and every 3rd beside the
    # threads (a window's phase): the steps' means (3.9 against 10.7 ms, or 12 ms slowed) tell
    # nothing, their medians do. Loaded: other processes keep 2 cores busy meanwhile, and the
    # consumer's slower step may be theirs: no move.
    # (the main process gave no verdict on its loading, as on a busy machine: threads first)
    monkeypatch.setattr(auto_policy, "holds_cpu", lambda share: False)
    clock = fake_clock(monkeypatch)
    if loaded:
        monkeypatch.setattr(auto_measure, "machine_cpu", lambda: 2 * clock.now)
        monkeypatch.setattr(auto_measure, "loader_cpu", lambda pids: 0.0)
    scripted(monkeypatch, [2])
    monkeypatch.setattr(auto_policy, "GIL_SHARE", 1e12)  # (not the threads' own slowdown)
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 1e-3)
    loader = rloader.DataLoader(
        Ints(clock=clock, cost=0.005), batch_size=2, num_workers="auto", worker_type="auto"
    )
    got, it = [], iter(loader)
    for k, b in enumerate(it):
        got.append(b.tolist())
        beside_threads = it._stats.workers > 0
        clock.now += 0.004 if beside_threads and slowed else 0.002
        if uneven and k % (3 if beside_threads else 10) == 0:
            clock.now += 0.028
    assert got == batches(tud.DataLoader(Ints(), batch_size=2))[0]
    assert it._stats.kind == "thread"
    moved = slowed and not loaded
    assert loader.stats()["auto"]["next_worker_type"] == ("process" if moved else None)


def _record_init(worker_id):
    info = tud.get_worker_info()
    with open(os.environ["RLOADER_TEST_INIT_LOG"], "a") as f:
        f.write(f"{info.num_workers} {worker_id} {info.id} {info.seed}\n")


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_worker_init_fn_and_worker_info_in_each_pool(quick, monkeypatch, tmp_path, worker_type):
    log = tmp_path / "init.log"
    monkeypatch.setenv("RLOADER_TEST_INIT_LOG", str(log))
    scripted(monkeypatch, [2, None, 3])
    loader = rloader.DataLoader(
        Ints(),
        batch_size=2,
        num_workers="auto",
        worker_init_fn=_record_init,
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
        return loader_of(nw, 3, persistent_workers=True, worker_init_fn=_record_init)

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


def outcomes(loader):
    """Each batch of an epoch, or the last line of the error raised in its place."""
    out, it = [], iter(loader)
    for _ in range(len(loader)):
        try:
            out.append(next(it).tolist())
        except ValueError as e:
            out.append(str(e).splitlines()[-1])
    return out


def test_errors_are_a_fixed_loaders(quick, monkeypatch):
    scripted(monkeypatch, [2])

    auto = outcomes(rloader.DataLoader(Ints(fail_at=30), batch_size=2, num_workers="auto"))
    fixed = outcomes(rloader.DataLoader(Ints(fail_at=30), batch_size=2, num_workers=2))
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
    loader = rloader.DataLoader(Ints(), num_workers="auto", prefetch_factor="auto")
    assert isinstance(loader.num_workers, int) and loader.num_workers == auto_measure.usable_cores()
    assert loader.prefetch_factor == 2
    rebuilt = type(loader)(Ints(), num_workers=loader.num_workers)  # as frameworks rebuild
    assert isinstance(rebuilt.num_workers, _auto.AutoWorkers)
    assert rloader.DataLoader(Ints(), prefetch_factor="auto").prefetch_factor is None
    assert rloader.DataLoader(Ints(), num_workers=1, prefetch_factor="auto").prefetch_factor == 2
    tuned = rloader.DataLoader(Ints(), num_workers="auto", prefetch_factor="auto")
    assert isinstance(tuned.prefetch_factor, _auto.AutoPrefetch) and tuned.prefetch_factor == 2
    again = type(tuned)(
        Ints(), num_workers=tuned.num_workers, prefetch_factor=tuned.prefetch_factor
    )
    assert isinstance(again.prefetch_factor, _auto.AutoPrefetch)
    assert not isinstance(loader_of("auto", 1).prefetch_factor, _auto.AutoPrefetch)
    later = rloader.DataLoader(Ints(), batch_size=5)
    later.num_workers = "auto"  # set after the loader was made, as torch allows
    it = iter(later)
    assert isinstance(it, _auto.AutoIter)
    assert [b.tolist() for b in it] == batches(tud.DataLoader(Ints(), batch_size=5))[0]
    rloader.DataLoader(Ints(), num_workers="auto", persistent_workers=True)
    rloader.DataLoader(Ints(), num_workers="auto", multiprocessing_context="spawn")
    for bad in ("many", "AUTO"):  # the error torch raises for a str
        with pytest.raises(TypeError) as theirs:
            tud.DataLoader(Ints(), num_workers=bad)
        with pytest.raises(TypeError) as ours:
            rloader.DataLoader(Ints(), num_workers=bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="non-negative"):
        rloader.DataLoader(Ints(), num_workers=-1)
    with pytest.raises(ValueError, match="worker_type='auto'"):
        rloader.DataLoader(Ints(), num_workers=2, worker_type="auto")
    with pytest.raises(ValueError, match="worker_type must be"):
        rloader.DataLoader(Ints(), num_workers="auto", worker_type="fiber")


def window(**kw):
    base = dict(
        batches=10,
        wait_s=0.0,
        user_s=0.1,
        work_s=0.01,
        cpu_s=None,
        workers=0,
        kind="process",
        cores=8,
        budget=1 << 40,
        per_worker=1 << 20,
        remaining=None,
        prefetch=2,
    )
    base.update(kw)
    return auto_policy.Window(**base)


def test_decide():
    # in process: the consumer waits for 10 ms of work per batch against 2 ms of its own
    d = auto_policy.decide(window(wait_s=0.1, user_s=0.02, work_s=0.1))
    assert d.workers == 7  # ceil(10 / 2 × 1.25)
    # ... bounded by the cores, the budget and the work left
    assert auto_policy.decide(window(wait_s=0.1, user_s=0.0, work_s=0.1)).workers == 8
    assert (
        auto_policy.decide(window(wait_s=0.1, user_s=0.0, work_s=0.1, budget=3 << 20)).workers == 3
    )
    assert auto_policy.decide(window(wait_s=1.0, user_s=0.0, work_s=1.0, remaining=20)).workers == 5
    # ... and in the first epoch by what starting the pool costs against what the rest of the
    # epoch would save: then from the next epoch on, if a whole epoch saves more, else not at
    # all
    late = window(wait_s=0.1, user_s=0.0, work_s=0.1, remaining=20, start_s=0.05)
    assert auto_policy.decide(late._replace(epoch_batches=1000)).deferred
    # (a persistent pool, started once: if ``PAYBACK_EPOCHS`` whole epochs win it back)
    assert auto_policy.decide(late._replace(epoch_batches=20, persistent=True)).deferred
    assert auto_policy.decide(late._replace(epoch_batches=20)) is None
    assert auto_policy.decide(late._replace(epoch_batches=40)) is None
    later = late._replace(first_epoch=False)
    # ... and in a later epoch a pool starts only where a whole epoch (PAYBACK_EPOCHS with
    # persistent workers) wins its start back: uint8 arrays, 0.43 ms a batch, against 2
    # processes' start of 0.117 s each: 48 batches an epoch do not, 128 do
    uint8 = window(
        wait_s=0.0043, user_s=0.0, work_s=0.0043, batches=10, cores=2, remaining=100
    )._replace(first_epoch=False, epoch_batches=48, persistent=True, start_s=0.117)
    assert auto_policy.decide(uint8) is None
    assert auto_policy.decide(uint8._replace(epoch_batches=128)).workers == 2
    assert auto_policy.decide(uint8._replace(epoch_batches=128, persistent=False)) is None
    # ... unless the budget holds fewer workers than the cores would carry only by the
    # estimate of a worker's memory (the main process's RSS), and the pool the cores would
    # carry wins its start back: one worker starts, to measure
    sleeps = window(
        wait_s=0.34, user_s=0.0, work_s=0.34, cpu_s=0.024, batches=10, cores=2, remaining=100
    )._replace(first_epoch=False, epoch_batches=128, persistent=True, start_s=0.045)
    estimated = sleeps._replace(budget=579 << 20, per_worker=500 << 20, memory_measured=False)
    assert auto_policy.decide(estimated).workers == 1
    assert auto_policy.decide(estimated._replace(memory_measured=True)) is None
    # ... where the consumer's own step is longer than the work, 1 worker saves all the wait
    # (2.5 ms a batch; 100 batches left: 250 ms against a 15 ms start)
    step = window(wait_s=0.025, user_s=0.04, work_s=0.025, remaining=100, start_s=0.015)
    assert auto_policy.decide(step).workers == 1 and not auto_policy.decide(step).deferred
    assert not auto_policy.decide(later).deferred
    assert auto_policy.decide(
        window(wait_s=0.1, user_s=0.0, work_s=0.1, remaining=20, kind="thread")
    )
    # little work, or little waiting: stays
    assert auto_policy.decide(window(wait_s=0.001, user_s=0.02, work_s=0.001)) is None
    assert auto_policy.decide(window(wait_s=0.004, user_s=1.0, work_s=0.004)) is None
    # a pool whose consumer waits grows, at most ×2 per step
    assert auto_policy.decide(window(workers=2, wait_s=0.5, user_s=0.01, work_s=1.0)).workers == 4
    # hysteresis: a little waiting neither grows nor shrinks
    assert auto_policy.decide(window(workers=4, wait_s=0.03, user_s=1.0, work_s=0.1)) is None
    # a pool whose consumer never waits and whose workers idle shrinks
    assert auto_policy.decide(window(workers=4, wait_s=0.0, user_s=1.0, work_s=0.1)).workers == 1
    assert auto_policy.decide(window(workers=4, wait_s=0.0, user_s=1.0, work_s=2.6)) is None
    # ... but not back to a pool that grew because the consumer waited on it, while the ratio of
    # work to the consumer's step holds (uneven steps: a window in the long ones reads idle)
    idle = window(workers=2, wait_s=0.0, user_s=0.046, work_s=0.0275)  # 0.6: 1 worker asked
    assert auto_policy.decide(idle).workers == 1
    assert auto_policy.decide(idle._replace(waited=(1, 0.6))) is None
    assert auto_policy.decide(idle._replace(waited=(1, 0.9))).workers == 1  # the ratio fell by 1/3
    four = idle._replace(workers=4, user_s=0.2)  # ratio 0.14: 1 asked, 2 waited at 0.15
    assert auto_policy.decide(four._replace(waited=(2, 0.15))).workers == 3
    # memory measured over the budget shrinks the pool
    over = window(workers=4, wait_s=0.5, user_s=0.1, work_s=1.0, budget=2 << 20)
    assert auto_policy.decide(over).workers == 2
    # a pool at its cap whose consumer waits, no faster than the main process was: back to it
    slow = window(workers=8, wait_s=0.2, user_s=0.01, work_s=1.0, main_loop=0.02)
    assert auto_policy.decide(slow) == (0, auto_policy.decide(slow).reason, False, True, False)
    assert auto_policy.decide(slow._replace(main_loop=0.05)) is None  # faster: kept
    assert auto_policy.decide(slow._replace(cores=16)).workers == 16  # not at its cap: grows first
    # ... not while its workers take well over the main process's work per batch (processes
    # copying the pages they touch after the fork)
    assert auto_policy.decide(slow._replace(main_work=0.05)) is None  # 100 ms a batch against 50
    assert auto_policy.decide(slow._replace(main_work=0.08)).no_gain
    # ... nor before they have made an epoch's batches (each worker's first epoch is a start's)
    assert auto_policy.decide(slow._replace(epoch_batches=100, pool_batches=99)) is None
    assert auto_policy.decide(slow._replace(epoch_batches=100, pool_batches=100)).no_gain
    # threads are flagged short of 3/4 of the speedup their number promises: 8 threads on 8
    # cores, 100 ms of work a batch in the main process: 12.5 ms ideally, 21 ms measured
    # (``KindChoice.no_gain`` may keep them)
    threads = slow._replace(kind="thread", main_loop=0.1, main_work=0.1)
    assert auto_policy.decide(threads).no_gain
    assert (
        auto_policy.decide(threads._replace(main_loop=0.2, main_work=0.2)) is None
    )  # 25 ms ideally
    # ... unless their process used more than ``GIL_CORES`` cores: they ran side by side, not
    # taking turns on the GIL, and make way only if no faster than the main process
    assert auto_policy.decide(threads._replace(process_cores=6.0)) is None
    side_by_side = threads._replace(process_cores=6.0, main_loop=0.02, main_work=0.02)
    assert auto_policy.decide(side_by_side).no_gain
    assert auto_policy.decide(threads._replace(process_cores=1.1)).no_gain
    # ... and the main process starts no such pool until it would be clearly faster
    busy = window(wait_s=0.1, user_s=0.01, work_s=0.1)  # 11 ms a batch
    assert auto_policy.decide(busy._replace(no_gain=0.0105)) is None
    assert auto_policy.decide(busy._replace(no_gain=0.005)).workers > 0
    # threads whose work mostly waits may outnumber the cores
    io = window(wait_s=1.0, user_s=0.0, work_s=1.0, cpu_s=0.01, kind="thread", cores=2)
    assert auto_policy.decide(io).workers == 2 * auto_policy.THREADS_PER_CORE
    # ... unless other processes kept the machine busy meanwhile: then the low CPU share may
    # be this process's descheduling
    assert auto_policy.decide(io._replace(others=1.0)).workers == 2
    # ... and a thread pool's own CPU use, measured, bounds it rather than the main process's
    # share (30 threads of 1 ms sleeps kept 0.15-0.28 of 2 cores busy; the main process's
    # share, 0.067, allowed 29)
    sleeps = window(wait_s=1.0, user_s=0.0, work_s=1.0, cpu_s=0.067, kind="thread", cores=2)
    assert auto_policy.worker_cap(sleeps) == 29
    pool = sleeps._replace(workers=29, wait_s=0.1, work_s=3.0, cpu_s=0.201)
    assert auto_policy.decide(pool) is None  # (at the cap)
    assert auto_policy.decide(pool._replace(process_cores=0.2)).workers == 32
    assert auto_policy.decide(pool._replace(process_cores=2.0)) is None  # (its cores are busy)


def test_decide_prefetch():
    # the consumer waits (10 % of its loop) though 2 workers keep up on average (5 ms of work
    # a batch for 2 workers against 4.5 ms of the consumer's): uneven batches or steps
    uneven = window(workers=2, wait_s=0.005, user_s=0.045, work_s=0.05)
    assert auto_policy.decide_prefetch(uneven)[0] == 4
    assert auto_policy.decide_prefetch(uneven._replace(prefetch=4))[0] == 8
    assert auto_policy.decide_prefetch(uneven._replace(prefetch=auto_policy.PREFETCH_MAX)) is None
    # ... not when the workers cannot keep up (then the pool grows: ``decide``)
    assert auto_policy.decide_prefetch(uneven._replace(work_s=0.09)) is None
    # ... nor when the consumer does not wait
    assert auto_policy.decide_prefetch(uneven._replace(wait_s=0.001)) is None
    # within the budget: batches in flight take at most half of what the workers leave
    mib = 1 << 20
    tight = uneven._replace(budget=20 * mib, per_worker=2 * mib, batch_bytes=mib)
    assert auto_policy.prefetch_room(tight) == 4  # (20 - 2 × 2) / 2 / (2 × 1)
    assert auto_policy.decide_prefetch(tight._replace(prefetch=4)) is None
    assert auto_policy.decide_prefetch(tight._replace(prefetch=8)) == (4, ANY_REASON)
    assert auto_policy.prefetch_room(tight._replace(batch_bytes=64 * mib)) == auto_policy.PREFETCH
    assert auto_policy.decide_prefetch(uneven._replace(workers=0)) is None


class Counting(tud.Sampler):
    """Counts the keys drawn from ``sampler``."""

    def __init__(self, sampler):
        self.sampler, self.drawn = sampler, 0

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        for key in self.sampler:
            self.drawn += 1
            yield key


class _Any:
    def __eq__(self, other):
        return isinstance(other, str)


ANY_REASON = _Any()


def test_batch_nbytes():
    import numpy as np

    batch = {"x": torch.zeros(4, 3), "y": [np.zeros(5, dtype=np.int64), "abc"], "n": 3}
    assert auto_measure.batch_nbytes(batch) == 4 * 3 * 4 + 5 * 8 + 3


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
    sampler = Counting(range(400))
    counted = rloader.DataLoader(
        Ints(400),
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
    assert got == [b.tolist() for b in tud.DataLoader(Ints(400), batch_size=2)]
    changes = [n for k, n in enumerate(in_flight) if k == 0 or in_flight[k - 1] != n]
    assert changes[:4] == [0, 4, 8, 16] and in_flight[-100] == 4, in_flight
    assert counted.stats()["auto"]["prefetch_factor"] == 2
    # the next epoch's pool starts with the last chosen
    asked = iter([(8, "deeper")])
    assert batches(loader) == expected[1:]
    assert loader.stats()["auto"]["decisions"][0]["prefetch_factor"] == 4
    assert loader.stats()["auto"]["prefetch_factor"] == 8


def test_a_pool_grown_back_after_its_workers_idled_is_not_shrunk_again(quick, monkeypatch):
    # Uneven steps: windows in the consumer's long steps read as idle workers, those in its
    # short ones as waiting. Once grown back after such a shrink, the pool stays (for
    # FLOOR_EPOCHS epochs); a shrink for the budget still happens.
    # per phase (a new phase with each switch): what each window asks for
    plan = [(2, False), (1, True), (2, False), (1, True)]
    refused = 30  # windows that ask for the idle shrink once the pool has grown back
    calls, seen = [], []

    def decide(window):
        if not seen or seen[-1] != window.workers:
            seen.append(window.workers)
        phase = len(seen) - 1
        calls.append(phase)
        if phase == 3 and calls.count(3) > refused:
            workers, idle = 1, False  # then: a shrink for the budget
        else:
            workers, idle = plan[phase] if phase < len(plan) else (None, False)
        if workers is None or workers == window.workers:
            return None
        return auto_policy.Decision(workers, "memory" if not idle else "idle", idle=idle)

    monkeypatch.setattr(auto_policy, "decide", decide)
    loader = loader_of("auto", 3, n=800, persistent_workers=True)
    assert batches(loader) == batches(loader_of(0, 3, n=800))
    assert chosen(loader) == [0, 2, 1, 2, 1]
    assert loader.stats()["auto"]["decisions"][-1]["reason"] == "memory"
    assert calls.count(3) > refused  # (the idle shrinks were asked for, and refused)
    # the next epochs: still refused, until FLOOR_EPOCHS epochs have passed
    plan, refused, calls[:], seen[:] = [(1, True)] * 10, 10**6, [], []
    learned = _auto.learned_of(loader)
    learned.workers = 2
    for epoch in range(1, auto_policy.FLOOR_EPOCHS):
        batches(loader)
        assert chosen(loader) == [2], epoch
    batches(loader)
    assert chosen(loader) == [2, 1]


def test_windows_that_decide_nothing_grow_and_a_switch_shortens_them(quick, monkeypatch):
    monkeypatch.setattr(auto_policy, "STEADY_GROWTH", 4)
    calls = scripted(monkeypatch, [None, 2] + [None] * 6 + [1, 1])
    loader = loader_of("auto", 3, n=800)
    assert batches(loader) == batches(loader_of(0, 3, n=800))
    # main: 4, then 8 batches; 2 workers: 2 × 2 × 2 = 8, then 16, 32, 32...; the shrink
    # (turning back) holds its window to twice the shortest; then 1 worker: 4 again
    sizes = [(w.workers, w.batches) for w in calls]
    assert sizes[:11] == [(0, 4), (0, 8)] + [(2, 8), (2, 16)] + [(2, 32)] * 5 + [(2, 64), (1, 4)]


@pytest.mark.parametrize("first_shrink_idle", [False, True])
def test_only_growth_after_an_idle_shrink_sets_a_floor_and_a_shrink_is_clamped_to_it(
    quick, monkeypatch, first_shrink_idle
):
    # 4 workers, a shrink to 1 (idle or for the budget), 4 again, then the workers idle and
    # ask for 1: after an idle shrink the pool goes no lower than 4's floor (refused: it is
    # there); after a shrink for the budget there is no floor: 1.
    plan = [(4, False), (1, first_shrink_idle), (4, False), (1, True)]
    seen = []

    def decide(window):
        if not seen or seen[-1] != window.workers:
            seen.append(window.workers)
        phase = len(seen) - 1
        workers, idle = plan[phase] if phase < len(plan) else (None, False)
        if workers is None or workers == window.workers:
            return None
        return auto_policy.Decision(workers, "idle" if idle else "memory", idle=idle)

    monkeypatch.setattr(auto_policy, "decide", decide)
    loader = loader_of("auto", 3, n=800)
    expected = batches(loader_of(0, 3, n=800), epochs=2)
    assert batches(loader) == expected[:1]
    assert chosen(loader) == ([0, 4, 1, 4] if first_shrink_idle else [0, 4, 1, 4, 1])
    # a floor below the pool: an idle shrink stops at it
    learned = _auto.learned_of(loader)
    learned.floor = (2, learned.epochs, auto_measure.clock())
    plan[:], seen[:] = [(4, False), (1, True)], []
    learned.workers, learned.direction = 0, 0
    assert batches(loader) == expected[1:]
    assert chosen(loader) == [0, 4, 2]


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


class Blocks(Ints):
    """Batches from sample 8 on wait for ``release`` (set by the test once it has its error)."""

    def __init__(self, release):
        super().__init__()
        self.release = release

    def __getitem__(self, i):
        if i >= 8:
            self.release.wait(60)  # (bounded: a wrong engine here fails the test, not hangs it)
        return super().__getitem__(i)


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
    import gc

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
    loader = rloader.DataLoader(Ints(), batch_size=4, num_workers="auto")
    first = batches(loader)
    buffers = record_of(loader).buffers
    assert buffers is not None
    assert batches(loader) == first == batches(tud.DataLoader(Ints(), batch_size=4))
    assert record_of(loader).buffers is buffers
    assert chosen(loader) == [0]


class SlowEngine:
    """An engine whose batches from workers each take ``cost`` of the fake clock to arrive
    (the clock stands still while the consumer really waits)."""

    def __init__(self, it, clock, cost):
        self.it, self.clock, self.cost = it, clock, cost

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.it)
        self.clock.now += self.cost() if callable(self.cost) else self.cost
        return batch

    def __getattr__(self, name):
        return getattr(self.it, name)


def slow_pools(monkeypatch, clock, cost, creation=0.0):
    """Pools whose batches each keep the consumer waiting ``cost`` (or ``cost()``); starting
    one takes ``creation`` per worker (of the fake clock)."""

    real = dispatch.engine

    def engine(view, keys, base_seed, kind):
        it = real(view, keys, base_seed, kind)
        if view.num_workers == 0:
            return it
        clock.now += creation * view.num_workers
        return SlowEngine(it, clock, cost)

    monkeypatch.setattr(dispatch, "engine", engine)


def recorded_windows(monkeypatch):
    windows = []
    real = auto_policy.decide

    def decide(window):
        windows.append(window)
        return real(window)

    monkeypatch.setattr(auto_policy, "decide", decide)
    return windows


def stepped(loader, clock, step=0.001):
    out = []
    for b in loader:
        out.append(b.tolist())
        clock.now += step
    return out


def test_a_pool_no_faster_than_the_main_process_goes_back_and_is_retried_later(quick, monkeypatch):
    # The main process: 20 ms of work and a 1 ms step per batch. A pool of 4 keeps the
    # consumer waiting 20 ms a batch: no faster (its transport costs what it saves). A pool of
    # processes is not judged before it has made an epoch's batches (its first epoch is a
    # start's: each worker faults in what it reads); a fresh pool that served a whole epoch
    # (as each epoch's does without persistent workers) is judged on that epoch.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.02)
    loader = rloader.DataLoader(Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    expected = batches(tud.DataLoader(Ints(400), batch_size=2))[0]
    seen, next_ones = [], []
    for _ in range(12):
        assert stepped(loader, clock) == expected
        seen.append(chosen(loader))
        next_ones.append(loader.stats()["auto"]["next_num_workers"])
    assert seen[:3] == [[0, 4], [4], [0]]  # started, judged on its whole epoch, gone
    assert next_ones[1] == 0  # (what stats() says at the end of the epoch judged)
    # remembered: no pool for 2 epochs, then retried (a busy machine passes), no faster
    # again, then held twice as long
    assert seen[3:] == [[0, 4], [4], [0], [0], [0], [0, 4], [4], [0], [0]]


def test_a_persistent_pools_first_epoch_is_its_start_and_not_judged(quick, monkeypatch):
    # As above, but the pool of 4 is persistent and starts with the second epoch (the first
    # chose it): its first epoch is not judged (its start is paid once), its second is.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.02)
    loader = rloader.DataLoader(
        Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto", persistent_workers=True
    )
    learned = _auto.learned_of(loader)
    learned.workers, learned.kind, learned.epochs = 4, "process", 1
    learned.main_loop, learned.base_work, learned.cpu_share = 0.021, 0.02, 1.0
    expected = batches(tud.DataLoader(Ints(400), batch_size=2))[0]
    assert stepped(loader, clock) == expected
    assert chosen(loader) == [4]
    assert stepped(loader, clock) == expected
    assert chosen(loader) == [4, 0]
    assert "no faster" in loader.stats()["auto"]["decisions"][1]["reason"]


@pytest.mark.parametrize("affordable", [True, False])
@pytest.mark.parametrize("pool_wait", [0.025, 0.02, 0.018])
def test_threads_no_faster_than_the_main_process_make_way_for_processes(
    quick, monkeypatch, affordable, pool_wait
):
    # worker_type="auto": threads whose CPU-bound work goes no faster than in the main process
    # (the GIL), or not by a fifth, are kept to the epoch's end, and the next epoch starts
    # processes; unless starting processes costs more than an epoch could save: then back to
    # the main process, or, threads somewhat faster (19 ms a batch against 21), kept. Threads
    # clearly slower (26 ms) go back to the main process at once, processes next all the same.
    # (the main process gave no verdict on its loading, as on a busy machine: threads first)
    monkeypatch.setattr(auto_policy, "holds_cpu", lambda share: False)
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, pool_wait)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 0.01 if affordable else 1e3)
    loader = rloader.DataLoader(
        Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto", worker_type="auto"
    )
    expected = batches(tud.DataLoader(Ints(400), batch_size=2))[0]
    assert stepped(loader, clock) == expected
    kinds = [(d["num_workers"], d["worker_type"]) for d in loader.stats()["auto"]["decisions"]]
    kept = not affordable and pool_wait < 0.02
    if (affordable and pool_wait <= 0.02) or kept:
        assert kinds == [(0, "main"), (4, "thread")]
    else:
        assert kinds == [(0, "main"), (4, "thread"), (0, "main")]
    assert loader.stats()["auto"]["next_worker_type"] == ("process" if affordable else None)
    assert stepped(loader, clock) == expected
    kinds = [(d["num_workers"], d["worker_type"]) for d in loader.stats()["auto"]["decisions"]]
    assert kinds[0] == ((4, "process") if affordable else (4, "thread") if kept else (0, "main"))


def test_the_start_of_a_pool_is_measured(quick, monkeypatch):
    # Creating the pool takes 0.5 s per worker (fake clock): what the loader's later decisions
    # count per worker started, not the estimate.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.0, creation=0.5)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 1 << 30)
    windows = recorded_windows(monkeypatch)
    loader = rloader.DataLoader(Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    stepped(loader, clock)
    assert chosen(loader)[:2] == [0, 4]
    assert windows[0].start_s == auto_policy.start_cost("process", 1 << 30)
    assert windows[-1].workers > 0 and windows[-1].start_s == pytest.approx(0.5)
    # a measured start below the estimate: the estimate counts (the measurement ends before
    # the workers have copied the pages they touch)
    _auto.learned_of(loader).start_s["process"] = 0.001
    assert loader._iterator is None  # (not persistent: an iterator of its own)
    it = iter(loader)
    assert auto_learned.start_cost(it._learned, "process") == auto_policy.start_cost(
        "process", 1 << 30
    )
    _auto.learned_of(loader).start_s["thread"] = 0.001
    assert auto_learned.start_cost(it._learned, "thread") == 0.001
    del it
    # the estimate before a measurement grows with the process's size (fork's page tables)
    assert auto_policy.start_cost("process", 4 << 30) > auto_policy.start_cost("process", 1 << 30)
    assert auto_policy.start_cost("thread", 4 << 30) == auto_policy.THREAD_START_S


def test_the_main_processs_first_batches_are_not_measured(quick, monkeypatch):
    # Its first batches fill new batch memory (2 ms each for uint8 [3, 224, 224] × 64, against
    # 0.3 ms later): the first window starts after them.
    monkeypatch.setattr(auto_policy, "MAIN_WARM_BATCHES", 2)
    clock = fake_clock(monkeypatch)
    windows = recorded_windows(monkeypatch)

    class Cold(Ints):
        def __getitem__(self, i):
            if i < 4:  # the first two batches of two
                clock.now += 1.0
            return super().__getitem__(i)

    loader = rloader.DataLoader(Cold(clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    stepped(loader, clock)
    first = windows[0]
    assert first.workers == 0
    assert first.wait_s / first.batches == pytest.approx(0.02)
    # ... unless the epoch is too short to leave a window after them
    windows.clear()
    short = rloader.DataLoader(Cold(n=10, clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    stepped(short, clock)
    assert windows[0].batches == 4 and windows[0].wait_s > 2.0  # (the first two: 1 s each)


def test_a_pool_is_not_judged_while_other_processes_load_the_machine(quick, monkeypatch):
    # As in the test above, but other processes keep 2 cores busy meanwhile: the pool may be
    # slow because of them; it is kept.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.02)
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: 2 * clock.now)
    monkeypatch.setattr(auto_measure, "loader_cpu", lambda pids: 0.0)
    windows = recorded_windows(monkeypatch)
    loader = rloader.DataLoader(Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    assert stepped(loader, clock) == batches(tud.DataLoader(Ints(400), batch_size=2))[0]
    assert chosen(loader) == [0, 4]
    assert windows[-1].others == pytest.approx(2.0)


def tight_budget(monkeypatch):
    """A budget of 300 MiB, each worker process 100 MiB: pools of 2 and 3 do not fit together."""
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "300M")
    monkeypatch.setattr(auto_measure, "process_memory", lambda pid: 100 << 20)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 100 << 20)


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
    dry = rloader.DataLoader(Ints(), batch_size=2, num_workers="auto")
    batches(dry)
    switch = dry.stats()["auto"]["decisions"][2]["batch"]
    fail_at = 2 * switch + 2  # in the batch after the first one the old pool had in flight

    scripted(monkeypatch, [2, None, 3])  # (the same decisions again)
    auto_loader = rloader.DataLoader(Ints(fail_at=fail_at), batch_size=2, num_workers="auto")
    auto = outcomes(auto_loader)
    assert chosen(auto_loader) == [0, 2, 3]
    fixed = outcomes(rloader.DataLoader(Ints(fail_at=fail_at), batch_size=2, num_workers=2))
    assert auto == fixed
    assert f"ValueError: bad sample {fail_at}" in auto[switch + 1]


def test_an_epochs_short_last_window_does_not_judge_a_pool_no_faster(quick, monkeypatch):
    # The pool is faster than the main process (6 ms a batch against 21) until the epoch's
    # last 5 batches, which take 51 ms: the last window after earlier ones is a short tail, too
    # little evidence to send the next epoch back to the main process.
    monkeypatch.setattr(auto_policy, "NO_GAIN_WINDOW_S", 1.0)
    clock = fake_clock(monkeypatch)
    taken = []
    slow_pools(monkeypatch, clock, lambda: 0.05 if len(taken) >= 195 else 0.005)
    loader = rloader.DataLoader(Ints(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    for b in loader:
        taken.append(b)
        clock.now += 0.001
    assert chosen(loader) == [0, 4]
    assert loader.stats()["auto"]["next_num_workers"] is None


def test_the_loaders_own_bookkeeping_is_in_the_consumers_loop(quick, monkeypatch):
    # Deciding takes the consumer's time too (reading /proc, and taking the GIL back from busy
    # thread workers after each read): 0.5 s of it per batch here, against a 1 ms step.
    clock = fake_clock(monkeypatch)
    windows = recorded_windows(monkeypatch)
    real = _auto.AutoIter._decide

    def slow_decide(self):
        clock.now += 0.5
        real(self)

    monkeypatch.setattr(_auto.AutoIter, "_decide", slow_decide)
    loader = rloader.DataLoader(Ints(clock=clock, cost=0.01), batch_size=2, num_workers="auto")
    stepped(loader, clock)
    w = windows[0]
    assert w.user_s / w.batches > 0.3  # (the step alone: 1 ms)


def test_the_memory_probe_reads_a_few_workers_spread_over_a_large_pool():
    assert auto_measure.sampled([7, 8]) == [7, 8]
    assert auto_measure.sampled(list(range(16))) == [0, 5, 10, 15]
    assert len(auto_measure.sampled(list(range(5)))) == auto_measure.PROBED_WORKERS


class PurePython(tud.Dataset):
    """About 0.2 ms of pure Python a sample: loading that holds the GIL."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        total = 0
        for k in range(3000):
            total += k * i
        return total % 997


def probed(load, seconds=0.05):
    """The real GIL probe's ``share()`` over ``seconds`` of ``load()`` calls."""
    probe = _rloader.GilProbe(auto_policy.GIL_PROBE_PERIOD_S)
    try:
        while probe.share()[2] < seconds:
            probe.loading(True)
            try:
                load()
            finally:
                probe.loading(False)
        return probe.share()
    finally:
        probe.stop()


def test_the_gil_probe_tells_loading_that_holds_the_gil_from_loading_that_lets_it_go():
    # A second thread could not take the GIL through pure Python (it is given up only at the
    # switch interval) and took it at once through sleeps. (Loosely: on a busy machine the main
    # process waits for a core after each hand-over, and the probe takes the GIL meanwhile:
    # pure Python read 0.90-0.99 beside 3 busy processes on 2 cores, 1.00 alone.)
    dataset = PurePython(8)
    blocked, observed, _ = probed(lambda: [dataset[i] for i in range(8)])
    assert 0.5 * observed < blocked <= observed
    blocked, observed, _ = probed(lambda: time.sleep(0.001))
    assert blocked < 0.2 * observed


def test_probed_kind():
    kind = auto_policy.probed_kind
    assert kind(0.8, 1.0, auto_policy.GIL_PROBE_S) == "process"
    assert kind(0.79, 1.0, 1.0) is None  # a second thread could run Python for a fifth of it
    assert kind(1.0, 1.0, 0.5 * auto_policy.GIL_PROBE_S) is None  # too little probed


def probe_threads():
    """This process's threads named as the GIL probe's."""
    return thread_names("rloader-gil")


class ScriptedProbe:
    """A GIL probe that reads ``blocked`` of its time blocked, over 1 ms of loading a batch."""

    def __init__(self, blocked):
        self.blocked, self.loading_s, self.stopped = blocked, 0.0, False

    def loading(self, loading):
        assert not self.stopped
        self.loading_s += 0.001 if loading else 0.0

    def share(self):
        return self.blocked * self.loading_s, self.loading_s, self.loading_s

    def stop(self):
        self.stopped = True


class Waiting(PurePython):
    """0.5 ms of waiting a sample: loading that lets its core go."""

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.tensor([i, i * i])


class PurePythonStream(tud.IterableDataset):
    """PurePython's samples as a stream, sharded by worker."""

    def __init__(self, n):
        self.items = PurePython(n)

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, len(self.items), step):
            yield self.items[i]


@pytest.mark.parametrize(
    "loading",
    [
        "holds the GIL",
        "holds its CPU",
        "waits",
        "holds its CPU, processes dear to start",
        "holds its CPU, processes over the budget",
        "holds its CPU, a stream",
    ],
)
def test_worker_type_auto_starts_processes_for_loading_that_holds_the_gil_or_its_cpu(
    monkeypatch, loading
):
    # The main process's loading probed (here a scripted probe): loading that holds the GIL
    # goes to processes without a trial of threads (which would take turns on it); so does
    # loading that lets it go but keeps its core busy (threads would hand it over at each
    # release), where 2 processes win their start back and the budget holds one (an iterable
    # dataset: at its first epoch's end, which ran in the main process); loading that waits,
    # to threads first. The batches are torch's.
    probes = []

    def probe(period_s):
        probes.append(ScriptedProbe(0.95 if loading == "holds the GIL" else 0.05))
        return probes[-1]

    monkeypatch.setattr(_auto.gil_probe._rloader, "GilProbe", probe)
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: None)  # (the machine's load)
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 2)
    # (a short epoch wins a process's start back; a worker process is estimated at 1 GiB)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    dear = loading.endswith("dear to start")
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 1e3 if dear else 1e-4)
    if loading.endswith("over the budget"):
        monkeypatch.setenv(auto_measure.MEMORY_ENV, "512M")  # (threads fit: 8 MiB each)
    # (the window waits for the probe's verdict however long a busy machine stretches it)
    monkeypatch.setattr(auto_policy, "GIL_PROBE_WAIT_S", 60.0)
    if loading != "waits":  # (its CPU share as on a quiet machine: a busy one deschedules it)
        monkeypatch.setattr(auto_measure, "cpu_clock", auto_measure.clock)
    stream = loading.endswith("a stream")
    dataset = (
        Waiting(400) if loading == "waits" else PurePythonStream(400) if stream else PurePython(400)
    )
    loader = rloader.DataLoader(dataset, batch_size=4, num_workers="auto", worker_type="auto")

    def samples(batches):  # (a stream's 2 workers each batch their own shard: the samples)
        got = [b.tolist() for b in batches]
        return sorted(row for b in got for row in b) if stream else got

    expected = samples(tud.DataLoader(dataset, batch_size=4))
    decisions = []
    for _ in range(2):
        assert samples(loader) == expected
        assert all(p.stopped for p in probes)  # (a pool started, or the epoch ended)
        decisions += loader.stats()["auto"]["decisions"]
    auto = loader.stats()["auto"]
    kinds = [d["worker_type"] for d in decisions]
    pools = [d for d in decisions if d["worker_type"] != "main"]
    assert probes and pools, kinds
    assert auto["gil_blocked"] == pytest.approx(0.95 if loading == "holds the GIL" else 0.05)
    assert auto["gil_probed_s"] >= auto_policy.GIL_PROBE_S
    if loading == "waits" or dear or loading.endswith("over the budget"):
        assert pools[0]["worker_type"] == "thread", kinds
        return
    assert {d["worker_type"] for d in pools} == {"process"}, kinds
    if loading == "holds the GIL":
        assert "could not take the GIL in 95% of the loading" in pools[0]["reason"]
    else:
        assert "the loading holds its CPU" in pools[0]["reason"]


def test_an_iterator_dropped_while_probing_ends_the_probes_thread(monkeypatch):
    monkeypatch.setattr(auto_policy, "GIL_PROBE_S", float("inf"))  # (it goes on probing)
    loader = rloader.DataLoader(
        PurePython(400), batch_size=4, num_workers="auto", worker_type="auto"
    )
    it = iter(loader)
    next(it)
    assert it._gil.probe is not None
    # (a thread names itself once it runs)
    assert until(lambda: probe_threads() == ["rloader-gil-pro"]), probe_threads()
    del it
    gc.collect()
    # (its thread, told to end, ends at its next wake)
    assert until(lambda: probe_threads() == []), probe_threads()


def until(condition, seconds=30.0):
    """Whether ``condition()`` held within ``seconds`` (checked every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
