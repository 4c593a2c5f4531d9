"""What ``num_workers="auto"`` reads from the machine (NOTE [Auto workers] in _auto/__init__.py): the
usable cores, processes' memory (PSS, on a thread of its own: ``_MemoryProbe``) and CPU time
from /proc, the memory budget, a batch's bytes, and the clocks: the loading thread's own CPU
time and its waits for a core, and a thread pool's worker threads' own CPU time (tests
replace ``clock``, ``loading_clock``, ``process_clock`` and ``pool_clock`` to make
measurements deterministic)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

import torch

MEMORY_ENV = "RLOADER_AUTO_MAX_MEMORY"
MEMORY_EVERY_S = 5.0  # a pool's workers' PSS is read at its first window, then this often
PROBED_WORKERS = 4  # ... that of at most this many of them (the largest stands for all)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _proc_kb(path: str, field: str) -> Optional[int]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_memory(pid: int) -> Optional[int]:
    """A process's proportional set size (PSS), in bytes; None where /proc does not say."""
    return _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")


def own_memory() -> Optional[int]:
    """This process's resident set size, in bytes (``/proc/self/statm``: cheap, unlike the PSS
    in smaps_rollup, which takes milliseconds to add up)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def parse_bytes(text: str) -> int:
    """``"2G"``, ``"512M"``, ``"1000000"`` → bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    number = text[:-1] if scale != 1 else text
    return int(float(number) * scale)


def memory_budget() -> int:
    """Bytes all workers together may take: ``RLOADER_AUTO_MAX_MEMORY``, else half of the
    memory available now."""
    env = os.environ.get(MEMORY_ENV)
    if env:
        try:
            return parse_bytes(env)
        except ValueError:
            raise ValueError(
                f"{MEMORY_ENV}={env!r}: expected bytes, optionally with K, M, G or T"
            ) from None
    available = _proc_kb("/proc/meminfo", "MemAvailable:")
    return (available or (8 << 30)) // 2


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_cpu() -> Optional[float]:
    """CPU seconds all of the machine's processes have used, summed over its cores (/proc/stat:
    all but idle and iowait; steal, a VM's time taken by others, counts as used)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def loader_cpu(pids: list) -> float:
    """CPU seconds this process (all its threads) and its worker processes ``pids`` have used."""
    times = os.times()
    total = times.user + times.system
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, ValueError, IndexError):
            pass
    return total


def worker_pids(it) -> list:
    """The pids of an engine's worker processes (none for threads or the main process)."""
    pool = getattr(it, "_rloader_pool", None)
    procs = getattr(pool, "procs", None)
    if not procs or getattr(pool, "stopped", False):
        return []
    try:
        return [proc.pid for proc in procs if proc.pid is not None]
    except ValueError:  # closed: the pool stopped meanwhile
        return []


def sampled(pids: list) -> list:
    """At most ``PROBED_WORKERS`` of a pool's pids, spread over it: its workers run the same
    code on the same dataset, and reading them all would cost a core for a while on a large
    pool (smaps_rollup walks each process's page tables: ~11 ms for a process with torch
    imported, more with a large dataset inherited, times 16 workers)."""
    if len(pids) <= PROBED_WORKERS:
        return list(pids)
    step = (len(pids) - 1) / (PROBED_WORKERS - 1)
    return [pids[round(i * step)] for i in range(PROBED_WORKERS)]


class _MemoryProbe:
    """Reads worker processes' PSS on a thread of its own: smaps_rollup takes milliseconds per
    process to add up (11 ms for a process with torch imported, on the 2-core machine), which
    on the consumer's thread would read as waiting. ``request`` asks for a read of some pids;
    ``latest`` is the largest PSS last read among some pids (None before). One per process,
    its thread started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pids: list = []
        self._sizes: dict = {}  # pid: PSS (of the pids asked for last)
        self._thread: Optional[threading.Thread] = None

    def request(self, pids: list) -> None:
        with self._lock:
            self._pids = sampled(pids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rloader-auto-memory", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def latest(self, pids: list) -> Optional[int]:
        sizes = self._sizes
        known = [sizes[pid] for pid in pids if pid in sizes]
        return max(known) if known else None

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pids = self._pids
            sizes = {pid: process_memory(pid) for pid in pids}
            self._sizes = {pid: size for pid, size in sizes.items() if size is not None}


probe = _MemoryProbe()


def batch_nbytes(batch: Any, depth: int = 0) -> int:
    """The bytes of a batch's tensors and arrays (what its batches in flight hold)."""
    if isinstance(batch, torch.Tensor):
        return batch.nelement() * batch.element_size()
    nbytes = getattr(batch, "nbytes", None)  # numpy arrays
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(batch, (str, bytes)):
        return len(batch)
    if depth >= 4:
        return 0
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(item, depth + 1) for item in batch[:4096])
    return 0


class _SchedStat:
    """A thread's ``/proc/thread-self/schedstat``, kept open (read again with ``pread``: a few
    microseconds, where opening it each batch cost more than ``process_time``); closed with
    the thread's locals, reopened in a forked child (the fd names the parent's thread)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def read(self) -> tuple:
        on_core, waiting = os.pread(self.fd, 128, 0).split()[:2]
        return int(on_core) / 1e9, int(waiting) / 1e9

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


_own = threading.local()
_schedstat = True  # (False once /proc did not say: no CONFIG_SCHED_INFO)


def thread_clocks() -> tuple:
    """The calling thread's (CPU seconds, seconds it was runnable but waited for a core): the
    loading's own CPU time, not the training step's threads' nor other processes', and its
    descheduling, which a busy machine adds to its wall time and which says nothing of the
    loading. Where /proc does not say: ``thread_time`` and no waits."""
    global _schedstat
    if _schedstat:
        stat = getattr(_own, "schedstat", None)
        try:
            if stat is None or stat.pid != os.getpid():
                stat = _own.schedstat = _SchedStat()
            return stat.read()
        except (OSError, ValueError):
            _schedstat = False
    return time.thread_time(), 0.0


def pool_cpu(stats: dict) -> Optional[float]:
    """The CPU seconds a thread pool's worker threads spent making this epoch's batches, from
    its iterator's ``stats()`` (``worker_cpu_s``: each thread's own CPU clock, read around each
    batch, NOTE [Worker CPU] in rloader-py's stats.rs): not the training step's threads' nor
    the consumer's, as the process's clock would count them. None for other engines (and an
    async dataset's threads)."""
    return stats.get("worker_cpu_s")


clock = time.perf_counter  # tests replace these to make measurements deterministic
loading_clock = thread_clocks  # the main process's loading is on the consumer's thread
process_clock = time.process_time  # all this process's threads (a thread pool's and the consumer's)
pool_clock = pool_cpu  # a thread pool's worker threads alone
