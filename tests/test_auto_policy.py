"""num_workers="auto": its policy (pure functions of a window of measurements:
python/rloader/_auto/policy.py) and what it reads of the machine (measure.py). Each test states
a window and checks the decision."""

import numpy as np
import pytest
import torch
from _auto_helpers import (
    ANY_REASON,
    window,
)
from _datasets import (
    SquarePairs,
)

import rloader
from rloader._auto import measure as auto_measure
from rloader._auto import policy as auto_policy


def test_bad_memory_budget_is_named(monkeypatch):
    monkeypatch.setenv(auto_measure.MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match=auto_measure.MEMORY_ENV):
        iter(rloader.DataLoader(SquarePairs(), num_workers="auto"))


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
    # ... their own threads' cores (``pool_cores``), where measured, not their process's: a
    # training step's threads busy beside them do not make threads that take turns on the
    # GIL read as side by side, nor the other way round (issue #36)
    assert auto_policy.decide(threads._replace(process_cores=6.0, pool_cores=1.1)).no_gain
    assert auto_policy.decide(threads._replace(process_cores=1.1, pool_cores=6.0)) is None
    # ... and the main process starts no such pool until it would be clearly faster
    busy = window(wait_s=0.1, user_s=0.01, work_s=0.1)  # 11 ms a batch
    assert auto_policy.decide(busy._replace(no_gain=0.0105)) is None
    assert auto_policy.decide(busy._replace(no_gain=0.005)).workers > 0
    # threads whose work mostly waits may outnumber the cores
    io = window(wait_s=1.0, user_s=0.0, work_s=1.0, cpu_s=0.01, kind="thread", cores=2)
    assert auto_policy.decide(io).workers == 2 * auto_policy.THREADS_PER_CORE
    # ... on a busy machine too: the share is the loading's own, its waits for a core left
    # out (``Tally.cpu_share``), so other processes do not make it read as waiting, nor the
    # other way round (issue #36: 1 ms sleeps stayed at 2 threads beside busy processes)
    assert auto_policy.decide(io._replace(others=1.0)).workers == 2 * auto_policy.THREADS_PER_CORE
    assert auto_policy.decide(io._replace(others=2.0, cpu_s=0.9)).workers == 2
    # ... and a thread pool's own CPU use, measured, bounds it rather than the main process's
    # share (30 threads of 1 ms sleeps kept 0.15-0.28 of 2 cores busy; the main process's
    # share, 0.067, allowed 29)
    sleeps = window(wait_s=1.0, user_s=0.0, work_s=1.0, cpu_s=0.067, kind="thread", cores=2)
    assert auto_policy.worker_cap(sleeps) == 29
    pool = sleeps._replace(workers=29, wait_s=0.1, work_s=3.0, cpu_s=0.201)
    assert auto_policy.decide(pool) is None  # (at the cap)
    assert auto_policy.decide(pool._replace(process_cores=0.2)).workers == 32
    assert auto_policy.decide(pool._replace(process_cores=2.0)) is None  # (its cores are busy)
    # ... its own threads' (``pool_cores``), where measured: not the training step's threads'
    assert auto_policy.decide(pool._replace(process_cores=2.0, pool_cores=0.2)).workers == 32
    assert auto_policy.decide(pool._replace(process_cores=0.2, pool_cores=2.0)) is None


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


def test_batch_nbytes():

    batch = {"x": torch.zeros(4, 3), "y": [np.zeros(5, dtype=np.int64), "abc"], "n": 3}
    assert auto_measure.batch_nbytes(batch) == 4 * 3 * 4 + 5 * 8 + 3


def test_the_memory_probe_reads_a_few_workers_spread_over_a_large_pool():
    assert auto_measure.sampled([7, 8]) == [7, 8]
    assert auto_measure.sampled(list(range(16))) == [0, 5, 10, 15]
    assert len(auto_measure.sampled(list(range(5)))) == auto_measure.PROBED_WORKERS


def test_probed_kind():
    kind = auto_policy.probed_kind
    assert kind(0.8, 1.0, auto_policy.GIL_PROBE_S) == "process"
    assert kind(0.79, 1.0, 1.0) is None  # a second thread could run Python for a fifth of it
    assert kind(1.0, 1.0, 0.5 * auto_policy.GIL_PROBE_S) is None  # too little probed
