"""What only worker processes do (worker_type="process", num_workers > 0): start methods,
seeds, shared-memory transport, a worker's death, SIGCHLD, what a process leaves behind;
torch.utils.data's worker processes are the oracle. Behaviour shared with the other engines is
in test_engines.py."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.util
import os
import threading
import time
import traceback
import warnings

import pytest
import torch
import torch.utils.data as tud
from _children import alive, run_script
from _datasets import (
    BadAtTwo,
    Dies,
    ExitsCleanly,
    FrozenCount,
    Ints,
    LongStrings,
    MadeSamples,
    SeedReport,
    SentFirstBatch,
    Squares,
)
from _samplers import FailingSampler, read_past_errors

import rloader
from rloader import _compat

from _compare import both, same

pytestmark = pytest.mark.timeout(120)

CONTEXTS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize("context", CONTEXTS)
def test_same_batches_as_torch_under_each_start_method(context):
    theirs, ours = both(Squares(), batch_size=4, num_workers=2, multiprocessing_context=context)
    assert same(ours, theirs)


def test_worker_seeds_match_torch():
    torch.manual_seed(123)
    theirs = list(tud.DataLoader(SeedReport(), batch_size=None, num_workers=2))
    torch.manual_seed(123)
    ours = list(rloader.DataLoader(SeedReport(), batch_size=None, num_workers=2))
    assert same(ours, theirs)
    # numpy draws differ between workers
    assert len({row[5] for row in ours[:2]}) == 2


def test_forked_workers_inherit_numpy_random():
    """Workers seed numpy's global generator; numpy.random is imported with rloader, so that
    forked workers do not each import it (15-25 ms of their start here)."""
    import subprocess
    import sys

    script = "import sys, rloader; print('numpy.random' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "True", done.stderr


def test_worker_seeding_keeps_format_stack_but_its_source_lines():
    from rloader._engines.process import worker

    def nested(limit=None):
        return traceback.format_stack(limit=limit), worker._stack_lines_without_source(limit=limit)

    for limit in (None, 0, 2, -2, 1000):
        full, short = nested(limit)
        # format_stack's entries are 'File ..., line N, in f' then the source line; the same
        # frames, less the source (the calls sit on the same line, so line numbers agree).
        assert short == [entry.split("\n")[0] + "\n" for entry in full]
    assert traceback.format_stack is not worker._stack_lines_without_source
    worker._manual_seed(7)
    assert torch.initial_seed() == 7
    assert traceback.format_stack is not worker._stack_lines_without_source
    if not torch.cuda.is_initialized():  # the CUDA seeding was queued with a stack, less its source
        queued = [call for call in torch.cuda._lazy_seed_tracker.get_calls() if call]
        assert queued
        for _, stack in queued:
            assert stack and all(
                entry.startswith("  File ") and entry.count("\n") == 1 for entry in stack
            )


# torch's iterator, failing in its __init__, fails again in its __del__: torch's noise.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_prefetch_factor_zero_fails_at_iter_like_torch():
    draws, texts = [], []
    for lib in (tud, rloader):
        loader = lib.DataLoader(list(range(4)), batch_size=2, num_workers=1, prefetch_factor=0)
        torch.manual_seed(5)
        with pytest.raises(AssertionError) as err:
            iter(loader)
        texts.append(str(err.value))
        draws.append(float(torch.rand(())))  # the seed was drawn before the check, with both
    assert draws[0] == draws[1]
    assert texts[0] == texts[1]  # torch's text (none before torch 2.10)
    if _compat.TORCH >= "2.10":
        assert (
            texts[1] == "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
        )


def test_get_worker_info_is_none_in_the_main_process():
    assert rloader.get_worker_info() is None
    assert tud.get_worker_info() is None


@pytest.mark.parametrize(
    "how,expected",
    [("exit3", "exited unexpectedly with exit code 3"), ("SIGKILL", "is killed by signal: Killed")],
)
def test_dead_worker_is_reported_quickly(how, expected, tmp_path):
    stamp = tmp_path / "died"
    loader = rloader.DataLoader(Dies(how, stamp), batch_size=1, num_workers=2)
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"
    ) as err:
        list(loader)
    # Noticed between two slices of the wait (0.1 s each), not by a timeout: 10 s is room for
    # a loaded machine, not the expected time.
    assert time.monotonic() - float(stamp.read_text()) < 10
    assert expected in str(err.value.__cause__)


IGNORED_SIGCHLD = """
import os, re, signal, sys, tempfile, threading, time
import torch.utils.data as tud, rloader
sys.path.insert(0, {tests!r})
from _datasets import Dies

def death(lib):
    fd, stamp = tempfile.mkstemp()
    os.close(fd)
    try:
        list(lib.DataLoader(Dies("SIGKILL", stamp), batch_size=1, num_workers=2))
    except RuntimeError as err:
        words = [re.sub(r"pid(\\(s\\))? \\d+", r"pid\\1 PID", str(e)) for e in (err, err.__cause__)]
        with open(stamp) as f:
            took = time.monotonic() - float(f.read())  # since the worker died
        os.unlink(stamp)
        return words, took

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
{body}
"""


def run_ignoring_sigchld(body: str) -> str:
    script = IGNORED_SIGCHLD.format(tests=os.path.dirname(__file__), body=body)
    done = run_script(script, timeout=120, own_tmp=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_dead_worker_is_reported_with_sigchld_ignored_as_torch_reports_it():
    # Ignored, SIGCHLD makes the kernel reap the workers: multiprocessing then never sees them
    # end, and rloader waited forever for the batch. torch's iterator puts its own handler over
    # SIG_IGN; rloader gives SIGCHLD its default back, and says what torch says.
    # torch's cause is its SIGCHLD handler's text, or empty when its queue's wait ran out first;
    # or its handler raises that text itself, in the main thread, with no cause (races of
    # torch's own, which a loaded machine shows). rloader's error is always the first form,
    # then a hint of its own.
    killed = "DataLoader worker (pid PID) is killed by signal: Killed."
    out = run_ignoring_sigchld(
        f"""
ours, ours_took = death(rloader)
after = signal.getsignal(signal.SIGCHLD)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
theirs, _ = death(tud)
same = (ours[0] == theirs[0] and theirs[1].strip() in ("", {killed!r})) or (
    theirs[0].strip() == {killed!r} and theirs[1] == "None"
)
print(same, ours_took < 10, after == signal.SIG_DFL, ours[1][:{len(killed)}])
if not same:
    print("ours:", ours, "torch's:", theirs)  # (in the assertion's message)
"""
    )
    assert out == f"True True True {killed}"


def test_a_dead_worker_is_noticed_with_sigchld_ignored_outside_the_main_thread():
    # Outside the main thread no handler can be set: the worker's exit status is lost, and its
    # end is noticed through its sentinel. (torch's iterator waits forever there.)
    out = run_ignoring_sigchld(
        """
result = []
thread = threading.Thread(target=lambda: result.append(death(rloader)))
thread.start()
thread.join(60)
(words, took), = result
print(words[0], "|", "how it ended is lost" in words[1], took < 10)
"""
    )
    assert out == "DataLoader worker (pid(s) PID) exited unexpectedly | True True"


def test_worker_exiting_with_code_0_before_answering_is_reported():
    # The sampler is exhausted before sample 7, so the worker was already sent STOP: exiting
    # is expected of it then, but not with an answer still owed.
    loader = rloader.DataLoader(ExitsCleanly(), batch_size=1, num_workers=2)
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"
    ) as err:
        list(loader)
    assert "that was worker 1" in str(err.value.__cause__)


def exit_with_3_when_done(worker_id):
    # Runs as the worker process finishes, after its last answer: a crash in teardown.
    multiprocessing.util.Finalize(None, os._exit, args=(3,), exitpriority=0)


def test_worker_crashing_after_its_last_answer_costs_nothing():
    loader = rloader.DataLoader(
        Ints(12), batch_size=2, num_workers=2, worker_init_fn=exit_with_3_when_done
    )
    it = iter(loader)
    procs = it._rloader_pool.procs
    batches = [next(it) for _ in range(3)]  # the sampler is exhausted: the workers may leave
    deadline = time.monotonic() + 30
    while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p.exitcode for p in procs] == [3, 3]
    assert same([*batches, *it], list(tud.DataLoader(Ints(12), batch_size=2)))


def test_workers_leave_once_their_last_task_is_answered():
    loader = rloader.DataLoader(Ints(12), batch_size=2, num_workers=2)
    it = iter(loader)
    procs = it._rloader_pool.procs
    # Six batches, four in flight: the third next() finds the sampler exhausted.
    first = [next(it) for _ in range(3)]
    deadline = time.monotonic() + 30
    while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Both left with three batches still unread, and those batches are all there.
    assert [p.exitcode for p in procs] == [0, 0]
    assert same([*first, *it], list(tud.DataLoader(Ints(12), batch_size=2, num_workers=2)))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_exit_when_the_main_process_dies(context):
    done = run_script(f"""
        import os, signal, sys, rloader
        from _datasets import Squares
        it = iter(rloader.DataLoader(Squares(100), batch_size=1, num_workers=2,
                                     multiprocessing_context="{context}"))
        next(it), next(it)  # (worker 1 starts when its first batch is awaited)
        print(" ".join(str(p.pid) for p in it._rloader_pool.procs), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    # A spawned worker may still be importing torch (seconds on a loaded machine) when the main
    # process dies; it notices as soon as its loop starts.
    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_low_fd_limit_still_works():
    done = run_script("""
        import resource, rloader
        from _datasets import Squares
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        loader = rloader.DataLoader(Squares(64), batch_size=4, num_workers=2)
        for epoch in range(5):
            assert sum(len(b["i"]) for b in loader) == 64
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr


# ---------------------------------------------------------------- tasks that wait (NOTE [Unsent])


def as_list(batch):
    return batch


@pytest.mark.timeout(25)  # a send that waited for the worker timed out after 30 s
def test_large_tasks_and_large_answers_do_not_wait_on_each_other():
    # 30,000 keys fill most of a task ring and each answer (a 6 MB pickle) streams through the
    # answer ring: the main thread must take answers in while the next task waits for room.
    def first_three(lib):
        loader = lib.DataLoader(
            LongStrings(), batch_size=30_000, num_workers=1, prefetch_factor=4, collate_fn=as_list
        )
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == 3:
                return out

    assert first_three(rloader) == first_three(tud)


def first_of(batch):
    return batch[0]


@pytest.mark.timeout(30)
def test_a_batch_that_fails_to_unpickle_is_that_batchs_error():
    # torch loses the task and waits forever; rloader raises the error in the batch's turn and
    # goes on.
    loader = rloader.DataLoader(BadAtTwo(), batch_size=1, num_workers=2, collate_fn=first_of)
    assert read_past_errors(loader) == [0, 1, "ValueError", 3, 4, 5, 6, 7]


def test_a_failed_first_draw_keeps_the_loaders_region():
    from rloader._loader_record import record_of

    loader = rloader.DataLoader(Squares(10), batch_size=1, sampler=FailingSampler(0), num_workers=2)
    with pytest.raises(IndexError, match="sampler ran out of luck"):
        iter(loader)
    # No worker was started; the next iter() reuses the region.
    assert record_of(loader).region is not None


def _exit_at_start(worker_id):
    os._exit(1)


@pytest.mark.timeout(20)  # the streamed send used to wait 30 s, then call the worker "stuck"
def test_a_worker_dead_before_reading_a_streamed_task_is_reported():
    # 40,000 keys make a task larger than the task ring: it streams, while liveness is checked.
    loader = rloader.DataLoader(
        list(range(100_000)), batch_size=40_000, num_workers=1, worker_init_fn=_exit_at_start
    )
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"
    ) as err:
        list(loader)
    assert "exited unexpectedly with exit code 1" in str(err.value.__cause__)


def _wait_forever() -> None:
    threading.Event().wait()


def _waiting_workers(n: int = 3) -> list:
    """``n`` forked processes that wait until killed, as workers the teardown must stop."""
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_wait_forever, daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    return procs


def _interrupt_first_join(proc, error: BaseException) -> None:
    """``proc.join`` raises ``error`` (Ctrl-C) the first time it is called, then joins."""
    real_join, calls = proc.join, []

    def join(timeout=None):
        calls.append(timeout)
        if len(calls) == 1:
            raise error
        return real_join(timeout)

    proc.join = join


def _stopped_and_reaped(procs: list, pids: list) -> bool:
    return all(proc._closed for proc in procs) and not any(
        os.path.exists(f"/proc/{pid}") for pid in pids
    )


def test_ctrl_c_while_workers_are_joined_still_stops_every_worker():
    # An interrupt during the teardown's first join: the other workers are killed, not left
    # running (nor unjoined: zombies), and then the interrupt goes on.
    from rloader._engines.process import pool as process_pool

    procs = _waiting_workers()
    pids = [proc.pid for proc in procs]
    _interrupt_first_join(procs[0], KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        process_pool._stop_processes(procs)
    assert _stopped_and_reaped(procs, pids)


def test_ctrl_c_again_while_the_workers_are_killed_leaves_no_zombie():
    # A second interrupt while the teardown kills the rest (after one during the first join):
    # every worker is still killed and reaped, and the first interrupt goes on.
    from rloader._engines.process import pool as process_pool

    procs = _waiting_workers()
    pids = [proc.pid for proc in procs]
    first = KeyboardInterrupt("first")
    _interrupt_first_join(procs[0], first)
    _interrupt_first_join(procs[1], KeyboardInterrupt("second"))  # (its kill's wait for it)
    with pytest.raises(KeyboardInterrupt) as raised:
        process_pool._stop_processes(procs)
    assert _stopped_and_reaped(procs, pids)
    assert raised.value is first


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_dataset_that_will_not_pickle_for_a_worker_fails_as_torchs(context):
    # The pickling error, and the warning the installed torch gives with it (newer ones say
    # to try the fork start method; older ones say nothing). The dataset holds a lambda.
    seen = {}
    for lib in (tud, rloader):
        loader = lib.DataLoader(
            MadeSamples(lambda i: i, 4), num_workers=1, multiprocessing_context=context
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(Exception) as err:
                next(iter(loader))
        texts = [str(w.message) for w in caught if "pickle" in str(w.message)]
        seen[lib] = (type(err.value), texts)
    assert seen[rloader] == seen[tud]


# ---------------------------------------------------------------- staged start


def fork_context(start):
    """A fork context whose processes start through ``start(worker_id, real_start)``."""
    base = multiprocessing.get_context("fork")

    class Process(base.Process):  # type: ignore[name-defined,misc]
        def start(self):
            start(self._args[0]["worker_id"], super().start)  # (start() drops _args)

    class Context(type(base)):
        pass

    Context.Process = Process
    return Context()


def start_holding(sent):
    """A fork context whose worker 0's start returns only once that worker has sent its first
    batch: a start slower than the first batch, and no clock to depend on."""

    def start(worker_id, real_start):
        real_start()
        if worker_id == 0:
            sent.wait(timeout=120)  # bounded: a failure fails the test, not hangs it

    return fork_context(start)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("pin", [False, True])
def test_the_first_batch_does_not_wait_for_every_worker_to_start(pin, monkeypatch):
    # NOTE [Staged start]: worker 0 is started in iter(), the others as their batches are
    # awaited (or once the started ones had a start's time to answer). torch starts all four
    # in iter(), so its first batch waits for four starts.
    if pin:  # stood in for as in test_pin_thread.py: the main thread starts, the pin thread waits
        monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: lambda b: b.clone())
    sent = multiprocessing.get_context("fork").Event()
    dataset = SentFirstBatch(sent, second_batch_start=4 * 2)  # batch 4: worker 0's second
    loader = rloader.DataLoader(
        dataset,
        batch_size=2,
        num_workers=4,
        pin_memory=pin,
        multiprocessing_context=start_holding(sent),
    )
    it = iter(loader)
    if pin:
        # The batch reaches the main thread through the pin thread, whose first touch of the
        # driver (CUDA's initialisation, on a GPU) can outlast the grace: none, no clock.
        it._grace = 3600.0
    first = next(it)
    assert len(it._rloader_pool.procs) == 1, "the first batch waited for other workers' starts"
    rest = list(it)
    assert len(it._rloader_pool.procs) == 4
    assert same([first, *rest], list(tud.DataLoader(dataset, batch_size=2, num_workers=4)))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("pin", [False, True])
def test_tasks_larger_than_a_ring_go_to_workers_started_late(pin, monkeypatch):
    # 40,000 indices a task: more than a task ring holds, so each is streamed to its worker;
    # the main process must not wait on a worker it has not started (the pin thread cannot
    # start it) to take a streamed task in.
    if pin:
        monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: lambda b: b.clone())

    def loader():
        return rloader.DataLoader(Ints(160_000), batch_size=40_000, num_workers=4, pin_memory=pin)

    it = iter(loader())
    del it  # (stopped before any wait: nothing may hang)
    gc.collect()
    ours = list(loader())
    assert same(ours, list(tud.DataLoader(Ints(160_000), batch_size=40_000)))


def ints_loader(monkeypatch, pin: bool, n: int, workers: int, context, **kwargs):
    """Batches of 4 of ``Ints(n)`` from ``workers`` started through ``context``; with ``pin``,
    pinning stood in for (as in test_pin_thread.py)."""
    if pin:
        monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: lambda b: b.clone())
    return rloader.DataLoader(
        Ints(n),
        batch_size=4,
        num_workers=workers,
        pin_memory=pin,
        multiprocessing_context=context,
        **kwargs,
    )


def interrupting_start(worker: int):
    """A fork context whose start of ``worker`` raises KeyboardInterrupt once (Ctrl-C during a
    fork), before the process exists."""
    interrupted: list = []

    def start(worker_id, real_start):
        if worker_id == worker and not interrupted:
            interrupted.append(worker_id)
            raise KeyboardInterrupt
        real_start()

    return fork_context(start)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("pin", [False, True])
def test_ctrl_c_during_a_workers_start_leaves_the_epoch_going(pin, monkeypatch):
    loader = ints_loader(monkeypatch, pin, 64, 4, interrupting_start(2))
    it = iter(loader)
    got, interrupts = [], 0
    while True:
        try:
            got.append(next(it))
        except KeyboardInterrupt:
            interrupts += 1
        except StopIteration:
            break
    assert interrupts == 1
    assert same(got, list(tud.DataLoader(Ints(64), batch_size=4)))


def slow_start(worker: int, seconds: float):
    """A fork context whose start of ``worker`` takes at least ``seconds`` (a large process's
    fork, or a spawned worker's imports)."""
    slowed = threading.Event()  # never set: the wait is the slow start

    def start(worker_id, real_start):
        real_start()
        if worker_id == worker:
            slowed.wait(seconds)

    return fork_context(start)


@pytest.mark.parametrize("pin", [False, True])
def test_a_workers_start_is_not_counted_in_the_timeout(pin, monkeypatch):
    # torch starts every worker before its timeout clock runs; here worker 1 starts from a
    # wait (NOTE [Staged start]), and its 2 s start must not time out a 1 s timeout.
    loader = ints_loader(monkeypatch, pin, 16, 2, slow_start(1, 2.0), timeout=1.0)
    assert same(list(loader), list(tud.DataLoader(Ints(16), batch_size=4)))


def test_a_forked_worker_never_collects_the_objects_it_inherited():
    # A fresh worker's first collections traversed the parent's whole heap, and wrote (so
    # copied) its pages: 0.35-1.1 s per worker per epoch under a real training script's heap.
    import gc

    parent_objects = [[i] for i in range(100_000)]  # tracked objects a worker inherits
    before = gc.get_freeze_count()
    loader = rloader.DataLoader(
        FrozenCount(), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    counts = torch.cat(list(loader))
    assert len(counts) == 4 and int(counts.min()) >= len(parent_objects)
    assert gc.get_freeze_count() == before  # the parent's generations are its own
