"""What a loader does whatever fetches its samples: each test runs on every engine it applies
to (the `engine` fixture, tests/conftest.py: the main process, worker processes, worker
threads), torch.utils.data being the oracle (its worker processes stand in for threads).
What only one engine has is in test_worker_processes.py and test_worker_threads.py."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
import weakref

import pytest
import torch
import torch.utils.data as tud
from _children import (
    alive,
    count_resources,
    interrupt_a_slow_loader,
    no_worker_threads_within,
    run_script,
    settled_resources,
    worker_threads,
)
from _datasets import (
    INITS,
    Failing,
    IntraOpThreads,
    Ints,
    MyIterableDataset,
    OneSlowSample,
    PlainRange,
    RefersToItsLoader,
    Slow,
    Squares,
    WhoFetches,
    counting_init,
    failing_init,
    split_init_fn,
)
from _samplers import CountingSampler, FailingSampler, read_past_errors

import rloader
from rloader import _compat

from _compare import both, same

pytestmark = pytest.mark.timeout(120)

WORKERS = pytest.mark.parametrize("engine", ["process", "thread"], indirect=True)
"""The worker engines only: the behaviour needs workers (persistent ones, their errors, ...)."""

FORKED = {"process": {"multiprocessing_context": "fork"}}
"""Worker processes forked (threads take no start method)."""


def stop_workers(it) -> None:
    """Stops a persistent iterator's workers now, rather than when it is collected."""
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    else:
        it._rloader_pool.stop()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
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
def test_same_batches_as_torch(engine, kwargs):
    theirs, ours = both(Squares(), engine, **kwargs)
    assert same(ours, theirs)


def test_shuffled_batches_are_rloaders_order_on_every_engine(engine):
    # rloader's random orders are its own (a permutation of torch's samples), and the same
    # whichever engine fetches the samples.
    def loader(lib, **kwargs):
        generator = torch.Generator().manual_seed(7)
        return lib.DataLoader(Squares(), batch_size=4, shuffle=True, generator=generator, **kwargs)

    ours = list(loader(rloader, **engine.kwargs()))
    assert same(ours, list(loader(rloader, num_workers=0)))
    theirs = list(loader(tud, **engine.torch_kwargs()))
    indices = sorted(i for b in ours for i in b["i"].tolist())
    assert indices == sorted(i for b in theirs for i in b["i"].tolist()) == list(range(37))


def test_shuffle_is_reproducible_and_a_permutation(engine):
    def epoch(seed):
        loader = rloader.DataLoader(
            Squares(50),
            batch_size=8,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
            **engine.kwargs(),
        )
        return [i for b in loader for i in b["i"].tolist()]

    a = epoch(1)
    assert sorted(a) == list(range(50))
    assert epoch(1) == a and epoch(2) != a


def test_in_order_false_yields_every_batch(engine):
    loader = rloader.DataLoader(Squares(40), batch_size=4, in_order=False, **engine.kwargs())
    assert sorted(i for b in loader for i in b["i"].tolist()) == list(range(40))


@WORKERS
@pytest.mark.skipif(
    _compat.TORCH < "2.7",
    reason="torch before 2.7 hands in_order=False tasks "
    "round-robin; rloader keeps the newer rule (in_order=False promises no order)",
)
def test_out_of_order_a_slow_worker_holds_only_its_share(engine):
    # torch: with in_order=False a task skips a worker already holding prefetch_factor tasks,
    # so while worker 0 sleeps on sample 0 (holding tasks 0 and 2) worker 1 does all the rest.
    def order(lib, kwargs):
        loader = lib.DataLoader(OneSlowSample(), batch_size=1, in_order=False, **kwargs)
        return [int(b) for b in loader]

    for out in (order(tud, engine.torch_kwargs()), order(rloader, engine.kwargs())):
        assert sorted(out[-2:]) == [0, 2] and sorted(out) == list(range(100))


def test_two_iterators_at_once(engine):
    loader = rloader.DataLoader(Squares(10), batch_size=2, **engine.kwargs())
    a, b = iter(loader), iter(loader)
    assert next(a)["i"].tolist() == [0, 1]
    assert next(b)["i"].tolist() == [0, 1]
    assert [x["i"].tolist() for x in a] == [[2, 3], [4, 5], [6, 7], [8, 9]]


# A task of 40,000 indices does not fit in a fresh task ring of worker processes: iter() queues
# what fits before the workers start and keeps the rest back (PoolIter::_prefill,
# rust/rloader-py/src/process/pool/mod.rs).
BIG_BATCH = dict(batch_size=40_000)


def test_batches_larger_than_a_task_ring_like_torch(engine):
    theirs, ours = both(Ints(100_000), engine, shuffle=False, **BIG_BATCH)
    assert same(ours, theirs)


def test_batches_held_by_the_user_stay_valid(engine):
    held = list(rloader.DataLoader(Squares(64), batch_size=4, **engine.kwargs()))
    again = list(rloader.DataLoader(Squares(64), batch_size=4, num_workers=0))
    assert same(held, again)


# ---------------------------------------------------------------- iterable datasets


# More workers than this machine's cores, on purpose: torch's warning about it is expected.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize(
    "engine, workers",
    [("main", 0), ("process", 2), ("process", 12), ("thread", 2), ("thread", 12)],
    indirect=["engine"],
)
def test_documented_iterable_examples(engine, workers):
    theirs, ours = both(MyIterableDataset(start=3, end=7), engine, num_workers=workers)
    assert same(ours, theirs)
    if workers == 2:  # each worker's share, in turn
        assert [t.item() for t in ours] == [3, 5, 4, 6]
    theirs, ours = both(PlainRange(3, 7), engine, num_workers=workers, worker_init_fn=split_init_fn)
    assert same(ours, theirs)
    theirs, ours = both(PlainRange(3, 7), engine, num_workers=workers)  # duplicated, as documented
    assert same(ours, theirs)


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)]
)
def test_iterable_batches_per_worker_like_torch(engine, kwargs):
    theirs, ours = both(PlainRange(0, 10), engine, **kwargs)
    assert same(ours, theirs)


def test_iterable_dataset_with_in_order_false_ends(engine):
    # Regression: tasks of an exhausted worker must be forgotten in out-of-order mode too.
    kwargs = engine.kwargs()
    out = list(rloader.DataLoader(PlainRange(0, 10), batch_size=3, in_order=False, **kwargs))
    copies = max(1, kwargs["num_workers"])  # each worker yields the whole range
    assert sorted(x for b in out for x in b.tolist()) == sorted(list(range(10)) * copies)


# ---------------------------------------------------------------- persistent workers


@WORKERS
def test_persistent_workers_survive_epochs_and_init_once(engine):
    INITS.clear()
    loader = rloader.DataLoader(
        WhoFetches(),
        batch_size=None,
        worker_init_fn=counting_init,
        **engine.kwargs(persistent_workers=True),
    )
    first, second = list(loader), list(loader)
    workers = {(tuple(key), thread) for key, thread, _ in first}  # (batch_size=None: lists)
    assert workers == {(tuple(key), thread) for key, thread, _ in second} and len(workers) == 2
    # Each worker ran worker_init_fn once, on the thread that fetches its samples.
    assert all(inits == [thread] for _, thread, inits in first + second)
    # Still there between epochs, gone once stopped.
    procs = list(getattr(loader._iterator._rloader_pool, "procs", []))
    assert len(worker_threads()) == (2 if engine.name == "thread" else 0)
    assert len(procs) == (2 if engine.name == "process" else 0)
    assert all(p.is_alive() for p in procs)
    stop_workers(loader._iterator)
    assert not worker_threads()
    assert all(p._closed for p in procs)  # joined and closed


@WORKERS
def test_persistent_workers_restarted_before_the_first_batch(engine):
    kwargs = engine.kwargs(persistent_workers=True, **BIG_BATCH)
    loader = rloader.DataLoader(Ints(100_000), **kwargs)
    it = iter(loader)
    assert iter(loader) is it  # a new epoch before the first one was read at all
    assert same(list(it), list(tud.DataLoader(Ints(100_000), num_workers=2, **BIG_BATCH)))
    stop_workers(it)


def count_init(counter) -> None:
    with counter.get_lock():
        counter.value += 1


@pytest.mark.parametrize("engine", ["process", "thread"], indirect=True)
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("persistent", [False, True])
def test_every_worker_runs_its_init_even_when_the_epoch_needs_fewer(persistent, engine):
    # One batch for four workers: torch starts all four, each runs worker_init_fn.
    def epoch(lib):
        counter = multiprocessing.get_context("fork").Value("i", 0)
        kwargs = dict(
            batch_size=2,
            persistent_workers=persistent,
            worker_init_fn=lambda _: count_init(counter),
        )
        if lib is rloader:
            kwargs = engine.kwargs(4, **FORKED.get(engine.name, {}), **kwargs)
        else:
            kwargs = engine.torch_kwargs(4, multiprocessing_context="fork", **kwargs)
        loader = lib.DataLoader(Squares(2), **kwargs)
        batches = list(loader)
        if persistent:
            stop_workers(loader._iterator)  # (the others were joined at the epoch's end)
        return batches, counter.value

    ours, theirs = epoch(rloader), epoch(tud)
    assert same(ours[0], theirs[0])
    assert ours[1] == theirs[1] == 4


@WORKERS
def test_persistent_workers_on_iterable_dataset(engine):
    loader = rloader.DataLoader(
        PlainRange(0, 6), batch_size=2, **engine.kwargs(persistent_workers=True)
    )
    theirs = tud.DataLoader(PlainRange(0, 6), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(3):
        assert same(list(loader), list(theirs))
    stop_workers(loader._iterator)


@WORKERS
def test_persistent_workers_restart_after_an_abandoned_epoch(engine):
    loader = rloader.DataLoader(Squares(20), batch_size=2, **engine.kwargs(persistent_workers=True))
    it = iter(loader)
    next(it)
    assert same(list(loader), list(rloader.DataLoader(Squares(20), batch_size=2)))
    stop_workers(loader._iterator)


@WORKERS
@pytest.mark.parametrize("via", ["sampler", "dataset"])
def test_a_persistent_loader_in_a_reference_cycle_is_collected(engine, via):
    # The sampler (or the dataset) refers back to the loader, which holds its iterator: a cycle
    # through the iterator's Rust side, which the garbage collector must see through. Worker
    # threads hold their copies of the dataset (NOTE [Worker slots]).
    sampler = RefersToItsLoader()
    dataset = Squares(20)
    loader = rloader.DataLoader(
        dataset, batch_size=2, sampler=sampler, **engine.kwargs(persistent_workers=True)
    )
    (sampler if via == "sampler" else dataset).loader = loader
    it = iter(loader)
    next(it)
    procs = list(getattr(it._rloader_pool, "procs", []))  # (thread workers: none)
    del it, loader, sampler, dataset
    gc.collect()
    assert all(p._closed for p in procs)
    assert no_worker_threads_within()


@WORKERS
def test_a_loader_in_a_reference_cycle_is_collected_before_its_first_batch(engine):
    # The workers not started yet (NOTE [Staged start], NOTE [Thread start]) hold the dataset
    # where the collector sees it.
    dataset = Squares(20)
    loader = rloader.DataLoader(dataset, batch_size=2, **engine.kwargs(persistent_workers=True))
    dataset.loader = loader
    it = iter(loader)
    procs = list(getattr(it._rloader_pool, "procs", []))
    del it, loader, dataset
    gc.collect()
    assert all(p._closed for p in procs)
    assert no_worker_threads_within()


# ---------------------------------------------------------------- errors


@WORKERS
def test_a_workers_exception_reraises_with_type_message_and_traceback(engine):
    with pytest.raises(ValueError) as theirs:
        list(tud.DataLoader(Failing(), batch_size=2, **engine.torch_kwargs()))
    with pytest.raises(ValueError) as ours:
        list(rloader.DataLoader(Failing(), batch_size=2, **engine.kwargs()))
    text = str(ours.value)
    assert text.startswith(f"Caught ValueError in DataLoader {engine.worker_words} 0.")
    assert "sample 5 is broken" in text and "Traceback" in text
    first_line = str(theirs.value).splitlines()[0]
    assert first_line.replace("worker process", engine.worker_words) == text.splitlines()[0]


def test_the_loader_goes_on_after_a_samples_exception(engine):
    # As with torch: the error is that batch's, the others still come.
    ours = read_past_errors(rloader.DataLoader(Failing(), batch_size=2, **engine.kwargs()))
    theirs = read_past_errors(tud.DataLoader(Failing(), batch_size=2, **engine.torch_kwargs()))
    assert "ValueError" in theirs
    assert same(ours, theirs), (ours, theirs)


@WORKERS
def test_worker_init_fn_error_is_reported(engine):
    with pytest.raises(KeyError, match=f"in DataLoader {engine.worker_words}"):
        list(rloader.DataLoader(Squares(), worker_init_fn=failing_init, **engine.kwargs()))


@WORKERS
def test_timeout_names_the_timeout(engine):
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.5 seconds"):
        list(rloader.DataLoader(Slow(), **engine.kwargs(1, timeout=0.5)))


# ---------------------------------------------------------------- when the sampler is advanced
# The Scheduler in rust/rloader-workers/src/scheduler.rs: prefetch_factor * num_workers batches of keys in iter(), then one
# per result handed out, as torch's _try_put_index.


@WORKERS
@pytest.mark.parametrize("in_order, persistent", [(True, False), (False, False), (True, True)])
def test_keys_are_drawn_as_torch_draws_them(in_order, persistent, engine):
    def draws(lib, kwargs):
        sampler = CountingSampler(60)
        loader = lib.DataLoader(
            Squares(60),
            batch_size=2,
            sampler=sampler,
            in_order=in_order,
            **kwargs,
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

    kwargs = dict(prefetch_factor=3, persistent_workers=persistent)
    ours = draws(rloader, engine.kwargs(**kwargs))
    assert ours == draws(tud, engine.torch_kwargs(**kwargs)) == [12, 14, 16, 18, 20, 22] * 2


@pytest.mark.timeout(30)
@WORKERS
@pytest.mark.parametrize("good, workers, prefetch", [(5, 2, 2), (1, 1, 1), (3, 1, 1), (2, 2, 1)])
def test_a_sampler_error_goes_to_the_user_as_with_torch(good, workers, prefetch, engine):
    # torch raises it from the next() whose batch triggered the draw (that batch is lost), then
    # yields what is in flight and ends the epoch once nothing is: never a hang.
    def read(lib, kwargs):
        return read_past_errors(
            lib.DataLoader(Squares(10), batch_size=1, sampler=FailingSampler(good), **kwargs)
        )

    theirs = read(tud, engine.torch_kwargs(workers, prefetch_factor=prefetch))
    assert "IndexError" in theirs
    assert same(read(rloader, engine.kwargs(workers, prefetch_factor=prefetch)), theirs)


# ---------------------------------------------------------------- the end of a process


@WORKERS
@pytest.mark.parametrize("inherited", ["handled", "ignored"])
def test_ctrl_c_interrupts_cleanly(inherited, engine):
    interrupt_a_slow_loader(inherited, engine.kwargs())


@pytest.mark.parametrize(
    "engine, pin, persistent",
    [("process", False, False), ("process", True, False), ("thread", False, True)],
    indirect=["engine"],
)
def test_interpreter_exit_with_a_live_iterator_is_prompt(engine, pin, persistent):
    # Workers are told to leave (their rings closed, their threads joined at exit), not waited
    # out and then terminated or left behind: with the process join timeout made an hour, a
    # worker that was not told would keep this script, and the test, waiting until
    # run_script's timeout; the last exit hook (registered first, so run last) finds no worker
    # thread (named rloader-w<id>) left. No wall-clock bound, so load cannot fail it.
    done = run_script(f"""
        import atexit
        from _children import worker_threads
        atexit.register(lambda: print("threads left:", worker_threads(), flush=True))

        import rloader, rloader._pinning.policy, rloader._engines.process.pool
        from _datasets import Squares
        rloader._engines.process.pool._JOIN_TIMEOUT = 3600.0
        # Stands in for pinning on a machine without an accelerator (see test_pin_thread.py).
        rloader._pinning.policy.pin_plan = lambda loader: (lambda b: b) if loader.pin_memory else None
        it = iter(rloader.DataLoader(Squares(100), batch_size=1, pin_memory={pin},
                                     **{engine.kwargs(4, persistent_workers=persistent)!r}))
        for _ in range(4):  # a batch from each worker: all are started (NOTE [Staged start])
            next(it)
        import time
        expected = {4 if engine.name == "thread" else 0}
        deadline = time.monotonic() + 60  # a thread has its name once it runs: on a loaded
        while len(worker_threads()) != expected and time.monotonic() < deadline:  # machine,
            time.sleep(0.01)  # not all of them have yet
        print("threads running:", len(worker_threads()), flush=True)
        print("pids:", *[p.pid for p in getattr(it._rloader_pool, "procs", [])], flush=True)
    """)
    assert done.returncode == 0, done.stderr
    running, pids, left = done.stdout.splitlines()[:3]
    threads = 4 if engine.name == "thread" else 0
    assert running == f"threads running: {threads}", done.stdout
    assert left == "threads left: []", done.stdout
    pids = [int(p) for p in pids.split()[1:]]
    assert len(pids) == (4 if engine.name == "process" else 0), done.stdout
    assert not any(alive(p) for p in pids)


@WORKERS
@pytest.mark.timeout(600)  # 80 pools of 2 forked workers: minutes on a loaded 2-core machine
def test_abandoned_iterators_leave_nothing_behind(engine):
    before = settled_resources()
    assert no_worker_threads_within()
    loader = rloader.DataLoader(
        Squares(100), batch_size=2, **engine.kwargs(**FORKED.get(engine.name, {}))
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
    assert no_worker_threads_within()
    # A loader of worker processes keeps one idle region (one descriptor) for its next pool,
    # and only one.
    children, fds, shm = before
    settled = (children, fds + (engine.name == "process"), shm)
    deadline = time.monotonic() + 60  # the pools' teardowns, on a loaded machine
    while count_resources() != settled and time.monotonic() < deadline:
        time.sleep(0.2)
        gc.collect()
    assert count_resources() == settled
    for _batch in loader:  # an epoch run to its end stops its workers at once
        pass
    assert not worker_threads()
    del loader, _batch
    gc.collect()
    assert count_resources() == before


@WORKERS
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_an_iterator_dropped_before_its_first_batch_leaves_no_worker(engine):
    loader = rloader.DataLoader(Squares(64), batch_size=4, **engine.kwargs(4))
    it = iter(loader)
    procs = list(getattr(it._rloader_pool, "procs", []))  # (thread workers: none)
    del it
    gc.collect()
    assert all(p._closed for p in procs)
    assert no_worker_threads_within()


def test_workers_run_ops_on_one_intra_op_thread_as_torchs_workers_do(engine):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        theirs, ours = both(IntraOpThreads(), engine, batch_size=None)
        assert ours == theirs == ([1] * 4 if engine.has_workers else [2] * 4)
        # The training loop keeps its count, and so does a thread it starts afterwards.
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert (torch.get_num_threads(), later) == (2, [2])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=2),
        dict(num_workers=2, persistent_workers=True),
        dict(num_workers=2, worker_type="thread"),
        dict(num_workers="auto"),
        dict(num_workers="auto", persistent_workers=True),
        dict(num_workers="auto", worker_type="auto"),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_a_loader_held_only_by_its_iterator_gives_every_batch(kwargs):
    # `for batch in DataLoader(...)`: nothing but the iterator holds the loader.
    # (auto's decisions read the loader after its first windows: batches enough for them)
    want = [b.tolist() for b in tud.DataLoader(range(2000), batch_size=10)]
    assert [b.tolist() for b in rloader.DataLoader(range(2000), batch_size=10, **kwargs)] == want


def test_a_dropped_persistent_auto_loader_goes_without_the_garbage_collector():
    # Its iterator holds it only through an epoch: after one, no cycle keeps its workers.
    loader = rloader.DataLoader(
        range(200), batch_size=10, num_workers="auto", persistent_workers=True
    )
    for _ in range(2):
        assert sum(1 for _ in loader) == 20
    gc.disable()
    try:
        gone = weakref.ref(loader)
        del loader
        assert gone() is None
    finally:
        gc.enable()
