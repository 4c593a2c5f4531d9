"""Every batch a worker can build reaches the main process, as with torch; and every failure of
the hand-off between processes is reported as torch reports a worker's exception.

Plain CPU tensors travel through rloader's shared-memory slots; everything else (nested,
sparse and quantized tensors, subclasses, tensors that need autograd, numpy arrays, any
picklable object) takes its own pickle reduction. Each kind is compared with what
torch.utils.data's workers deliver for the same collate_fn. (A batch too large for its slot
travels through the rings: tests/test_slots.py.)
"""

import pickle

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _datasets import LocalErrorDataset

import rloader

# torch warns that nested, sparse and quantized tensors are prototypes: not what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Tagged(torch.Tensor):
    """A tensor subclass, as libraries define them."""


def _grid(batch):
    return torch.tensor(batch, dtype=torch.float32).repeat(4, 1) + torch.arange(4.0)[:, None]


KINDS = {
    "nested": lambda b: torch.nested.nested_tensor([torch.ones(i + 1) * i for i in b]),
    "nested jagged": lambda b: torch.nested.nested_tensor(
        [torch.ones(i % 3 + 1, 2) * i for i in b], layout=torch.jagged
    ),
    "sparse coo": lambda b: _grid(b).to_sparse(),
    "sparse csr": lambda b: _grid(b).to_sparse_csr(),
    "sparse csc": lambda b: _grid(b).to_sparse_csc(),
    "quantized": lambda b: torch.quantize_per_tensor(_grid(b), 0.5, 0, torch.quint8),
    "subclass": lambda b: _grid(b).as_subclass(Tagged),
    "parameter": lambda b: torch.nn.Parameter(_grid(b)),
    "needs grad": lambda b: _grid(b).requires_grad_(),
    "view with offset": lambda b: _grid(b)[1:, 1:],
    "transposed": lambda b: _grid(b).t(),
    "expanded": lambda b: torch.tensor(b)[:, None].expand(len(b), 3),
    "bfloat16": lambda b: _grid(b).to(torch.bfloat16),
    "complex": lambda b: torch.tensor(b, dtype=torch.complex64) * 1j,
    "empty": lambda b: torch.empty(0, len(b)),
    "numpy float16 view": lambda b: np.arange(40, dtype=np.float16).reshape(4, 10)[1:, :: len(b)],
    "numpy object": lambda b: np.array([i if i % 2 else str(i) for i in b], dtype=object),
    "numpy structured": lambda b: np.array(
        [(i, i / 2) for i in b], dtype=[("a", "i4"), ("b", "f8")]
    ),
    "numpy strings": lambda b: np.array([str(i) * 3 for i in b]),
    "numpy datetime": lambda b: np.array(b, dtype="datetime64[D]"),
    "object": lambda b: {"ids": tuple(b), "names": [f"s{i}" for i in b], "none": None},
}


class KindCollate:
    """A collate_fn that builds one kind of batch (picklable, for spawn and forkserver)."""

    def __init__(self, kind):
        self.kind = kind

    def __call__(self, batch):
        return KINDS[self.kind](batch)


def plain(x):
    """What a batch holds, in a form two batches can be compared by."""
    if isinstance(x, torch.Tensor):
        if x.is_nested:
            return ("nested", x.layout, [plain(t) for t in x.unbind()])
        if x.is_quantized:
            return ("quantized", x.qscheme(), x.q_scale(), x.dequantize().tolist())
        if x.layout != torch.strided:
            return ("sparse", x.layout, x.to_dense().tolist())
        values = x.detach().resolve_conj().resolve_neg()
        return (type(x), x.dtype, tuple(x.shape), x.requires_grad, values.tolist())
    if isinstance(x, np.ndarray):
        return (np.ndarray, x.dtype, x.shape, x.tolist())
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def batches(lib, kind, num_workers=2, **kwargs):
    data = list(range(12))
    loader = lib.DataLoader(
        data, batch_size=4, num_workers=num_workers, collate_fn=KindCollate(kind), **kwargs
    )
    return [plain(b) for b in loader]


# torch's workers deliver a quantized tensor whose quantizer is lost (reading its qscheme fails
# an internal assert in torch 2.15): rloader's is compared with the batch as collated.
TORCH_MANGLES = {"quantized"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_batch_arrives_as_torchs_does(kind):
    as_collated = batches(tud, kind, num_workers=0)
    assert batches(rloader, kind) == as_collated
    if kind not in TORCH_MANGLES:
        assert batches(tud, kind) == as_collated


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_nested_tensors_arrive_under_every_start_method(method):
    kwargs = dict(multiprocessing_context=method)
    assert batches(rloader, "nested", **kwargs) == batches(tud, "nested", **kwargs)


class RefusesPickling:
    def __reduce__(self):
        raise pickle.PicklingError("this object stays in its process")


def unpicklable_third_batch(batch):
    return RefusesPickling() if batch[0] == 8 else torch.tensor(batch)


def test_a_batch_whose_pickling_raises_is_that_batchs_error():
    # torch's worker queue drops such a batch (its feeder thread prints the error) and the main
    # process waits for it forever; rloader reports it as torch reports a worker's exception.
    loader = rloader.DataLoader(
        list(range(16)), batch_size=4, num_workers=2, collate_fn=unpicklable_third_batch
    )
    it = iter(loader)
    assert [next(it).tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(pickle.PicklingError) as err:
        next(it)
    text = str(err.value)
    assert text.startswith(
        "Caught PicklingError in DataLoader worker process 0.\nOriginal Traceback"
    )
    assert "this object stays in its process" in text and "__reduce__" in text
    # The worker lives on: the next batch comes, as after any worker exception.
    assert next(it).tolist() == [12, 13, 14, 15]
    with pytest.raises(StopIteration):
        next(it)


def test_an_exception_of_an_unpicklable_type_still_reaches_the_user():
    loader = rloader.DataLoader(LocalErrorDataset(), batch_size=1, num_workers=1)
    it = iter(loader)
    assert [next(it).item() for _ in range(2)] == [0, 1]
    with pytest.raises(RuntimeError) as err:
        next(it)
    assert "in DataLoader worker process 0" in str(err.value)
    assert "OddError: sample 2 is odd" in str(err.value)
    assert next(it).item() == 3
