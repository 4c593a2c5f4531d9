"""num_workers="auto" chooses how many workers: growth, shrinking, the memory budget, the
start of a pool, pools no faster than the main process, and the windows it judges by. A fake
clock that the dataset and the consumer advance makes the measured times the test's numbers
(``_auto_helpers.fake_clock``); the batches are checked against fixed loaders."""

import pytest
import torch.utils.data as tud
from _auto_helpers import (
    N,
    batches,
    chosen,
    fake_clock,
    loader_of,
    recorded_windows,
    scripted,
    slow_pools,
    stepped,
)
from _datasets import (
    ColdSquarePairs,
    Shards,
    SquarePairs,
)

import rloader
from rloader import _auto
from rloader._auto import learned as auto_learned
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy


def test_grows_when_the_dataset_is_slow(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
    it = iter(loader)
    got = []
    for b in it:
        got.append(b.tolist())
        clock.now += 0.001  # the training step: 1 ms against 20 ms of loading per batch
    assert got == batches(tud.DataLoader(SquarePairs(), batch_size=2))[0]
    decisions = loader.stats()["auto"]["decisions"]
    assert decisions[1]["num_workers"] == 4  # work / user asks for more than the 4 cores
    assert "waits on the main process" in decisions[1]["reason"]


@pytest.mark.parametrize(
    "case", ["late in the first epoch", "epoch shorter than a window", "same, not persistent"]
)
def test_a_pool_the_first_epoch_asks_for_starts_the_next(quick, monkeypatch, case):
    # A pool not worth starting late in the first epoch (the rest of the epoch does not win 4
    # starts back, 0.66 s; 4 whole epochs do, 2.9 s), or asked for by an epoch shorter than a
    # window (none ends within it): the next epoch starts on it.
    clock = fake_clock(monkeypatch)
    if case.startswith("late"):
        monkeypatch.setattr(auto_policy, "PROCESS_START_S", 0.5)
        monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    else:
        monkeypatch.setattr(auto_policy, "MIN_WINDOW_S", 1e9)
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01),
        batch_size=2,
        num_workers="auto",
        persistent_workers=not case.endswith("not persistent"),
    )
    assert batches(loader) == batches(tud.DataLoader(SquarePairs(), batch_size=2))
    assert chosen(loader) == [0]
    assert loader.stats()["auto"]["next_num_workers"] == 4
    assert batches(loader) == batches(tud.DataLoader(SquarePairs(), batch_size=2))
    assert chosen(loader) == [4]  # the second epoch starts on the pool


def test_stays_in_process_when_the_consumer_is_the_bottleneck(quick, monkeypatch):
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.0001), batch_size=2, num_workers="auto"
    )
    for _ in loader:
        clock.now += 0.1  # 100 ms steps against 0.2 ms of loading
    assert chosen(loader) == [0]


@pytest.mark.parametrize("slow_step, shrunk", [(0.1, 1), (10.0, 0)])
def test_shrinks_when_the_consumer_is_slow(quick, monkeypatch, slow_step, shrunk):
    # Once the pool is large, the training step becomes the bottleneck: the pool shrinks to
    # one worker; or, when the main process's 10 ms of work per batch would be under 5 % of
    # the step, to none (the main process).
    clock = fake_clock(monkeypatch)
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01), batch_size=1, num_workers="auto"
    )
    got = []
    step = 0.0
    for b in loader:
        got.append(b.tolist())
        if loader.stats()["auto"]["num_workers"] == 4:
            step = slow_step
        clock.now += step
    assert got == batches(tud.DataLoader(SquarePairs(), batch_size=1))[0]
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
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01), batch_size=1, num_workers="auto"
    )
    assert len(batches(loader)[0]) == N
    assert max(chosen(loader)) == 3  # not the 4 cores: 4 × 100 MiB > 300 MiB
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "50M")  # below one worker: none is started
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01), batch_size=1, num_workers="auto"
    )
    assert len(batches(loader)[0]) == N
    assert chosen(loader) == [0]


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


def test_a_pool_no_faster_than_the_main_process_goes_back_and_is_retried_later(quick, monkeypatch):
    # The main process: 20 ms of work and a 1 ms step per batch. A pool of 4 keeps the
    # consumer waiting 20 ms a batch: no faster (its transport costs what it saves). A pool of
    # processes is not judged before it has made an epoch's batches (its first epoch is a
    # start's: each worker faults in what it reads); a fresh pool that served a whole epoch
    # (as each epoch's does without persistent workers) is judged on that epoch.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.02)
    loader = rloader.DataLoader(
        SquarePairs(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
    expected = batches(tud.DataLoader(SquarePairs(400), batch_size=2))[0]
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
        SquarePairs(400, clock=clock, cost=0.01),
        batch_size=2,
        num_workers="auto",
        persistent_workers=True,
    )
    learned = _auto.learned_of(loader)
    learned.workers, learned.kind, learned.epochs = 4, "process", 1
    learned.main_loop, learned.base_work, learned.cpu_share = 0.021, 0.02, 1.0
    expected = batches(tud.DataLoader(SquarePairs(400), batch_size=2))[0]
    assert stepped(loader, clock) == expected
    assert chosen(loader) == [4]
    assert stepped(loader, clock) == expected
    assert chosen(loader) == [4, 0]
    assert "no faster" in loader.stats()["auto"]["decisions"][1]["reason"]


def test_the_start_of_a_pool_is_measured(quick, monkeypatch):
    # Creating the pool takes 0.5 s per worker (fake clock): what the loader's later decisions
    # count per worker started, not the estimate.
    clock = fake_clock(monkeypatch)
    slow_pools(monkeypatch, clock, 0.0, creation=0.5)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 1 << 30)
    windows = recorded_windows(monkeypatch)
    loader = rloader.DataLoader(
        SquarePairs(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
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

    loader = rloader.DataLoader(
        ColdSquarePairs(clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
    stepped(loader, clock)
    first = windows[0]
    assert first.workers == 0
    assert first.wait_s / first.batches == pytest.approx(0.02)
    # ... unless the epoch is too short to leave a window after them
    windows.clear()
    short = rloader.DataLoader(
        ColdSquarePairs(n=10, clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
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
    loader = rloader.DataLoader(
        SquarePairs(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
    assert stepped(loader, clock) == batches(tud.DataLoader(SquarePairs(400), batch_size=2))[0]
    assert chosen(loader) == [0, 4]
    assert windows[-1].others == pytest.approx(2.0)


def test_an_epochs_short_last_window_does_not_judge_a_pool_no_faster(quick, monkeypatch):
    # The pool is faster than the main process (6 ms a batch against 21) until the epoch's
    # last 5 batches, which take 51 ms: the last window after earlier ones is a short tail, too
    # little evidence to send the next epoch back to the main process.
    monkeypatch.setattr(auto_policy, "NO_GAIN_WINDOW_S", 1.0)
    clock = fake_clock(monkeypatch)
    taken = []
    slow_pools(monkeypatch, clock, lambda: 0.05 if len(taken) >= 195 else 0.005)
    loader = rloader.DataLoader(
        SquarePairs(400, clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
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
    loader = rloader.DataLoader(
        SquarePairs(clock=clock, cost=0.01), batch_size=2, num_workers="auto"
    )
    stepped(loader, clock)
    w = windows[0]
    assert w.user_s / w.batches > 0.3  # (the step alone: 1 ms)
