"""The short soak (tests/soak.py): 150 cases of loaders and iterators with random faults, in a
process of their own, none of which may hang or leave a process, thread, descriptor, mapping or
pinned registration behind. `make soak` runs the long one (10,000 iterators)."""

import os
import subprocess
import sys

import pytest


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [11, 12])
def test_the_short_soak_leaves_nothing_behind(seed):
    soak = os.path.join(os.path.dirname(__file__), "soak.py")
    done = subprocess.run(
        [sys.executable, soak, *f"--cases 75 --seed {seed} --check-every 25 --warmup 25".split()],
        capture_output=True,
        text=True,
        timeout=850,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert last.startswith("soak: 75 cases, ") and ", 0 leaks, 0 hangs," in last, done.stdout
