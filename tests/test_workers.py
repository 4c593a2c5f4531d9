"""Multi-process loading (num_workers > 0) against torch.utils.data as the oracle."""

from __future__ import annotations

import gc
import math
import multiprocessing.util
import os
import random
import signal
import time
import traceback

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _samplers import CountingSampler, FailingSampler, read_past_errors

import rloader
from rloader import _compat

from _compare import same

pytestmark = pytest.mark.timeout(120)

CONTEXTS = ["fork", "spawn", "forkserver"]


def both(dataset, **kwargs):
    theirs = list(tud.DataLoader(dataset, **kwargs))
    ours = list(rloader.DataLoader(dataset, **kwargs))
    return theirs, ours


class Squares(tud.Dataset):
    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i * i)), "i": i, "name": f"s{i}", "a": np.arange(2) + i}


@pytest.mark.parametrize("context", CONTEXTS)
def test_same_batches_as_torch_under_each_start_method(context):
    theirs, ours = both(Squares(), batch_size=4, num_workers=2, multiprocessing_context=context)
    assert same(ours, theirs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=5, drop_last=True),
        dict(batch_size=None),
        dict(batch_size=3, prefetch_factor=1),
        dict(batch_size=2, num_workers=3, prefetch_factor=4),
        dict(batch_sampler=[[3, 1], [0], [5, 6, 7]]),
        dict(batch_size=4, collate_fn=lambda b: [x["i"] for x in b]),
    ],
)
# More workers than this machine's cores, on purpose: torch's warning about it is expected.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_same_batches_as_torch(kwargs):
    kwargs = {"num_workers": 2, **kwargs}
    theirs, ours = both(Squares(), **kwargs)
    assert same(ours, theirs)


def test_shuffle_is_reproducible_and_a_permutation():
    def epoch(seed):
        loader = rloader.DataLoader(
            Squares(50),
            batch_size=8,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(seed),
        )
        return [i for b in loader for i in b["i"].tolist()]

    a = epoch(1)
    assert sorted(a) == list(range(50))
    assert epoch(1) == a and epoch(2) != a


def test_in_order_false_yields_every_batch():
    out = list(rloader.DataLoader(Squares(40), batch_size=4, num_workers=2, in_order=False))
    assert sorted(i for b in out for i in b["i"].tolist()) == list(range(40))


class SeedReport(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return (
            info.id,
            info.num_workers,
            info.seed,
            torch.initial_seed(),
            random.random(),
            float(np.random.random()),
            float(torch.rand(())),
        )


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
    from rloader import _worker_process

    def nested(limit=None):
        return traceback.format_stack(limit=limit), _worker_process._stack_lines_without_source(
            limit=limit
        )

    for limit in (None, 0, 2, -2, 1000):
        full, short = nested(limit)
        # format_stack's entries are 'File ..., line N, in f' then the source line; the same
        # frames, less the source (the calls sit on the same line, so line numbers agree).
        assert short == [entry.split("\n")[0] + "\n" for entry in full]
    assert traceback.format_stack is not _worker_process._stack_lines_without_source
    _worker_process._manual_seed(7)
    assert torch.initial_seed() == 7
    assert traceback.format_stack is not _worker_process._stack_lines_without_source
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


# The documentation's IterableDataset examples.
class MyIterableDataset(tud.IterableDataset):
    def __init__(self, start, end):
        super().__init__()
        self.start, self.end = start, end

    def __iter__(self):
        worker_info = tud.get_worker_info()
        if worker_info is None:
            iter_start, iter_end = self.start, self.end
        else:
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
            iter_start = self.start + worker_info.id * per_worker
            iter_end = min(iter_start + per_worker, self.end)
        return iter(range(iter_start, iter_end))


class PlainRange(tud.IterableDataset):
    def __init__(self, start, end):
        super().__init__()
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_init_fn(worker_id):
    info = tud.get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


# More workers than this machine's cores, on purpose: torch's warning about it is expected.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 2, 12])
def test_documented_iterable_examples(workers):
    ds = MyIterableDataset(start=3, end=7)
    theirs, ours = both(ds, num_workers=workers)
    assert same(ours, theirs)
    if workers == 2:
        assert [t.item() for t in ours] == [3, 5, 4, 6]
    ds = PlainRange(3, 7)
    theirs, ours = both(ds, num_workers=workers, worker_init_fn=split_init_fn)
    assert same(ours, theirs)
    theirs, ours = both(PlainRange(3, 7), num_workers=workers)  # duplicated data, as documented
    assert same(ours, theirs)


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)]
)
def test_iterable_batches_per_worker_like_torch(kwargs):
    theirs, ours = both(PlainRange(0, 10), num_workers=2, **kwargs)
    assert same(ours, theirs)


class InitCount(tud.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return (os.getpid(), INIT_CALLS.get("n", 0))


INIT_CALLS: dict = {}


def counting_init(worker_id):
    INIT_CALLS["n"] = INIT_CALLS.get("n", 0) + 1


def test_persistent_workers_survive_epochs_and_init_once():
    loader = rloader.DataLoader(
        InitCount(),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=counting_init,
    )
    first = list(loader)
    second = list(loader)
    assert {p for p, _ in first} == {p for p, _ in second}
    assert all(n == 1 for _, n in first + second)
    loader._iterator._shutdown_workers()


def test_persistent_workers_on_iterable_dataset():
    loader = rloader.DataLoader(
        PlainRange(0, 6), batch_size=2, num_workers=2, persistent_workers=True
    )
    theirs = tud.DataLoader(PlainRange(0, 6), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert same(list(loader), list(theirs))
    loader._iterator._shutdown_workers()


class Ints(tud.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


# A task of 40,000 indices does not fit in a fresh task ring: iter() queues what fits before the
# workers start and keeps the rest back (rust/rloader-py/src/process/pool.rs, PoolIter::_prefill).
BIG_BATCH = dict(batch_size=40_000, num_workers=2)


def test_batches_larger_than_a_task_ring_like_torch():
    theirs, ours = both(Ints(100_000), shuffle=False, **BIG_BATCH)
    assert same(ours, theirs)


def test_persistent_workers_restarted_before_the_first_batch():
    loader = rloader.DataLoader(Ints(100_000), persistent_workers=True, **BIG_BATCH)
    it = iter(loader)
    assert iter(loader) is it  # a new epoch before the first one was read at all
    assert same(list(it), list(tud.DataLoader(Ints(100_000), **BIG_BATCH)))
    it._shutdown_workers()


class Failing(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i


def test_worker_exception_reraises_with_type_message_and_traceback():
    with pytest.raises(ValueError) as theirs:
        list(tud.DataLoader(Failing(), batch_size=2, num_workers=2))
    with pytest.raises(ValueError) as ours:
        list(rloader.DataLoader(Failing(), batch_size=2, num_workers=2))
    text = str(ours.value)
    assert text.startswith("Caught ValueError in DataLoader worker process 0.")
    assert "sample 5 is broken" in text and "Traceback" in text
    assert str(theirs.value).splitlines()[0] == text.splitlines()[0]


def failing_init(worker_id):
    raise KeyError("no init")


def test_worker_init_fn_error_is_reported():
    with pytest.raises(KeyError, match="in DataLoader worker process"):
        list(rloader.DataLoader(Squares(), num_workers=2, worker_init_fn=failing_init))


class Dies(tud.Dataset):
    """Its worker dies at sample 3 (`how`: "exit" with code 3, or "kill" by SIGKILL), having
    written when (time.monotonic(), one clock for every process) to the file `stamp`, if given:
    how long the loader took to notice is measured from there, not from a start that a loaded
    machine can make slow."""

    def __init__(self, how, stamp=None):
        self.how = how
        self.stamp = stamp

    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 3:
            if self.stamp is not None:
                with open(self.stamp, "w") as f:
                    f.write(repr(time.monotonic()))
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        return i


@pytest.mark.parametrize(
    "how,expected",
    [("exit", "exited unexpectedly with exit code 3"), ("kill", "is killed by signal: Killed")],
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
from test_workers import Dies

def death(lib):
    fd, stamp = tempfile.mkstemp()
    os.close(fd)
    try:
        list(lib.DataLoader(Dies("kill", stamp), batch_size=1, num_workers=2))
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
    import subprocess
    import sys

    script = IGNORED_SIGCHLD.format(tests=os.path.dirname(__file__), body=body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_dead_worker_is_reported_with_sigchld_ignored_as_torch_reports_it():
    # Ignored, SIGCHLD makes the kernel reap the workers: multiprocessing then never sees them
    # end, and rloader waited forever for the batch. torch's iterator puts its own handler over
    # SIG_IGN; rloader gives SIGCHLD its default back, and says what torch says.
    out = run_ignoring_sigchld(
        """
ours, ours_took = death(rloader)
after = signal.getsignal(signal.SIGCHLD)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
theirs, _ = death(tud)
same = ours[0] == theirs[0] and ours[1].startswith(theirs[1])  # then rloader's own hint
print(same, ours_took < 10, after == signal.SIG_DFL, theirs[1])
"""
    )
    assert out == "True True True DataLoader worker (pid PID) is killed by signal: Killed."


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


class ExitsCleanly(tud.Dataset):
    """Its last sample ends the worker with code 0, once the worker was told to stop."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 7:
            os._exit(0)
        return i


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


class Slow(tud.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(3)
        return i


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_timeout_names_the_timeout(worker_type):
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.5 seconds"):
        list(rloader.DataLoader(Slow(), num_workers=1, timeout=0.5, worker_type=worker_type))


def count_resources():
    children = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == os.getpid()]
    fds = len(os.listdir("/proc/self/fd"))
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"rloader-{os.getpid()}-")]
    return len(children), fds, len(shm)


def _ppid(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def settled_resources():
    """count_resources() once earlier tests' garbage is gone: an iterator kept alive by a saved
    exception (a traceback) lets its pin thread, then its pool, go over a few collections."""
    history = []
    for _ in range(50):
        gc.collect()
        multiprocessing.active_children()  # reaps children others terminated without a join
        history.append(count_resources())
        if len(history) >= 3 and history[-1] == history[-2] == history[-3]:
            break
        time.sleep(0.2)
    return history[-1]


@pytest.mark.timeout(600)  # 80 pools of 2 forked workers: minutes on a loaded 2-core machine
def test_abandoned_iterators_leave_nothing_behind():
    before = settled_resources()
    loader = rloader.DataLoader(
        Squares(100), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    for k in range(80):
        it = iter(loader)
        next(it)
        if k % 2:
            del it  # dropped half-consumed
        else:
            for _batch in it:  # or broken out of
                break
            del it
    del _batch  # a batch keeps its pool's memory (not its workers) alive
    gc.collect()
    # The loader keeps one idle region (one descriptor) for its next pool, and only one.
    children, fds, shm = before
    settled = (children, fds + 1, shm)
    deadline = time.monotonic() + 60  # the pools' teardowns, on a loaded machine
    while count_resources() != settled and time.monotonic() < deadline:
        time.sleep(0.2)
        gc.collect()
    assert count_resources() == settled
    del loader
    gc.collect()
    assert count_resources() == before


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_two_iterators_at_once(worker_type):
    loader = rloader.DataLoader(Squares(10), batch_size=2, num_workers=2, worker_type=worker_type)
    a, b = iter(loader), iter(loader)
    assert next(a)["i"].tolist() == [0, 1]
    assert next(b)["i"].tolist() == [0, 1]
    assert [x["i"].tolist() for x in a] == [[2, 3], [4, 5], [6, 7], [8, 9]]


def test_batches_held_by_the_user_stay_valid():
    loader = rloader.DataLoader(Squares(64), batch_size=4, num_workers=2)
    held = list(loader)
    again = list(rloader.DataLoader(Squares(64), batch_size=4, num_workers=0))
    assert same(held, again)


def run_script(code: str, timeout: float = 150, **kwargs):
    import subprocess
    import sys
    import textwrap

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.dirname(__file__),
        **kwargs,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(200)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_exit_when_the_main_process_dies(context):
    done = run_script(f"""
        import os, signal, sys, rloader
        from test_workers import Squares
        it = iter(rloader.DataLoader(Squares(100), batch_size=1, num_workers=2,
                                     multiprocessing_context="{context}"))
        next(it)
        print(" ".join(str(p.pid) for p in it._rloader_pool.procs), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    # A spawned worker may still be importing torch (seconds on a loaded machine) when the main
    # process dies; it notices as soon as its loop starts.
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("pin", [False, True])
def test_interpreter_exit_with_a_live_iterator_is_prompt(pin):
    # Workers are told to leave (their rings closed), not waited out and then terminated: with
    # the join timeout made an hour, a worker that was not told would keep this script, and the
    # test, waiting until run_script's timeout. No wall-clock bound, so load cannot fail it.
    done = run_script(f"""
        import rloader, rloader._pin_policy, rloader._process_pool
        from test_workers import Squares
        rloader._process_pool._JOIN_TIMEOUT = 3600.0
        # Stands in for pinning on a machine without an accelerator (see test_pin_thread.py).
        rloader._pin_policy.pin_plan = lambda loader: (lambda b: b) if loader.pin_memory else None
        it = iter(rloader.DataLoader(Squares(100), batch_size=1, num_workers=2, pin_memory={pin}))
        next(it)
        print(" ".join(str(p.pid) for p in it._rloader_pool.procs), flush=True)
    """)
    assert done.returncode == 0, done.stderr
    pids = done.stdout.split()
    assert len(pids) == 2, done.stdout
    assert not any(_alive(int(p)) for p in pids)


def test_low_fd_limit_still_works():
    done = run_script("""
        import resource, rloader
        from test_workers import Squares
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        loader = rloader.DataLoader(Squares(64), batch_size=4, num_workers=2)
        for epoch in range(5):
            assert sum(len(b["i"]) for b in loader) == 64
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr


def interrupt_a_slow_loader(inherited: str, loader_kwargs: str = "") -> None:
    """Runs a loader over `Slow` (2 workers, `loader_kwargs` added) in a child process, sends it
    SIGINT mid-epoch, and checks that it got KeyboardInterrupt and ended cleanly. `inherited`:
    the child starts with SIGINT "handled", or "ignored" as under a background job."""
    import subprocess
    import sys

    code = f"""
import rloader, signal, sys
from test_workers import Slow
# Ctrl-C reaches a user's process unblocked and handled; start from that whatever the test
# process left. A pytest started as a background job of a shell without job control (a script's
# `make test &`) has SIGINT ignored, exec keeps that, and CPython leaves an ignored SIGINT
# ignored: the child then ran to the end without the interrupt (shown: `trap '' INT` before
# pytest failed this test every time until the two lines below). The masks it inherited are
# printed in case it fails.
masks = [line.strip() for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn"))]
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
signal.signal(signal.SIGINT, signal.default_int_handler)
print("start", *masks, flush=True)
try:
    for _ in rloader.DataLoader(Slow(), num_workers=2, {loader_kwargs}):
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(__file__),
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if inherited == "ignored"
        else None,
    )
    started = proc.stdout.readline()  # "start", and the child's signal masks (for a failure)
    assert started.startswith("start")
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "interrupted" in out, (proc.returncode, started, out, err)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("inherited", ["handled", "ignored"])
def test_ctrl_c_interrupts_cleanly(inherited):
    interrupt_a_slow_loader(inherited)


def test_iterable_dataset_with_in_order_false_ends():
    # Regression: tasks of an exhausted worker must be forgotten in out-of-order mode too.
    out = list(rloader.DataLoader(PlainRange(0, 10), batch_size=3, num_workers=2, in_order=False))
    assert sorted(x for b in out for x in b.tolist()) == sorted(list(range(10)) * 2)


# ---------------------------------------------------------------- when the sampler is advanced
# The Scheduler in rust/rloader-workers/src/scheduler.rs: prefetch_factor * num_workers batches of keys in iter(), then one
# per result handed out, as torch's _try_put_index.


@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("in_order, persistent", [(True, False), (False, False), (True, True)])
def test_keys_are_drawn_as_torch_draws_them(in_order, persistent, worker_type):
    def draws(lib, **ours):
        sampler = CountingSampler(60)
        loader = lib.DataLoader(
            Squares(60),
            batch_size=2,
            sampler=sampler,
            num_workers=2,
            prefetch_factor=3,
            in_order=in_order,
            persistent_workers=persistent,
            **ours,
        )
        counts = []
        for _ in range(2):  # the second epoch restarts the sampler (persistent: same workers)
            sampler.drawn = 0
            it = iter(loader)
            counts.append(sampler.drawn)
            for _ in range(5):
                next(it)
                time.sleep(0.05)  # the workers answer everything in flight meanwhile
                counts.append(sampler.drawn)
        return counts

    ours = draws(rloader, worker_type=worker_type)
    assert ours == draws(tud) == [12, 14, 16, 18, 20, 22] * 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("good, workers, prefetch", [(5, 2, 2), (1, 1, 1), (3, 1, 1), (2, 2, 1)])
def test_a_sampler_error_goes_to_the_user_as_with_torch(good, workers, prefetch, worker_type):
    # torch raises it from the next() whose batch triggered the draw (that batch is lost), then
    # yields what is in flight and ends the epoch once nothing is: never a hang.
    def read(lib, **ours):
        return read_past_errors(
            lib.DataLoader(
                Squares(10),
                batch_size=1,
                sampler=FailingSampler(good),
                num_workers=workers,
                prefetch_factor=prefetch,
                **ours,
            )
        )

    theirs = read(tud)
    assert "IndexError" in theirs
    assert same(read(rloader, worker_type=worker_type), theirs)


# ---------------------------------------------------------------- tasks that wait (NOTE [Unsent])


class Strings(tud.Dataset):
    def __len__(self) -> int:
        return 200_000

    def __getitem__(self, i: int) -> str:
        return "x" * 200 + str(i)


def as_list(batch):
    return batch


@pytest.mark.timeout(25)  # a send that waited for the worker timed out after 30 s
def test_large_tasks_and_large_answers_do_not_wait_on_each_other():
    # 30,000 keys fill most of a task ring and each answer (a 6 MB pickle) streams through the
    # answer ring: the main thread must take answers in while the next task waits for room.
    def first_three(lib):
        loader = lib.DataLoader(
            Strings(), batch_size=30_000, num_workers=1, prefetch_factor=4, collate_fn=as_list
        )
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == 3:
                return out

    assert first_three(rloader) == first_three(tud)


class Unpicklable:
    """Pickles in a worker; fails to unpickle in the main process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __reduce__(self):
        return (_rebuild_only_in_a_worker, (self.pid,))


_MAIN_PID = os.getpid()


def _rebuild_only_in_a_worker(pid: int):
    if os.getpid() == _MAIN_PID:
        raise ValueError("cannot rebuild here")
    return Unpicklable(pid)


class BadAtTwo(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return Unpicklable(os.getpid()) if i == 2 else i


def first_of(batch):
    return batch[0]


@pytest.mark.timeout(30)
def test_a_batch_that_fails_to_unpickle_is_that_batchs_error():
    # torch loses the task and waits forever; rloader raises the error in the batch's turn and
    # goes on.
    loader = rloader.DataLoader(BadAtTwo(), batch_size=1, num_workers=2, collate_fn=first_of)
    assert read_past_errors(loader) == [0, 1, "ValueError", 3, 4, 5, 6, 7]


class RefersToItsLoader(tud.Sampler):
    loader = None

    def __len__(self) -> int:
        return 20

    def __iter__(self):
        return iter(range(20))


def test_a_persistent_loader_in_a_reference_cycle_is_collected():
    # The sampler refers back to the loader, which holds its iterator: a cycle through the
    # iterator's Rust side, which the garbage collector must see through.
    sampler = RefersToItsLoader()
    loader = rloader.DataLoader(
        Squares(20), batch_size=2, sampler=sampler, num_workers=2, persistent_workers=True
    )
    sampler.loader = loader
    it = iter(loader)
    next(it)
    procs = list(it._rloader_pool.procs)
    del it, loader, sampler
    gc.collect()
    assert all(p._closed for p in procs)


class OneSlowSample(tud.Dataset):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int):
        time.sleep(5 if i == 0 else 0.01)
        return i


@pytest.mark.skipif(
    _compat.TORCH < "2.7",
    reason="torch before 2.7 hands in_order=False tasks "
    "round-robin; rloader keeps the newer rule (in_order=False promises no order)",
)
def test_out_of_order_a_slow_worker_holds_only_its_share():
    # torch: with in_order=False a task skips a worker already holding prefetch_factor tasks,
    # so while worker 0 sleeps on sample 0 (holding tasks 0 and 2) worker 1 does all the rest.
    def order(lib):
        loader = lib.DataLoader(OneSlowSample(), batch_size=1, num_workers=2, in_order=False)
        return [int(b) for b in loader]

    for out in (order(tud), order(rloader)):
        assert sorted(out[-2:]) == [0, 2] and sorted(out) == list(range(100))


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
