"""Datasets (and worker_init_fns) that show what a worker is and does: its seed, its
info, its errors and death, what pickles, its dataset's state."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.utils.data as tud

import rloader

from .samples import INITS


class Failing(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i


def failing_init(worker_id):
    raise KeyError("no init")


class Dies(tud.Dataset):
    """Its worker dies at sample 3: `how` is "exitN" (os._exit(N)), "sysexitN" (sys.exit(N),
    as a library may call), "interrupt" (KeyboardInterrupt raised) or a signal's name (the
    worker sends it to itself), having written when (time.monotonic(), one clock for every
    process) to the file `stamp`, if given: how long the loader took to notice is measured
    from there, not from a start that a loaded machine can make slow."""

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
            if self.how.startswith("exit"):
                os._exit(int(self.how[4:]))
            if self.how.startswith("sysexit"):
                sys.exit(int(self.how[7:]))
            if self.how == "interrupt":
                raise KeyboardInterrupt
            os.kill(os.getpid(), getattr(signal, self.how))
            time.sleep(5)  # (a handled signal, as torch's workers handle SIGSEGV and SIGBUS)
        return i


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
    """Sample 2 comes back from a worker process as a batch that cannot be unpickled."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return Unpicklable(os.getpid()) if i == 2 else i


class RefersToItsLoader(tud.Sampler):
    """A sampler that a test points back at its loader: a reference cycle through the loader's
    iterator."""

    loader = None

    def __len__(self) -> int:
        return 20

    def __iter__(self):
        return iter(range(20))


class SeedOfReader(tud.Dataset):
    """Sample i: (i, the seed of the worker that read it, ``get_worker_info().seed``; -1 in the
    main process), so that a test sees each epoch's worker seeds with its order."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return i, -1 if info is None else info.seed


def draws_generator() -> torch.Generator:
    """Where a sample's random draws come from, as rloader.vision draws them: a thread
    worker's own generator (``get_worker_info().rng``), else torch's global one."""
    info = tud.get_worker_info()
    if info is not None and getattr(info, "worker_method", None) == "thread":
        return info.rng.torch_generator
    return torch.default_generator


class Augmenting(tud.Dataset):
    """Sample i: ``[i, a random draw]`` (as an augmentation makes one). Its state (torchdata's
    convention for a map-style dataset) is where its draws are, in a worker (the main
    process's generator is the user's): resumed from it, a worker draws what it would have."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, int(torch.randint(0, 1 << 30, (), generator=draws_generator()))])

    def state_dict(self):
        return {} if tud.get_worker_info() is None else {"rng": draws_generator().get_state()}

    def load_state_dict(self, state):
        if "rng" in state:
            draws_generator().set_state(state["rng"])


class StateFailsLater(Augmenting):
    """An Augmenting whose ``state_dict()`` raises in a worker after its first ``works``
    calls there (each copy counts its own)."""

    def __init__(self, n, works=5):
        super().__init__(n)
        self.works, self.calls = works, 0

    def state_dict(self):
        if tud.get_worker_info() is not None:
            self.calls += 1
            if self.calls > self.works:
                raise RuntimeError("no state now")
        return super().state_dict()


class StateFails(SeedOfReader):
    """A map-style dataset whose ``state_dict()`` raises (a method it has for another use)."""

    def state_dict(self):
        raise NotImplementedError("no state here")

    def load_state_dict(self, state):
        raise NotImplementedError("no state here")


class StateUnpicklable(SeedOfReader):
    """A map-style dataset whose state does not pickle."""

    def state_dict(self):
        return {"how": lambda: None}

    def load_state_dict(self, state):
        pass


class Whereabouts(tud.Dataset):
    """Where each sample was read: (pid, inode of the container's memfd as the process that
    read it maps it, the item)."""

    def __init__(self, container):
        self.container = container

    def __len__(self):
        return len(self.container)

    def __getitem__(self, i):
        return os.getpid(), self.container._inode, self.container[i]


def record_init(worker_id):
    info = tud.get_worker_info()
    with open(os.environ["RLOADER_TEST_INIT_LOG"], "a") as f:
        f.write(f"{info.num_workers} {worker_id} {info.id} {info.seed}\n")


class UnpicklableDataset(tud.Dataset):
    """A dataset (and keys) that cannot be pickled: worker processes under spawn could not
    take it; threads need nothing pickled."""

    def __init__(self):
        self.lock = threading.Lock()

    def __len__(self):
        return 6

    def __getitem__(self, key):
        with self.lock:
            return key() if callable(key) else key


def counting_init(worker_id):
    """Records, per worker, the thread each worker_init_fn call ran on."""
    key = (os.getpid(), worker_id)
    INITS.setdefault(key, []).append(threading.get_ident())


class LocalErrorDataset(tud.Dataset):
    """Sample 2 raises an exception of a class defined in __getitem__: pickle cannot find it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        class OddError(Exception):  # a type pickle cannot find by name
            pass

        if i == 2:
            raise OddError("sample 2 is odd")
        return i


class SeedReport(tud.Dataset):
    """Where a worker's seeds went: its info's id, num_workers and seed, torch.initial_seed(),
    and one draw of random, numpy and torch's global generators."""

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


class ExitsCleanly(tud.Dataset):
    """Its last sample ends the worker with code 0, once the worker was told to stop."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 7:
            os._exit(0)
        return i


class InfoReport(tud.Dataset):
    """What get_worker_info() says in a worker thread, and whether the fetch runs off the main
    thread."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        theirs = tud.get_worker_info()
        ours = rloader.get_worker_info()
        return (
            theirs is ours,
            theirs.id,
            theirs.num_workers,
            theirs.seed,
            getattr(theirs, "worker_method", None),  # (torch < 2.15 workers have none)
            theirs.dataset is self,
            threading.current_thread() is not threading.main_thread(),
        )


class RngReport(tud.Dataset):
    """A draw from each of a worker's own generators (info.rng), with the worker's id and seed."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        info = tud.get_worker_info()
        rng = info.rng
        fresh = random.Random(info.seed).random()
        return (
            info.id,
            rng.random_generator.random(),
            float(torch.rand((), generator=rng.torch_generator)),
            float(rng.numpy_generator.random()),
            rng.torch_generator.initial_seed() == info.seed,
            fresh,
        )


class AsyncFailing(tud.Dataset):
    """Failing, with ``async def __getitem__``."""

    def __len__(self):
        return 8

    async def __getitem__(self, i):
        if i == 5:
            raise ValueError("sample 5 is broken")
        return i
