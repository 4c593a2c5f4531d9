"""The single-process loop stacks a large batch of tensors on several threads (NOTE [Stack
helpers] in rust/rloader-py/src/collate.rs): the batches, their layout and their errors are
torch's whatever the thread count, and the helper threads go with the iterator."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.utils.data as tud

import rloader

from _compare import same

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


class Samples(tud.Dataset):
    """Sample i: ``make(i)``; 48 KiB float32 images by default, so a batch of 25 is past the
    1 MiB from which a batch is split."""

    def __init__(self, make=None, n: int = 230) -> None:
        self.make = make or (lambda i: torch.full((3, 64, 64), float(i)))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.make(i)


def traits(batch):
    """Strides, view-ness and version of each tensor in a batch, as in test_dataloader."""
    if isinstance(batch, torch.Tensor):
        return (batch.stride(), batch._base is None, batch._version, batch.requires_grad)
    return [traits(x) for x in batch]


def both(dataset, **kwargs):
    return list(tud.DataLoader(dataset, **kwargs)), list(rloader.DataLoader(dataset, **kwargs))


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


@pytest.mark.parametrize("batch_size", [25, 64, 256])
@pytest.mark.parametrize("make", list(MAKES), ids=list(MAKES))
def test_batches_are_torchs_on_any_number_of_threads(torch_threads, make, batch_size):
    # 230 samples: the last batch is a remainder, split in runs that do not divide evenly.
    theirs, ours = both(Samples(MAKES[make]), batch_size=batch_size)
    assert same(ours, theirs)
    assert traits(ours) == traits(theirs)


def test_inputs_that_require_grad_get_torchs_graph(torch_threads):
    grad = Samples(lambda i: torch.full((3, 64, 64), float(i), requires_grad=True))
    theirs, ours = both(grad, batch_size=32)
    assert [b.grad_fn.name() for b in ours] == [b.grad_fn.name() for b in theirs]
    assert same([b.detach() for b in ours], [b.detach() for b in theirs])


@pytest.mark.parametrize("bad", [3, 40, 63])
def test_a_size_that_differs_raises_torchs_error_wherever_it_is(torch_threads, bad):
    # In the first run or a helper's: the error names the entry in the whole batch, as torch's.
    ragged = Samples(lambda i: torch.zeros(3, 64, 64 if i != bad else 65))
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
        loader = rloader.DataLoader(Samples(), batch_size=64)
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
        loader = rloader.DataLoader(Samples(), batch_size=64, num_workers=2, worker_type="thread")
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
