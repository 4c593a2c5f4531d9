"""A garbage collection may run at any allocation, including those made while rloader's
objects are being built: none of them may be visited by the collector before its fields are
written. PoolIter and ThreadIter had an instance __dict__, which PyO3 allocates after the object
is tracked by the collector and before its fields are set; a collection landing on that one
allocation traversed zeroed fields and crashed the process (SIGSEGV "Garbage-collecting" in
start_pool, seen once in CI)."""

import subprocess
import sys
import textwrap

import pytest

# Every iterator constructor the loaders call is wrapped so that a collection lands on each
# allocation it makes in turn: collected first, the count of tracked allocations is raised by
# `shift` more, with a threshold of `threshold`.
SCRIPT = """
import gc, faulthandler, sys
faulthandler.enable()
import rloader
from rloader._engines.process import pool as process_pool
from rloader._engines.thread import pool as thread_pool

class Collecting:
    def __init__(self, real):
        self.real = real
        self.threshold, self.shift = 1, 0

    def __call__(self, *args, **kwargs):
        gc.collect()
        keep = [[] for _ in range(self.shift)]
        gc.set_threshold(self.threshold)
        try:
            return self.real(*args, **kwargs)
        finally:
            gc.set_threshold(700)
            del keep

class Module:
    def __init__(self, real, name):
        self.__dict__.update(vars(real))
        self.wrapped = Collecting(getattr(real, name))
        setattr(self, name, self.wrapped)

kind = sys.argv[1]
owner, name = (process_pool, "PoolIter") if kind == "process" else (thread_pool, "ThreadIter")
owner._rloader = Module(owner._rloader, name)
loader = rloader.DataLoader(list(range(8)), batch_size=2, num_workers=1, worker_type=kind)
for threshold in (1, 2, 3, 4):
    for shift in range(threshold + 1):
        owner._rloader.wrapped.threshold, owner._rloader.wrapped.shift = threshold, shift
        assert [b.tolist() for b in loader][:1] == [[0, 1]]
print("ok")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["process", "thread"])
def test_an_iterator_survives_a_collection_while_it_is_built(kind):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), kind],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
