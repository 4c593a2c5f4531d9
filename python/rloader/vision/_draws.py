"""Random draws on thread workers from the worker's own generator.

A worker process of torch's seeds torch's global generator with ``base_seed + worker_id``, and
torchvision's transforms draw from it. Thread workers share one process's global generator, so
their draws would interleave in whatever order the threads run. On a thread worker, a sample
of rloader.vision's is made under `WorkerDraws`, a `TorchFunctionMode` (torch keeps its modes
per thread) that hands each of torch's random functions the worker's own generator
(``get_worker_info().rng.torch_generator``, seeded as a worker process seeds the global one):
so thread workers give the batches torch's worker processes give for the same seeds.
Python's ``random`` and numpy's global generator are not redirected.
"""

from __future__ import annotations

import contextlib
import random

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import get_worker_info

from rloader import _thread_info

# torch's random functions and methods that take a `generator`.
_RANDOM = {
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.normal,
    torch.bernoulli,
    torch.multinomial,
    torch.poisson,
    torch.Tensor.uniform_,
    torch.Tensor.normal_,
    torch.Tensor.random_,
    torch.Tensor.bernoulli_,
    torch.Tensor.exponential_,
    torch.Tensor.geometric_,
    torch.Tensor.log_normal_,
    torch.Tensor.cauchy_,
    torch.Tensor.bernoulli,
    torch.Tensor.multinomial,
}


class WorkerDraws(TorchFunctionMode):
    """Draws of torch's random functions that name no generator come from `generator`."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RANDOM and kwargs.get("generator") is None and _on_cpu(args, kwargs):
            kwargs = {**kwargs, "generator": self.generator}
        return func(*args, **kwargs)


def _on_cpu(args, kwargs) -> bool:
    # The worker's generator is a CPU one: draws on another device keep theirs.
    device = kwargs.get("device")
    if device is None and args and isinstance(args[0], torch.Tensor):
        device = args[0].device
    return device is None or torch.device(device).type == "cpu"


def draws_generator() -> torch.Generator:
    """The generator a sample's draws come from: the thread worker's own, or torch's."""
    info = _thread_info.info()
    return torch.default_generator if info is None else info.rng.torch_generator


def worker_draws():
    """`WorkerDraws` over the calling thread worker's generator; nothing elsewhere."""
    info = _thread_info.info()
    if info is None:
        return contextlib.nullcontext()
    return WorkerDraws(info.rng.torch_generator)


def draws_state() -> dict:
    """Where the calling worker's draws are: in a worker process, torch's and Python's global
    generators (torchvision's transforms draw from both: `RandomChoice` and `RandomOrder` of
    v1 from Python's); on a thread worker, its own generator. Empty in the main process, whose
    generators are the user's (a training loop saves torch's with its checkpoint)."""
    if _thread_info.info() is not None:
        return {"torch": draws_generator().get_state()}
    if get_worker_info() is None:
        return {}
    return {"torch": torch.get_rng_state(), "random": random.getstate()}


def load_draws_state(state: dict) -> None:
    """Puts the calling worker's draws where ``draws_state`` found them."""
    if not isinstance(state, dict) or not set(state) <= {"torch", "random"}:
        raise ValueError(
            "an rloader.vision dataset's state is what its state_dict() returned, a dict of "
            f"'torch' and 'random' generator states, not {str(state)[:80]}"
        )
    if "torch" in state:
        draws_generator().set_state(state["torch"])
    if "random" in state:
        random.setstate(state["random"])
