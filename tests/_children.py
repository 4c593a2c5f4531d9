"""Running a script in a child interpreter, and looking at what a loader's workers left
behind (processes, threads named ``rloader-wN``)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_script(
    code: str, timeout: float = 150, own_tmp: bool = False, **kwargs
) -> subprocess.CompletedProcess:
    """`code` (dedented) run by a fresh interpreter from tests/, so that it imports the shared
    modules (`from _datasets import Squares`) and pickles their classes by name. `own_tmp`: its
    TMPDIR is a directory of its own, removed after (torch's killed workers leave their
    multiprocessing temp dirs, pymp-*, behind)."""
    if own_tmp:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**kwargs.pop("env", os.environ), "TMPDIR": tmp}
            return run_script(code, timeout, env=env, **kwargs)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS,
        **kwargs,
    )


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def thread_names(prefix: str = "") -> list:
    """The names of this process's threads that begin with ``prefix``, Python's and Rust's
    (``/proc``: the OS's names, 15 characters at most)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # a thread that ended meanwhile
        if name.startswith(prefix):
            names.append(name)
    return names


def worker_threads() -> list:
    """The names of this process's rloader worker threads (``rloader-wN``) still running."""
    return thread_names("rloader-w")


def no_worker_threads_within(seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while worker_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return not worker_threads()


def interrupt_a_slow_loader(inherited: str, loader_kwargs: dict) -> None:
    """Runs a loader over `Slow` (`loader_kwargs`) in a child process, sends it SIGINT once
    its first batch is awaited, and checks that it got KeyboardInterrupt and ended cleanly.
    `inherited`: the child starts with SIGINT "handled", or "ignored" as under a background
    job."""
    code = f"""
import rloader, signal, sys
from _datasets import Slow
# Ctrl-C reaches a user's process unblocked and handled; start from that whatever the test
# process left. A pytest started as a background job of a shell without job control (a script's
# `make test &`) has SIGINT ignored, exec keeps that, and CPython leaves an ignored SIGINT
# ignored: the child then ran to the end without the interrupt (shown: `trap '' INT` before
# pytest failed this test every time until the two lines below). The masks it inherited are
# printed in case it fails.
masks = [line.strip() for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn"))]
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    it = iter(rloader.DataLoader(Slow(), **{loader_kwargs!r}))
    # The workers started; each sample takes 3 s, so the loop below waits for its first batch
    # when the interrupt comes.
    print("start", *masks, flush=True)
    for _ in it:
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if inherited == "ignored"
        else None,
    )
    started = proc.stdout.readline()  # "start", and the child's signal masks (for a failure)
    assert started.startswith("start"), (started, proc.communicate(timeout=30))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "interrupted" in out, (proc.returncode, started, out, err)
    assert proc.returncode == 0, err


def short_scratch_dir(request) -> str:
    """A temp dir for a child's TMPDIR, removed after the test. Not under tmp_path: children
    that start worker processes put multiprocessing's sockets in TMPDIR, a socket path is at
    most 107 bytes, and pytest-xdist's tmp_path can pass that on its own ("AF_UNIX path too
    long")."""
    scratch = tempfile.mkdtemp(prefix="rl-")
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    return scratch


def count_resources() -> tuple:
    """(child processes, open descriptors, rloader's /dev/shm names) of this process."""
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


def settled_resources() -> tuple:
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
