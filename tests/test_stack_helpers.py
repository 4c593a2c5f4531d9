"""The single-process loop stacks a large batch of tensors on several threads (NOTE [Stack
helpers] in rust/rloader-py/src/collate/stack_helpers.rs): the batches, their layout and their
errors are torch's whatever the thread count, and the helper threads go with the iterator."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.utils.data as tud
from _datasets import MadeSamples

import rloader
from rloader import _rloader

from _compare import both, same

pytestmark = pytest.mark.timeout(120)


def stack_helpers() -> int:
    """How many of this process's threads are stack helpers (``rloader-stack``): they are
    Rust's, so /proc counts them."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == "rloader-stack"
        except OSError:
            continue
    return n


@pytest.fixture(params=[1, 2, 3, 4], ids=lambda n: f"{n}-threads")
def torch_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def traits(batch):
    """Strides, view-ness and version of each tensor in a batch, as in test_dataloader."""
    if isinstance(batch, torch.Tensor):
        version = None if batch.is_inference() else batch._version  # inference: no counter
        return (batch.stride(), batch._base is None, version, batch.requires_grad)
    return [traits(x) for x in batch]


MAKES = {
    "float32": None,
    "pairs": lambda i: (torch.full((3, 64, 64), i, dtype=torch.uint8), i),
    # torch.stack promotes mixed dtypes; an out= of the first's dtype would cast them
    "mixed-dtypes": lambda i: torch.full((3, 64, 64), float(i), dtype=(torch.float32, torch.float64)[i % 2]),
    # channels-last items: torch's batch keeps their format
    "channels-last": lambda i: torch.full((2, 4, 32, 48), float(i)).to(memory_format=torch.channels_last),
    # a transposed item: torch.stack makes the batch contiguous
    "transposed": lambda i: torch.full((64, 64, 3), float(i)).transpose(0, 2),
    "zero-dim": lambda i: torch.tensor(float(i)),
    "int64": lambda i: torch.arange(6144) * i,
}  # fmt: skip


# The makes whose batches the helpers stack when they hold 1 MiB or more (items under 32768
# elements, of one dtype, contiguous); the others are stacked by torch.stack alone.
SPLIT = {"float32", "int64", "pairs"}


def splittable(batch) -> bool:
    stacked = batch[0] if isinstance(batch, list) else batch
    return stacked.nbytes >= 1 << 20


@pytest.mark.parametrize("batch_size", [25, 64, 256])
@pytest.mark.parametrize("make", list(MAKES), ids=list(MAKES))
def test_batches_are_torchs_on_any_number_of_threads(torch_threads, make, batch_size):
    # 230 samples: the last batch is a remainder, split in runs that do not divide evenly.
    before = _rloader._split_stacks()
    theirs, ours = both(MadeSamples(MAKES[make]), batch_size=batch_size)
    assert same(ours, theirs)
    assert traits(ours) == traits(theirs)
    split = _rloader._split_stacks() - before
    if make in SPLIT and torch_threads > 1:
        assert split == sum(map(splittable, ours))
        assert split > 0 or make == "pairs" and batch_size < 256  # 12 KiB items: 768 KiB
    else:
        assert split == 0


def test_large_items_are_left_to_torchs_own_threads(torch_threads):
    # 3x224x224 floats: torch.stack copies each on torch's threads already.
    before = _rloader._split_stacks()
    theirs, ours = both(
        MadeSamples(lambda i: torch.full((3, 224, 224), float(i)), n=24), batch_size=8
    )
    assert same(ours, theirs)
    assert _rloader._split_stacks() == before


@pytest.mark.parametrize("start", [32, 40, 64 - 21])
@pytest.mark.parametrize("other", [(3, 64, 65), (3, 64, 63), (64, 3, 64)])
def test_a_whole_run_of_another_shape_raises_torchs_error(torch_threads, start, other):
    # Items from `start` on have another shape: a helper's whole run, or part of one. An out=
    # of the first's shape would be resized (or written past) instead of raising.
    ragged = MadeSamples(lambda i: torch.zeros(*((3, 64, 64) if i < start else other)), n=64)
    errors = []
    for lib in (tud, rloader):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "An output with one or more elements was resized"
            with pytest.raises(RuntimeError) as error:
                list(lib.DataLoader(ragged, batch_size=64))
        errors.append(str(error.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_grad_and_inference_modes_are_the_callers(torch_threads, mode):
    grad = MadeSamples(lambda i: torch.full((3, 64, 64), float(i), requires_grad=i % 2 == 1))
    with getattr(torch, mode)():
        theirs, ours = both(grad, batch_size=64)
        assert [b.is_inference() for b in ours] == [b.is_inference() for b in theirs]
    assert traits(ours) == traits(theirs)
    assert same(ours, theirs)


def test_inputs_that_require_grad_get_torchs_graph(torch_threads):
    grad = MadeSamples(lambda i: torch.full((3, 64, 64), float(i), requires_grad=True))
    theirs, ours = both(grad, batch_size=32)
    assert [b.grad_fn.name() for b in ours] == [b.grad_fn.name() for b in theirs]
    assert same([b.detach() for b in ours], [b.detach() for b in theirs])


@pytest.mark.parametrize("bad", [3, 40, 63])
def test_a_size_that_differs_raises_torchs_error_wherever_it_is(torch_threads, bad):
    # In the first run or a helper's: the error names the entry in the whole batch, as torch's.
    ragged = MadeSamples(lambda i: torch.zeros(3, 64, 64 if i != bad else 65))
    errors = []
    for lib in (tud, rloader):
        with pytest.raises(RuntimeError) as error:
            list(lib.DataLoader(ragged, batch_size=64))
        errors.append(str(error.value))
    assert errors[0] == errors[1]


def test_helpers_run_while_the_iterator_lives_and_go_with_it():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        loader = rloader.DataLoader(MadeSamples(), batch_size=64)
        assert stack_helpers() == 0
        it = iter(loader)
        next(it)
        assert stack_helpers() == 2
        next(it)
        assert stack_helpers() == 2  # kept from batch to batch
        del it
        gc.collect()
        assert stack_helpers() == 0
        for _ in loader:
            pass
        assert stack_helpers() == 0
        torch.set_num_threads(1)
        it = iter(loader)
        next(it)
        assert stack_helpers() == 0  # one thread's worth: stacked here alone
        del it
    finally:
        torch.set_num_threads(before)


def test_thread_workers_stack_their_batches_alone():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        loader = rloader.DataLoader(
            MadeSamples(), batch_size=64, num_workers=2, worker_type="thread"
        )
        it = iter(loader)
        next(it)
        assert stack_helpers() == 0
        del it
    finally:
        torch.set_num_threads(before)


def test_a_forked_child_with_its_parents_iterator_neither_hangs_nor_joins_its_threads():
    # The child's copy of the iterator has the helpers' handles but not their threads: it
    # stacks alone and drops the copy without waiting for them.
    script = """
import os, torch, rloader, torch.utils.data as tud
torch.set_num_threads(3)
data = [torch.full((3, 64, 64), float(i)) for i in range(256)]
it = iter(rloader.DataLoader(data, batch_size=64))
next(it)
pid = os.fork()
if pid == 0:
    batch = next(it)
    ok = torch.equal(batch, torch.stack(data[64:128]))
    del it
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert torch.equal(next(it), torch.stack(data[64:128]))
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_batch_collated_while_the_interpreter_finalizes_is_stacked_here():
    # A helper cannot attach once finalizing has begun (Python ends such a thread, which
    # aborted the process): such a batch is stacked on the calling thread alone.
    script = """
import sys, torch, rloader
torch.set_num_threads(3)
data = [torch.full((3, 64, 64), float(i)) for i in range(64)]
loader = rloader.DataLoader(data, batch_size=64)

class Late:
    def __del__(self):
        batch = next(iter(loader))
        print(sys.is_finalizing(), bool(torch.equal(batch, torch.stack(data))), flush=True)

late = Late()
late.cycle = late  # collected by the interpreter's last collection, once finalizing has begun
del late
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True"
