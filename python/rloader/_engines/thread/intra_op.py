"""How many intra-op threads a worker thread's torch ops use: one, as in a worker process.

torch's worker processes call ``torch.set_num_threads(1)``, so each worker's ops run on its own
core. Thread workers share their process with the training loop, where
``torch.set_num_threads`` would change the count for every thread started afterwards. Without
a count of their own, N worker threads each run every large op (``ToTensor``'s division,
``Normalize``) on a team of as many OpenMP threads as there are cores: N teams on the same
cores, whose threads spin while waiting for each other. On 2 cores, two threads normalizing
224x224 images take 2-5x longer than with one intra-op thread each.

OpenMP keeps the count per thread (the ``nthreads-var`` ICV), and ATen reads it per thread
(``omp_get_max_threads()``), after setting it once from the process-wide count the first time
a thread asks (``lazy_init_num_threads``, which ``torch.get_num_threads()`` runs). So
:func:`use_one_intra_op_thread` first lets ATen do that, then sets the calling thread's own
count to 1 with the OpenMP runtime torch loaded. The training loop's threads keep theirs.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable, Optional

import torch

# The OpenMP runtimes torch builds link: GNU (Linux wheels), LLVM (macOS), Intel.
_OPENMP_LIBRARIES = ("libgomp", "libomp", "libiomp5")


@functools.lru_cache(maxsize=None)
def _omp_set_num_threads() -> Optional[Callable[[int], None]]:
    """The ``omp_set_num_threads`` of the OpenMP runtime this process loaded for torch, or None
    (ATen built on another parallel backend, or no OpenMP library found)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open(f"/proc/{os.getpid()}/maps") as maps:
            fields = (line.split(None, 5) for line in maps)
            paths = {f[5].strip() for f in fields if len(f) == 6}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(_OPENMP_LIBRARIES) and ".so" in name:
            try:
                # Already loaded: dlopen returns that same library, with its state.
                return ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                continue
    return None


def use_one_intra_op_thread() -> bool:
    """The calling thread's torch ops run on one intra-op thread from now on (other threads
    keep their count). Returns False where this cannot be done (ATen without OpenMP): the
    thread then keeps the process-wide count."""
    set_count = _omp_set_num_threads()
    if set_count is None:
        return False
    torch.get_num_threads()  # ATen sets this thread's count from the process's, once
    set_count(1)
    return True
