"""The soak: many loaders and iterators with faults drawn at random, in one process, checking
that each case ends in bounded time and that nothing it made is left behind.

    python tests/soak.py --iterators 10000 --seed 1     # make soak
    python tests/soak.py --cases 150                    # tests/test_soak.py, in CI

Each case draws an engine (``num_workers=0``, worker processes, worker threads), a dataset kind
(map-style or iterable), persistent workers, ``pin_memory`` through the stand-in driver of
tests/_pinning.py (so the pinned blocks and slots are registered and unregistered for real,
with no accelerator), chaos (a thread that runs ``gc.collect()`` all along, objects whose
``__del__`` collects, iterators dropped in reference cycles so that a collection on any thread
tears their pools down) and one fault:

- ``none``: the epochs run through, and the batches are checked;
- ``raise``: the dataset raises at a random sample (the loader re-raises it, as torch's does);
- ``kill``: a worker process SIGKILLs itself (RuntimeError, as torch's);
- ``break``: the loop stops early and drops the iterator;
- ``interrupt``: SIGINT reaches the main thread mid-epoch (KeyboardInterrupt);
- ``timeout``: a sample waits longer than ``timeout=`` (RuntimeError), then is let go;
- ``resume``: a ``state_dict()`` taken mid-epoch is loaded into a new loader whose epoch
  must give exactly the batches the first one had left.

After each case the loader, its iterator and every batch are dropped and the teardown is
timed: every child process, worker thread, pin thread, shared-memory mapping, descriptor and
pinned registration must be gone within ``--teardown`` seconds (2 s). A case that runs past
``--case-timeout`` dumps every thread's stack and ends the soak (a hang). Every
``--check-every`` cases the memory held is sampled (resident memory less the bytes free inside
malloc's heaps: ``memory_mib``) from the end of the warm-up (``--warmup`` cases, once torch's,
rloader's and the allocators' caches and arenas exist). A leak is judged by the slope of those
samples, not by where they end (``leak_growth``): the growth the run's steady slope accounts for
must stay under ``--rss-growth`` MiB, so that an allocator's one-time step to a plateau (a new
arena, a cache filled once) is not read as a leak, while memory that grows with every iterator
is.

Exit status 0 and a last line ``soak: N cases, M iterators, 0 leaks, 0 hangs, ...`` when
everything held; otherwise the case that failed is printed with what it left or how it ended.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import faulthandler
import gc
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import warnings

import torch
import torch.utils.data as tud

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _children import thread_names  # noqa: E402

import rloader  # noqa: E402
from rloader._pinning import cuda_host, policy  # noqa: E402

from _pinning import Driver  # noqa: E402

FAULTS = ["none", "raise", "kill", "break", "interrupt", "timeout", "resume"]
MAIN_PID = os.getpid()
ITERATORS = [0]  # iterators made so far (a case makes one an epoch, and one more to resume)


class Boom(Exception):
    """The dataset's own exception (the loader re-raises it as it is)."""


class Faulty:
    """What a case's dataset does at its fault sample: nothing, raise, kill its worker process,
    or wait (up to 60 s) until the file ``release`` exists."""

    def __init__(self, fault: str, at: int, release: str) -> None:
        self.fault, self.at, self.release = fault, at, release

    def __call__(self, i: int) -> None:
        if i != self.at:
            return
        if self.fault == "raise":
            raise Boom(f"sample {i}")
        if self.fault == "kill" and os.getpid() != MAIN_PID:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "timeout":
            deadline = time.monotonic() + 60
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.005)


class MapData(tud.Dataset):
    def __init__(self, n: int, fault: Faulty, shape: tuple) -> None:
        self.n, self.fault, self.shape = n, fault, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.fault(i)
        return {"i": i, "x": torch.full(self.shape, float(i))}


class IterData(tud.IterableDataset):
    """Samples 0..n-1, split between workers by id (as torch's docs show)."""

    def __init__(self, n: int, fault: Faulty, shape: tuple) -> None:
        self.n, self.fault, self.shape = n, fault, shape

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            self.fault(i)
            yield {"i": i, "x": torch.full(self.shape, float(i))}


def collect_until(stop: threading.Event) -> None:
    """Runs the garbage collector every 2 ms until `stop` is set (a case's gc thread)."""
    while not stop.wait(0.002):
        gc.collect()


class Collector:
    """Collects from its ``__del__``: a finalizer that runs the garbage collector while
    rloader's objects are being torn down (one of the segfault's suspects)."""

    def __del__(self) -> None:
        gc.collect()


# ------------------------------------------------------------------------- what is left


def children() -> set[int]:
    out: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return out


def shared_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(("memfd:" in line or "/dev/shm/" in line) for line in f)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def memory_mib() -> tuple[float, float]:
    """``(held, resident)`` MiB. Resident memory is read once glibc has handed back what it can
    of freed blocks (malloc_trim). ``held`` is resident memory less the bytes free inside
    malloc's heaps: freed small blocks between live ones cannot be handed back, so a long soak
    fragments the heap and resident memory steps up by tens of MiB while the bytes in use stay
    constant (seen: 114 MiB in use all along, free 34 -> 123 MiB). A leak through malloc grows
    the bytes in use, one through mappings (torch's large tensors, shared memory) grows resident
    memory: either grows ``held``. Without glibc, both are resident memory."""
    free = 0.0
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
        libc.mallinfo2.restype = _MallInfo2
        free = libc.mallinfo2().fordblks / 2**20
    except (OSError, AttributeError):
        pass  # not glibc (or older than 2.33, without mallinfo2)
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return resident - free, resident


def slope(samples: list) -> float:
    """MiB per 1,000 iterators: the least-squares slope of held memory over iterators."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [x for x, _ in samples], [y for _, y in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in samples) / var if var else 0.0


def leak_growth(samples: list) -> float:
    """MiB: what the samples' steady slope adds up to over their span of iterators, from the
    median of the slopes between consecutive samples. A leak grows the memory held between
    every pair of samples, so their median slope is the leak's; a one-time step (or a few)
    raises only the intervals it falls in, and leaves the median at the plateau's slope, ~0."""
    pairs = [(x1 - x0, y1 - y0) for (x0, y0), (x1, y1) in zip(samples, samples[1:]) if x1 > x0]
    if not pairs:
        return 0.0
    steady = statistics.median(dy / dx for dx, dy in pairs)
    return steady * (samples[-1][0] - samples[0][0])


def leftovers(base: dict, driver: Driver | None) -> list[str]:
    """What is still there that was not before the case (empty when all is gone)."""
    left = []
    kids = children()
    if kids:
        left.append(f"child processes {sorted(kids)}")
    ours = [n for n in thread_names() if n.startswith("rloader")]  # Rust threads' OS names
    if ours:
        left.append(f"threads {ours}")
    if threading.active_count() > base["py_threads"]:
        left.append(f"Python threads {[t.name for t in threading.enumerate()]}")
    maps, open_fds = shared_mappings() - base["maps"], fds() - base["fds"]
    if maps > 0:
        left.append(f"{maps} shared mappings")
    if open_fds > 0:
        left.append(f"{open_fds} descriptors")
    if driver is not None and driver.ranges:
        left.append(f"{len(driver.ranges)} pinned registrations")
    return left


# ------------------------------------------------------------------------------ a case


def draw(rng: random.Random) -> dict:
    engine = rng.choice(["main", "process", "thread"])
    fault = rng.choice([f for f in FAULTS if not (f == "kill" and engine != "process")])
    if fault == "timeout" and engine == "main":
        fault = "raise"  # timeout= needs workers (torch refuses it at num_workers=0)
    kind = rng.choice(["map", "map", "iterable"])
    if fault == "resume" and kind == "iterable":
        kind = "map"  # an iterable dataset resumes best effort only: nothing exact to check
    n = rng.randrange(8, 120)
    return {
        "engine": engine,
        "fault": fault,
        "kind": kind,
        "n": n,
        "at": rng.randrange(n),
        "batch_size": rng.choice([1, 3, 8, 16]),
        "num_workers": 0 if engine == "main" else rng.choice([1, 2, 3]),
        "persistent": engine != "main" and rng.random() < 0.4,
        "pin": rng.random() < 0.3,
        "shuffle": kind == "map" and rng.random() < 0.5,
        "epochs": rng.choice([1, 1, 2]),
        # float32 rows of 4 KiB up to 256 KiB: large batches take the batch memory and slots
        "shape": rng.choice([(4,), (1024,), (64, 1024)]),
        # chaos, each on its own: a thread that collects all along; finalizers that collect;
        # the iterator in a reference cycle when dropped, so that a collection (on whichever
        # thread runs it) tears its pool down
        "gc_thread": rng.random() < 0.25,
        "del_collect": rng.random() < 0.25,
        "cycle": rng.random() < 0.25,
        "stop_after": rng.randrange(0, 6),
        "seed": rng.randrange(2**31),
    }


def loader_for(case: dict, dataset, release: str):
    kw = {}
    if case["engine"] != "main":
        kw["num_workers"] = case["num_workers"]
        kw["persistent_workers"] = case["persistent"]
        kw["worker_type"] = case["engine"]
        if case["fault"] == "timeout":
            kw["timeout"] = 0.3
    g = torch.Generator().manual_seed(case["seed"])
    return rloader.DataLoader(
        dataset,
        batch_size=case["batch_size"],
        shuffle=case["shuffle"],
        pin_memory=case["pin"],
        generator=g,
        **kw,
    )


def run_case(case: dict, release: str) -> str:
    """Runs one case; returns what ended it ("ok", or the exception expected of its fault)."""
    fault = Faulty(case["fault"], case["at"], release)
    Data = MapData if case["kind"] == "map" else IterData
    dataset = Data(case["n"], fault, case["shape"])
    loader = loader_for(case, dataset, release)
    kept = []  # some batches outlive their iterator (and the loader, below)
    if case["del_collect"]:
        dataset.collector = Collector()
    try:
        for _epoch in range(case["epochs"]):
            it = iter(loader)
            ITERATORS[0] += 1
            if case["del_collect"]:
                it_collector = Collector()  # noqa: F841  (dropped with the frame)
            if case["cycle"]:
                cycle = [it]
                cycle.append(cycle)
            for b, batch in enumerate(it):
                if b % 3 == 0:
                    kept.append(batch)
                if case["fault"] == "break" and b == case["stop_after"]:
                    break
                if case["fault"] == "interrupt" and b == case["stop_after"]:
                    os.kill(os.getpid(), signal.SIGINT)
                if case["fault"] == "resume" and b == case["stop_after"]:
                    state = loader.state_dict()
                    rest = [x["i"].tolist() for x in it]
                    again = loader_for(
                        case, Data(case["n"], Faulty("none", -1, ""), case["shape"]), ""
                    )
                    again.load_state_dict(state)
                    ITERATORS[0] += 1
                    got = [x["i"].tolist() for x in again]
                    assert got == rest, (case, got, rest)
                    del again
                    break
            del it
        return "ok"
    except Boom:
        return "raise"
    except KeyboardInterrupt:
        return "interrupt"
    except RuntimeError as err:
        text = str(err)
        if "timed out" in text:
            open(release, "w").close()
            return "timeout"
        if "exited unexpectedly" in text:
            return "kill"
        raise
    finally:
        if len(kept) > 4:
            del kept[: len(kept) - 4]  # the others go with the loader, one stays past it
        del loader


def expected(case: dict, ended: str) -> bool:
    """Whether the case ended as its fault says: every sample is fetched, so a raise, a kill or
    a timeout always ends it; an interrupt or a resume does unless the epoch had fewer batches
    than the loop meant to take first."""
    fault = case["fault"]
    if fault in ("raise", "kill", "timeout"):
        return ended == fault
    if fault == "interrupt":
        return ended in ("interrupt", "ok")
    return ended == "ok"


# --------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterators", type=int, default=10000, help="ends once this many are made")
    ap.add_argument("--cases", type=int, default=None, help="or after this many cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teardown", type=float, default=2.0, help="seconds a teardown may take")
    ap.add_argument("--case-timeout", type=float, default=120.0, help="seconds before a hang")
    ap.add_argument("--check-every", type=int, default=100, help="cases between RSS samples")
    ap.add_argument(
        "--rss-growth",
        type=float,
        default=64.0,
        help="MiB the memory held may grow by at its steady slope over the run",
    )
    ap.add_argument("--warmup", type=int, default=30, help="cases before the RSS baseline")
    args = ap.parse_args(argv)

    faulthandler.enable()
    # torch's warning that 3 workers are more than this machine's cores: said once is enough.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="rloader-soak-")
    plan, slot_pinning = policy.pin_plan, cuda_host.slot_pinning
    counts: collections.Counter = collections.Counter()
    worst_teardown = 0.0
    rss_samples: list = []  # (iterators made, held MiB) from the end of the warm-up on
    resident_samples: list = []  # (... resident MiB)
    started = time.monotonic()

    # Warm-up cases (every engine, pinned or not, no fault) make what torch and rloader make
    # once per process (thread pools, caches) before the baseline of descriptors, threads and
    # mappings is taken; every case after must leave the process as it found it.
    warmup = [
        dict(
            draw(random.Random(i)),
            engine=engine,
            num_workers=2,
            fault="none",
            pin=pin,
            gc_thread=False,
            del_collect=False,
            cycle=False,
            persistent=False,
        )
        for i, (engine, pin) in enumerate(
            (e, p) for e in ("main", "process", "thread") for p in (False, True)
        )
    ]
    for case in warmup:
        case["num_workers"] = 0 if case["engine"] == "main" else 2
    base = {"py_threads": threading.active_count(), "maps": 0, "fds": 0}

    number = -len(warmup) - 1
    while True:
        number += 1
        if number >= 0 and (
            (args.cases is not None and number >= args.cases)
            or (args.cases is None and ITERATORS[0] >= args.iterators)
        ):
            break
        case = warmup[number] if number < 0 else draw(rng)
        if number == 0:
            ITERATORS[0] = 0  # the warm-up's do not count
            gc.collect()
            gc.freeze()  # what exists now is never garbage: later collections skip it (fast)
            base = {"py_threads": threading.active_count(), "maps": shared_mappings(), "fds": fds()}
        release = os.path.join(tmp, f"release-{number}")
        driver = None
        if case["pin"]:
            driver = Driver()
            cuda_host.slot_pinning = lambda d=driver: (d.register, d.unregister, lambda: d.fence())
            policy.pin_plan = lambda loader: (lambda b: b) if loader.pin_memory else None
        stop_gc = threading.Event()
        gc_thread = None
        if case["gc_thread"]:
            gc_thread = threading.Thread(target=collect_until, args=(stop_gc,), name="soak-gc")
            gc_thread.start()
        faulthandler.dump_traceback_later(args.case_timeout, exit=True)
        try:
            ended = run_case(case, release)
        except BaseException as err:  # noqa: BLE001 - reported with the case that raised it
            print(f"case {number} {case}: unexpected {type(err).__name__}: {err}", flush=True)
            raise
        finally:
            stop_gc.set()
            if gc_thread is not None:
                gc_thread.join()
        if not expected(case, ended):
            print(f"case {number} {case}: ended with {ended!r}", flush=True)
            return 1
        counts[(case["fault"], ended)] += 1

        # Teardown: everything the case made must go within --teardown seconds.
        t0 = time.monotonic()
        gc.collect()
        deadline = t0 + max(args.teardown, 10.0)
        polls = 0
        while number >= 0 and leftovers(base, driver) and time.monotonic() < deadline:
            time.sleep(0.005)
            polls += 1
            if polls % 100 == 0:
                gc.collect()  # a cycle freed by the last one's finalizers
        took = time.monotonic() - t0
        faulthandler.cancel_dump_traceback_later()
        left = leftovers(base, driver) if number >= 0 else []
        if left or took > args.teardown:
            print(f"case {number} {case}: teardown {took:.2f}s, left: {left}", flush=True)
            return 1
        if os.path.exists(release):
            os.unlink(release)
        cuda_host.slot_pinning, policy.pin_plan = slot_pinning, plan
        if number < 0:
            continue  # a warm-up case
        worst_teardown = max(worst_teardown, took)

        if (number + 1) % args.check_every == 0 or number + 1 == args.warmup:
            held, resident = memory_mib()
            if number + 1 >= args.warmup:
                rss_samples.append((ITERATORS[0], held))
                resident_samples.append((ITERATORS[0], resident))
            print(
                f"soak: {number + 1} cases, {ITERATORS[0]} iterators, "
                f"{time.monotonic() - started:.0f}s, memory held {held:.0f} MiB "
                f"(resident {resident:.0f}), worst teardown {worst_teardown:.3f}s",
                flush=True,
            )
    os.rmdir(tmp)
    held, resident = memory_mib()
    rss_samples.append((ITERATORS[0], held))
    resident_samples.append((ITERATORS[0], resident))
    growth = rss_samples[-1][1] - rss_samples[0][1]
    leaked = leak_growth(rss_samples)
    resident_growth = resident_samples[-1][1] - resident_samples[0][1]
    print(
        "soak: ends by fault (fault, ended): "
        + ", ".join(f"{f}/{e} {n}" for (f, e), n in sorted(counts.items()))
    )
    if leaked > args.rss_growth:
        print(
            f"soak: memory held grew at a steady {leaked:.0f} MiB over the run (limit "
            f"{args.rss_growth}; from first to last sample {growth:+.0f} MiB, resident memory "
            f"{resident_growth:+.0f} MiB)"
        )
        return 1
    print(
        f"soak: {number} cases, {ITERATORS[0]} iterators, 0 leaks, 0 hangs, "
        f"worst teardown {worst_teardown:.3f}s, "
        f"memory held {growth:+.0f} MiB after the warm-up, {leaked:+.0f} MiB of it at a steady "
        f"slope (least squares {slope(rss_samples):+.1f} MiB per 1,000 iterators; resident "
        f"{resident_growth:+.0f} MiB), {time.monotonic() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
