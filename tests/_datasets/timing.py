"""Datasets whose samples take time or wait: slow, sleeping, gated, GIL-holding or
GIL-free, async, and those that say when and where they were fetched."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import torch
import torch.utils.data as tud

from .samples import INITS


class Slow(tud.Dataset):
    """4 samples of 3 s each: a loader that is still running when a test interrupts it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(3)
        return i


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


class SaysGilFree(PurePython):
    """PurePython that says its loading runs without the GIL (as rloader.vision's folders do
    where Rust makes whole batches): ``num_workers="auto"`` takes its word for it."""

    _rloader_loads_without_gil = True


class Waiting(PurePython):
    """0.5 ms of waiting a sample: loading that lets its core go."""

    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.tensor([i, i * i])


class LongWaits(PurePython):
    """2 ms of waiting a sample: loading that clearly lets its core go, its CPU share a few
    percent even beside busy processes (which make each call's CPU time grow: Waiting's
    0.5 ms read 0.1-0.25 on Python 3.9 there)."""

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i, i * i])


class WhoFetches(tud.Dataset):
    """(worker, the thread that fetched the sample, that worker's init calls so far)."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        key = (os.getpid(), tud.get_worker_info().id)
        return key, threading.get_ident(), list(INITS.get(key, []))


class IntraOpThreads(tud.Dataset):
    """What `torch.get_num_threads()` says where each sample is fetched."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.get_num_threads()


class SlowAfterFirst(tud.Dataset):
    """Item 0 at once, every other item after `delay` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i:
            threading.Event().wait(self.delay)
        return torch.tensor([i])


class Gated(tud.Dataset):
    """Index i -> i, after a delay that varies with i; the indices in `gates` wait until their
    gate's file exists, so that a test holds one batch back and others overtake it."""

    def __init__(self, n, gates=None):
        self.n, self.gates = n, dict(gates or {})

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        gate = self.gates.get(i)
        deadline = time.monotonic() + 30
        while gate is not None and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.001 * (i % 4))
        return i


class Sleepy(tud.Dataset):
    """16 samples of (zeros(2), i), each taking ``seconds`` to fetch."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __len__(self):
        return 16

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.zeros(2), i


class SlowThenQuick(Sleepy):
    """32 samples: each of the first 16 takes ``seconds`` to fetch, the others nothing."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return super().__getitem__(i) if i < 16 else (torch.zeros(2), i)


class BurnsCpu(Sleepy):
    """Sleepy's samples, each burning ``seconds`` of its thread's own CPU time in pure Python
    instead of sleeping; ``burned`` holds what each call's thread clock read (a list: worker
    threads' shallow copies share it)."""

    def __init__(self, seconds):
        super().__init__(seconds)
        self.burned: list = []

    def __getitem__(self, i):
        start = time.thread_time()
        while time.thread_time() - start < self.seconds:
            sum(range(1000))
        self.burned.append(time.thread_time() - start)
        return torch.zeros(2), i


class AsyncSleepy(Sleepy):
    """Sleepy, with ``async def __getitem__``."""

    async def __getitem__(self, i):
        time.sleep(self.seconds)  # (blocking on purpose: a known least duration)
        return torch.zeros(2), i


class OneSlowSample(tud.Dataset):
    """Sample 0 takes 5 s, every other 10 ms."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int):
        time.sleep(5 if i == 0 else 0.01)
        return i


class SentFirstBatch(tud.Dataset):
    """Squares whose worker 0 sets ``sent`` on reading its second batch's first index: by then
    it has sent its first batch (a worker answers its tasks one after the other)."""

    def __init__(self, sent, second_batch_start: int) -> None:
        self.sent, self.second_batch_start = sent, second_batch_start

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        info = tud.get_worker_info()
        if info is not None and info.id == 0 and i == self.second_batch_start:
            self.sent.set()
        return i * i


class ZeroWaitsForTheRest(tud.Dataset):
    """Sample 0 waits until every other sample has been fetched: in order, nothing after it
    can be handed out first; out of order, the rest may come while it waits."""

    def __init__(self, n):
        self.n = n
        self.others = threading.Semaphore(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 0:
            for _ in range(self.n - 1):
                assert self.others.acquire(timeout=30)
        else:
            self.others.release()
        return i


class Concurrent(tud.Dataset):
    """Each sample waits until `parties` samples are being fetched at once."""

    def __init__(self, n, parties):
        self.n = n
        self.barrier = threading.Barrier(parties, timeout=30)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.barrier.wait()  # raises BrokenBarrierError if fewer are ever in flight at once
        return i


class CountsFetches(tud.Dataset):
    """1000 samples of 20 ms each, counting the fetches (in a list each worker thread's shallow
    copy shares)."""

    def __init__(self):
        self.calls = [0]  # a list: each worker thread's shallow copy shares it

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        self.calls[0] += 1
        time.sleep(0.02)
        return i


class AllAtOnce(tud.Dataset):
    """Each sample waits until `expected` samples are awaited at the same time (the count is
    in a list: each worker thread has a shallow copy of the dataset, and the list is shared)."""

    def __init__(self, n, expected):
        self.n, self.expected = n, expected
        self.lock = threading.Lock()
        self.in_flight = [0]

    def __len__(self):
        return self.n

    async def __getitem__(self, i):
        with self.lock:
            self.in_flight[0] += 1
        deadline = time.monotonic() + 30
        while self.in_flight[0] < self.expected:
            assert time.monotonic() < deadline, f"only {self.in_flight[0]} samples in flight"
            await asyncio.sleep(0.001)
        return i


class AsyncStuck(tud.Dataset):
    """An async dataset whose samples never finish (30 s each)."""

    def __len__(self):
        return 4

    async def __getitem__(self, i):
        await asyncio.sleep(30)


class WhoBegan(tud.Dataset):
    """Squares that note which workers have begun, and which had when worker 0 fetched the last
    sample of its first batch. (Thread workers share these lists: their copies are shallow.)"""

    def __init__(self, n: int, batch_size: int, wait_for_another: bool = False) -> None:
        self.n, self.batch_size = n, batch_size
        self.began: list = []
        self.at_first_batch: list = []
        self.another = threading.Event()
        self.waited: list = []
        self.wait_for_another = wait_for_another

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        wid = tud.get_worker_info().id
        if wid not in self.began:
            self.began.append(wid)
        if wid != 0:
            self.another.set()
        elif i == 0 and self.wait_for_another:  # bounded: a failure fails, it does not hang
            self.waited.append(self.another.wait(timeout=60))
        if wid == 0 and i == self.batch_size - 1 and not self.at_first_batch:
            self.at_first_batch.append(sorted(self.began))
        return i * i
