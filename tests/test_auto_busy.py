"""num_workers="auto" beside other processes that keep the cores busy (issue #36): the
loading's own CPU share (its thread's CPU time, its waits for a core left out) chooses the
kind and bounds the pool, not the machine's load; the GIL probe is read in quiet windows only;
a thread pool's CPU use is its worker threads' own, not that of the process's other threads.
The tests with real busy processes assert on the decisions auto records, never on speed."""

import subprocess
import sys

import pytest
import torch.utils.data as tud
from _auto_helpers import batches, fake_clock, recorded_windows, slow_pools, stepped
from _datasets import LongWaits, PurePython, SquarePairs

import rloader
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy

SPIN = "while True: pass"


@pytest.fixture
def busy_processes(request):
    """Two processes spinning in pure Python beside the test (pinned to no core), killed at
    its end whatever happens."""
    procs = []

    def kill():
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()

    request.addfinalizer(kill)
    for _ in range(2):
        procs.append(subprocess.Popen([sys.executable, "-c", SPIN]))
    return procs


def affordable_processes(monkeypatch):
    """A process pool wins its start back on any epoch here, and the budget holds one: the
    kind is the measurements' choice, not the start's price."""
    monkeypatch.setattr(auto_policy, "PROCESS_START_S", 1e-4)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "1T")


def pools(loader_decisions):
    return [(d["num_workers"], d["worker_type"]) for d in loader_decisions if d["num_workers"]]


def pools_by_epoch(dataset, epochs):
    """The pools an auto loader (``worker_type="auto"``, persistent workers) over ``dataset``
    started or kept in each of ``epochs`` epochs, each epoch's batches checked against torch's."""
    loader = rloader.DataLoader(
        dataset, batch_size=4, num_workers="auto", worker_type="auto", persistent_workers=True
    )
    expected = [b.tolist() for b in tud.DataLoader(dataset, batch_size=4)]
    out = []
    for _ in range(epochs):
        assert [b.tolist() for b in loader] == expected
        out.append(pools(loader.stats()["auto"]["decisions"]))
    return out, loader


def stepped_square_pairs(clock, worker_type: str):
    """An auto loader over `SquarePairs` whose samples cost 10 ms of `clock`, stepped through
    an epoch, whose batches are torch's; the loader, for its decisions."""
    loader = rloader.DataLoader(
        SquarePairs(400, clock=clock, cost=0.01),
        batch_size=2,
        num_workers="auto",
        worker_type=worker_type,
    )
    assert stepped(loader, clock) == batches(tud.DataLoader(SquarePairs(400), batch_size=2))[0]
    return loader


@pytest.mark.parametrize("loading", ["holds its CPU", "waits"])
def test_a_busy_machine_does_not_make_the_loadings_own_cpu_share_read_otherwise(
    monkeypatch, loading
):
    # Other processes keep 2 cores busy (the machine's CPU clock runs at twice the wall's).
    # Loading that held its core a fifth of its time and waited for one the rest holds its
    # CPU: processes at once. Loading that sleeps (2 % of its time on a core) grows a pool of
    # threads past the cores, as on a quiet machine. (Before: no kind was read in a busy
    # window, so threads first; and a busy machine capped waiting loading at the cores.)
    clock = fake_clock(monkeypatch)
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: 2 * clock.now)
    monkeypatch.setattr(auto_measure, "loader_cpu", lambda pids: 0.0)
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 2)
    holds = loading == "holds its CPU"
    cpu, core_wait = (0.2, 0.8) if holds else (0.02, 0.0)
    monkeypatch.setattr(
        auto_measure, "loading_clock", lambda: (cpu * clock.now, core_wait * clock.now)
    )
    affordable_processes(monkeypatch)
    loader = stepped_square_pairs(clock, "auto")
    decisions = loader.stats()["auto"]["decisions"]
    assert decisions[-1]["window"]["others"] == pytest.approx(2.0)
    first = pools(decisions)[0]
    if holds:
        assert first[1] == "process", decisions
        assert "the loading holds its CPU" in decisions[1]["reason"]
    else:
        assert first[1] == "thread" and first[0] > 2, decisions


def test_gil_holding_loading_beside_busy_processes_starts_processes_and_keeps_them(
    monkeypatch, busy_processes
):
    # Pure Python beside two busy processes: its first pool, in its first epoch, is one of
    # processes, and every later epoch's too (issue #36: two epochs of threads first, then
    # processes and threads in turn).
    affordable_processes(monkeypatch)
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 2)
    epochs, loader = pools_by_epoch(PurePython(800), 3)
    assert epochs[0] and epochs[0][0][1] == "process", epochs  # (its first epoch)
    assert {kind for pools in epochs for _, kind in pools} == {"process"}, epochs
    assert loader.stats()["auto"].get("next_worker_type") is None


def test_waiting_loading_beside_busy_processes_grows_past_the_cores(monkeypatch, busy_processes):
    # 2 ms sleeps a sample beside two busy processes on 2 cores: the pool of threads grows
    # past the cores, as on a quiet machine (issue #36: it stayed at 2 threads).
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 2)
    epochs, _ = pools_by_epoch(LongWaits(600), 2)
    assert {kind for pools in epochs for _, kind in pools} == {"thread"}, epochs
    assert max(workers for pools in epochs for workers, _ in pools) > 2, epochs


def test_a_thread_pools_cpu_use_is_its_workers_not_the_training_steps_threads(monkeypatch):
    # The training step's own threads keep 3 cores busy (the process's CPU clock runs at 3x
    # the wall's) while the pool's threads make batches of a few tensors (their own CPU clocks:
    # the pool's ``worker_cpu_s``). The windows read the pool's CPU use from its threads, and
    # loading that spends a fifth of its time on a core grows past the 10 threads that share
    # allows on 2 cores (issue #36: the process's 3 cores, over those threads, held it there and
    # read the threads as running side by side).
    clock = fake_clock(monkeypatch)
    monkeypatch.setattr(auto_measure, "process_clock", lambda: 3 * clock.now)
    monkeypatch.setattr(auto_measure, "loading_clock", lambda: (0.2 * clock.now, 0.0))
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: None)
    monkeypatch.setattr(auto_measure, "usable_cores", lambda: 2)
    slow_pools(monkeypatch, clock, 0.02)  # (each batch from a pool keeps the consumer 20 ms)
    windows = recorded_windows(monkeypatch)
    loader = stepped_square_pairs(clock, "thread")
    pooled = [w for w in windows if w.workers]
    assert pooled, windows
    for w in pooled:
        assert w.process_cores == pytest.approx(3.0)
        assert w.pool_cores is not None and w.pool_cores < 0.1, w
    decisions = loader.stats()["auto"]["decisions"]
    first = pools(decisions)[0]  # (as many as the main process's share allows: 2 / 0.2)
    assert first[1] == "thread" and first[0] in (9, 10), decisions
    assert max(workers for workers, _ in pools(decisions)) > first[0], decisions
