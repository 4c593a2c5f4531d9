"""worker_type="auto": processes or threads (python/rloader/_auto/kind.py and gil_probe.py):
the GIL probe's verdict, threads that take turns on the GIL or slow the consumer, threads no
faster than the main process, and processes on trial."""

import gc
import pickle
import time

import pytest
import torch.utils.data as tud
from _auto_helpers import (
    ScriptedProbe,
    batches,
    fake_clock,
    loader_of,
    probe_threads,
    probed,
    scripted,
    slow_pools,
    stepped,
    ticking_clock,
    until,
)
from _datasets import (
    PurePython,
    PurePythonStream,
    SaysGilFree,
    SquarePairs,
    Waiting,
)

import rloader
from rloader import _auto
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy


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
    # (work that holds its CPU)
    monkeypatch.setattr(auto_measure, "loading_clock", lambda: (auto_measure.clock(), 0.0))
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
        SquarePairs(clock=clock, cost=0.005), batch_size=2, num_workers="auto", worker_type="auto"
    )
    got, it = [], iter(loader)
    for k, b in enumerate(it):
        got.append(b.tolist())
        beside_threads = it._stats.workers > 0
        clock.now += 0.004 if beside_threads and slowed else 0.002
        if uneven and k % (3 if beside_threads else 10) == 0:
            clock.now += 0.028
    assert got == batches(tud.DataLoader(SquarePairs(), batch_size=2))[0]
    assert it._stats.kind == "thread"
    moved = slowed and not loaded
    assert loader.stats()["auto"]["next_worker_type"] == ("process" if moved else None)


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
        SquarePairs(400, clock=clock, cost=0.01),
        batch_size=2,
        num_workers="auto",
        worker_type="auto",
    )
    expected = batches(tud.DataLoader(SquarePairs(400), batch_size=2))[0]
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


@pytest.mark.parametrize(
    "loading",
    [
        "holds the GIL",
        "holds its CPU",
        "waits",
        "holds its CPU, processes dear to start",
        "holds its CPU, processes over the budget",
        "holds its CPU, a stream",
        "holds its CPU, says it lets the GIL go",
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
        monkeypatch.setattr(auto_measure, "loading_clock", lambda: (auto_measure.clock(), 0.0))
    stream = loading.endswith("a stream")
    gil_free = loading.endswith("lets the GIL go")
    dataset = (
        Waiting(400) if loading == "waits"
        else PurePythonStream(400) if stream
        else SaysGilFree(400) if gil_free
        else PurePython(400)
    )  # fmt: skip
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
    if loading == "waits" or dear or loading.endswith("over the budget") or gil_free:
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
