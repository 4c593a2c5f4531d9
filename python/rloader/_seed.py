"""Where every random order in rloader gets its seed.

torch's samplers consume their RNG in many different ways (randperm, randint, multinomial).
rloader's rule is one and the same everywhere: each epoch takes exactly one 64-bit draw from
the ``torch.Generator`` the user passed, or from torch's global RNG when they passed none,
and seeds rloader's own generator (xoshiro256++, see ``rust/rloader-core/src/rng.rs``) with it.
So ``torch.manual_seed(s)`` or ``generator=torch.Generator().manual_seed(s)`` make a run
reproducible, and the orders themselves are rloader's own, stable across versions and platforms.
"""

from __future__ import annotations

import torch

__all__ = ["draw_seed"]


def draw_seed(generator: torch.Generator | None = None) -> int:
    """Take one 64-bit draw from ``generator`` (torch's global RNG when None)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
