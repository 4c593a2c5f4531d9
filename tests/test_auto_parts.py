"""The auto iterator's parts, each by itself (python/rloader/_auto/): the window accounting
(``Tally``), the GIL probe's session, the kind choice and its trials, prefetch tuning, and what
is read from ``Learned``. A fake clock makes every time the test's number; the engines are
stand-ins that report stage times and progress."""

import threading
import time

import pytest

from rloader._auto import gil_probe, policy
from rloader._auto import measure as auto_measure
from rloader._auto.engines import Engine
from rloader._auto.gil_probe import GilProbeSession
from rloader._auto.kind import KindChoice
from rloader._auto.learned import Learned, idle_floor, per_worker, start_cost
from rloader._auto.prefetch import PrefetchTuning
from rloader._auto.stats import AutoStats
from rloader._auto.window import Tally


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(auto_measure, "clock", clock)
    monkeypatch.setattr(auto_measure, "loading_clock", lambda: (clock.now, 0.0))
    monkeypatch.setattr(auto_measure, "process_clock", clock)
    monkeypatch.setattr(auto_measure, "machine_cpu", lambda: None)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 1 << 30)
    return clock


class _Stats:
    def __init__(self):
        self.stages = dict(fetch_s=0.0, collate_s=0.0, transport_s=0.0, pin_s=0.0)

    def as_dict(self):
        return dict(self.stages)


class StandIn:
    """What the auto iterator reads of an engine's iterator: its stats and progress."""

    def __init__(self, handed=0):
        self._stats = _Stats()
        self._progress = (handed, False)
        self.prefetch = None

    def _set_prefetch_factor(self, prefetch):
        self.prefetch = prefetch


def engine_of(workers=2, kind="thread", handed=0):
    engine = Engine(StandIn(handed), workers, kind, None)
    engine.prefetch = 2 if workers else 0
    return engine


# -- window accounting ----------------------------------------------------------------------


def test_a_tally_counts_the_consumers_steps_and_waits_per_window_and_per_epoch(clock):
    tally = Tally()
    tally.new_epoch()
    tally.reset(None)
    for step, wait in [(0.01, 0.002), (0.03, 0.004)]:
        tally.stepped(clock())  # (the first call: no step before it)
        tally.waited(wait)
        clock.now += wait
        tally.handed(clock())
        clock.now += step
    tally.stepped(clock())
    assert tally.batches == tally.e_batches == 2
    assert tally.wait == pytest.approx(0.006) and tally.user == pytest.approx(0.04)
    assert tally.longest == pytest.approx(0.03) and tally.step() == pytest.approx(0.02)
    tally.reset(None)  # a new window: the epoch's counts go on
    assert (tally.batches, tally.wait, tally.user) == (0, 0.0, 0.0)
    assert tally.last_longest == pytest.approx(0.03) and tally.e_batches == 2
    tally.new_epoch()
    assert tally.mark() == (0, 0.0, 0.0)


def test_a_window_ends_after_its_batches_its_time_and_its_longest_steps(clock):
    tally = Tally()
    tally.reset(None)
    tally.batches = 4
    assert not tally.ended(5, clock.now + 1.0)  # too few batches
    assert not tally.ended(4, clock.now + policy.MIN_WINDOW_S / 2)  # too short
    assert tally.ended(4, clock.now + policy.MIN_WINDOW_S)
    tally.longest = 0.1  # ... at least LONG_STEPS of the consumer's longest step
    assert not tally.ended(4, clock.now + policy.MIN_WINDOW_S)
    assert tally.ended(4, clock.now + policy.LONG_STEPS * 0.1)
    tally.longest = 0.0
    tally.hold_batches, tally.hold_s = 8, 1.0  # a window that goes on holds out for more
    assert not tally.ended(4, clock.now + 2.0)
    tally.batches = 8
    assert not tally.ended(4, clock.now + 0.5) and tally.ended(4, clock.now + 1.0)


def test_the_loadings_cpu_share_leaves_out_its_waits_for_a_core():
    # Loading that held its core for 0.2 s of 1 s and waited 0.8 s for one (two busy
    # processes on 2 cores took it) holds its CPU; loading that slept 0.98 s of 1 s waits
    # (issue #36: descheduling read as waiting, GIL-holding loading went to threads).
    tally = Tally()
    tally.reset(None)
    assert tally.cpu_share() is None  # (nothing loaded)
    tally.loaded(1.0, 0.2, 0.8)
    assert tally.cpu_share() == pytest.approx(1.0)
    tally.reset(None)
    tally.loaded(1.0, 0.02, 0.0)
    tally.loaded(1.0, 0.02, 0.5)  # (woken late from its sleeps: still waiting work)
    assert tally.cpu_share() == pytest.approx(0.04 / 1.5)
    assert policy.holds_cpu(0.2 / (1.0 - 0.8)) and not policy.holds_cpu(tally.cpu_share())


def test_the_loading_clock_is_the_calling_threads_own():
    # Another thread of the process (a training step's) spins 50 ms of CPU time while this
    # one waits for it: the process's CPU time grows by it, this thread's clock does not.
    def spin():
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    cpu0, core_wait0 = auto_measure.thread_clocks()
    process0 = time.process_time()
    other = threading.Thread(target=spin)
    other.start()
    other.join()
    cpu, core_wait = auto_measure.thread_clocks()
    assert time.process_time() - process0 >= 0.05
    assert 0 <= cpu - cpu0 < 0.025 and core_wait >= core_wait0


def test_the_gil_probe_pauses_after_a_busy_window(monkeypatch, clock):
    # While other processes load the machine the probe's verdict is not read, and a probe
    # descheduled with the GIL in hand would stall the loading: it does not ask then. The
    # loading's own CPU share chooses processes without waiting for the probe.
    monkeypatch.setattr(gil_probe._rloader, "GilProbe", Probe)
    learned = Learned()
    learned.cpu_share, learned.base_work = 0.05, 0.01  # (waiting loading: no kind yet)
    choice = choice_of(learned)
    probe = choice.gil.start()
    assert probe is not None
    choice.probe_gil(quiet=False)
    assert choice.gil.start() is None and not probe.stopped  # paused
    choice.probe_gil(quiet=True)  # (a quiet window: it asks again)
    assert choice.gil.start() is probe and learned.kind is None
    learned.cpu_share = 1.0  # the probe observed nothing yet: a busy window need not wait
    choice.probe_gil(quiet=False)
    assert learned.kind == "process" and "holds its CPU" in learned.kind_why and probe.stopped


def test_windows_that_decide_nothing_grow_to_a_bound():
    tally = Tally()
    for _ in range(10):
        tally.grow()
    assert tally.scale == policy.STEADY_GROWTH


def test_what_an_engine_served_is_counted_from_its_start_or_its_first_round(clock):
    tally = Tally()
    tally.e_batches, tally.e_wait, tally.e_user = 20, 2.0, 4.0
    engine = engine_of()
    engine.e_from = (4, 1.0, 1.0)
    assert tally.served(engine) == (16, 1.0, 3.0)
    engine.warm_from = (8, 1.5, 2.0)
    assert tally.served(engine, after_start=True) == (12, 0.5, 2.0)
    engine.warm_from = (20 - policy.MIN_WINDOW + 1, 1.5, 2.0)  # too few batches after it
    assert tally.served(engine, after_start=True) == (16, 1.0, 3.0)


# -- the GIL probe's session ----------------------------------------------------------------


class Probe:
    def __init__(self, period_s):
        self.figures, self.stopped, self.loads = (0.0, 0.0, 0.0), False, []

    def share(self):
        return self.figures

    def loading(self, on):
        self.loads.append(on)

    def stop(self):
        self.stopped = True


def test_the_gil_probe_runs_only_while_the_kind_is_undecided(monkeypatch):
    monkeypatch.setattr(gil_probe._rloader, "GilProbe", Probe)
    learned = Learned()
    assert GilProbeSession(learned, "thread").start() is None  # the user chose the kind
    learned.kind = "process"
    assert GilProbeSession(learned, None).start() is None  # auto chose it already
    learned.kind = None
    session = GilProbeSession(learned, None)
    probe = session.start()
    assert probe is not None and session.start() is probe  # (one per session)
    engine = engine_of(workers=0)
    engine.next = lambda: "batch"
    assert GilProbeSession.loading(engine, probe) == "batch" and probe.loads == [True, False]


def test_the_gil_probes_figures_add_up_across_epochs(monkeypatch):
    monkeypatch.setattr(gil_probe._rloader, "GilProbe", Probe)
    learned = Learned()
    learned.gil = (0.01, 0.02, 0.02)  # an earlier epoch's probe
    session = GilProbeSession(learned, None)
    probe = session.start()
    assert session.read() is None  # (it observed nothing yet)
    probe.figures = (0.02, 0.03, 0.03)
    assert session.read() == pytest.approx((0.03, 0.05, 0.05)) and learned.gil == session.read()
    session.stop()
    assert probe.stopped and session.probe is None


def test_a_window_that_would_start_the_first_pool_waits_for_the_probes_verdict(monkeypatch, clock):
    monkeypatch.setattr(gil_probe._rloader, "GilProbe", Probe)
    learned = Learned()
    session = GilProbeSession(learned, None)
    main = engine_of(workers=0)
    assert session.hold(main, 0.1, 0.0) is None  # no probe runs
    session.start()
    assert session.hold(main, 0.1, 0.0) == pytest.approx(0.1 + policy.GIL_PROBE_S)
    assert session.hold(engine_of(workers=2), 0.1, 0.0) is None  # (a pool's window)
    assert session.hold(main, policy.GIL_PROBE_WAIT_S, 0.0) is None  # waited long enough
    learned.gil = (0.0, policy.GIL_PROBE_S, policy.GIL_PROBE_S)  # probed long enough
    assert session.hold(main, 0.1, 0.0) is None
    assert session.had_its_say(learned.gil, 0.0)
    assert not session.had_its_say(None, 0.0)
    clock.now = policy.GIL_PROBE_WAIT_S
    assert session.had_its_say(None, 0.0)


# -- kind choice and trials -----------------------------------------------------------------


def choice_of(learned=None, batches=1000, persistent=False, kind_fixed=None, budget=1 << 40):
    learned = learned or Learned()
    stats, tally = AutoStats(), Tally()
    return KindChoice(
        learned,
        stats,
        tally,
        GilProbeSession(learned, kind_fixed),
        kind_fixed=kind_fixed,
        persistent=persistent,
        cores=4,
        budget=budget,
        epoch_batches=lambda: batches,
        epoch_ended=lambda: False,
    )


def window_of(loop, main_loop, batches=10):
    return policy.Window(
        batches=batches, wait_s=loop * batches / 2, user_s=loop * batches / 2, work_s=1.0,
        cpu_s=None, workers=2, kind="thread", cores=4, budget=1 << 40, per_worker=1,
        remaining=None, prefetch=2, main_loop=main_loop,
    )  # fmt: skip


def test_a_pool_no_faster_is_remembered_for_its_kind_twice_as_long_each_retry(clock):
    choice = choice_of()
    learned = choice.learned
    pool = engine_of(kind="process")
    assert not choice.no_gain(pool, window_of(0.02, 0.01))
    assert learned.no_gain_epochs["process"] == 2 and choice.no_gain_loop("process") == 0.02
    learned.epochs += 2
    assert choice.no_gain_loop("process") is None  # (retried after 2 epochs)
    assert not choice.no_gain(pool, window_of(0.02, 0.01))
    assert learned.no_gain_epochs["process"] == 4
    # threads somewhat faster than the main process are kept
    assert choice.no_gain(engine_of(kind="thread"), window_of(0.009, 0.01))


def test_threads_whose_work_holds_its_cpu_make_way_for_processes_that_pay_back(clock):
    learned = Learned()
    learned.cpu_share, learned.base_work = 0.9, 0.01
    choice = choice_of(learned)
    threads = engine_of(kind="thread")
    assert choice.processes_affordable(threads)
    assert choice.no_gain(threads, window_of(0.0099, 0.01))  # as fast: they serve to the end
    assert choice.stats.next_kind == "process" and learned.no_gain["thread"][0] == 0.0099
    choice = choice_of(learned)
    assert not choice.no_gain(threads, window_of(0.02, 0.01))  # clearly slower: main process
    assert learned.deferred == 2 and choice.stats.next_workers == 2
    # a few batches an epoch do not win processes' start back
    assert not choice_of(learned, batches=1).processes_affordable(threads)
    # waiting work stays on threads
    learned.cpu_share = 0.1
    assert not choice_of(learned).processes_next(threads)


def test_threads_that_take_turns_on_the_gil_are_processes_next_epoch(clock):
    learned = Learned()
    learned.base_work = 0.01
    choice = choice_of(learned)
    choice.inflation = 2.0  # 2 threads' work took 2× the main process's each
    choice.gil_check(engine_of(kind="thread"))
    assert learned.kind == "process" and choice.stats.next_kind == "process"
    learned = Learned()
    learned.base_work = 0.01
    choice = choice_of(learned, kind_fixed="thread")  # (the user's kind stays)
    choice.inflation = 2.0
    choice.gil_check(engine_of(kind="thread"))
    assert learned.kind is None


def test_threads_that_slow_the_consumers_step_take_the_gil_from_it():
    learned = Learned()
    learned.cpu_share, learned.main_step, learned.main_loop = 0.9, 0.001, 0.002
    choice = choice_of(learned)
    assert not choice.slows_the_consumer()  # (no step measured beside threads)
    choice.thread_step = 0.00124  # below CONSUMER_GIL × the main process's
    assert not choice.slows_the_consumer()
    choice.thread_step = 0.002
    assert choice.slows_the_consumer()
    learned.cpu_share = 0.1  # waiting work hands the GIL back
    assert not choice.slows_the_consumer()


def test_processes_on_trial_follow_threads_short_of_their_promise_and_are_judged(
    monkeypatch, clock
):
    monkeypatch.setattr(policy, "PROCESS_START_S", 1e-6)
    monkeypatch.setattr(auto_measure, "own_memory", lambda: 0)
    learned = Learned()
    learned.cpu_share, learned.base_work, learned.main_loop, learned.epochs = 0.9, 0.01, 0.012, 2
    choice = choice_of(learned)
    threads = engine_of(kind="thread")
    choice.tally.e_batches, choice.tally.e_wait, choice.tally.e_user = 100, 0.6, 0.4
    choice.trial([threads])  # 10 ms a batch where 2 threads promise 5 ms
    assert learned.trial == (2, pytest.approx(0.01)) and learned.kind == "process"
    assert choice.stats.next_kind == "process" and choice.stats.next_workers == 2
    # the next epoch, processes: slower than the threads, so back to threads, once for all
    choice = choice_of(learned)
    choice.tally.e_batches, choice.tally.e_wait, choice.tally.e_user = 100, 0.8, 0.4
    choice.trial([engine_of(kind="process")])
    assert learned.trial is None and learned.tried and learned.kind == "thread"
    assert choice.stats.next_kind == "thread"
    choice.trial([threads])  # (no trial again)
    assert learned.trial is None


# -- prefetch tuning ------------------------------------------------------------------------


def test_prefetch_is_tuned_in_place_or_from_the_next_pool(monkeypatch):
    monkeypatch.setattr(policy, "decide_prefetch", lambda window: (4, "scripted"))
    learned, stats = Learned(), AutoStats()
    tuning = PrefetchTuning(learned, stats, auto=True, fixed=None)
    assert tuning.factor == policy.PREFETCH
    pool = engine_of()
    assert tuning.tune(pool, None) == "prefetch_factor 4: scripted"
    assert pool.it.prefetch == pool.prefetch == stats.prefetch == learned.prefetch == 4
    pinned = engine_of()
    pinned.it._set_prefetch_factor = None  # (a pool whose pin thread owns it: no setter)
    assert tuning.tune(pinned, None).endswith("from the next pool on")
    assert pinned.prefetch_fixed and pinned.prefetch == 2 and tuning.factor == 4
    assert tuning.tune(pinned, None) is None  # (fixed from then on)
    assert tuning.tune(engine_of(workers=0), None) is None  # (the main process)
    # a loader's own prefetch_factor is not tuned; a resumed one starts where it was
    assert PrefetchTuning(learned, stats, auto=False, fixed=3).tune(engine_of(), None) is None
    assert PrefetchTuning(learned, stats, auto=True, fixed=None).factor == 4


# -- what is read from Learned --------------------------------------------------------------


def test_a_workers_start_and_memory_are_measured_else_estimated(clock):
    learned = Learned()
    assert start_cost(learned, "process") == policy.start_cost("process", 1 << 30)
    assert start_cost(learned, "thread") == policy.THREAD_START_S
    learned.start_s = {"process": 0.001, "thread": 0.001}
    # (a process's measured start leaves out the pages copied after it: the estimate bounds it)
    assert start_cost(learned, "process") == policy.start_cost("process", 1 << 30)
    assert start_cost(learned, "thread") == 0.001
    assert per_worker(learned, "process") == 1 << 30  # this process's size, before a measurement
    learned.per_worker = 100 << 20
    assert per_worker(learned, "process") == 100 << 20
    assert per_worker(learned, "thread") == policy.THREAD_COST


def test_the_idle_floor_holds_for_some_epochs_or_seconds(clock):
    learned = Learned()
    assert idle_floor(learned) == 0
    learned.floor = (3, 0, 0.0)
    assert idle_floor(learned) == 3
    learned.epochs = policy.FLOOR_EPOCHS
    assert idle_floor(learned) == 0
    learned.epochs = 0
    clock.now = policy.FLOOR_S
    assert idle_floor(learned) == 0
