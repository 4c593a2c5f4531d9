"""The short soak (tests/soak.py): 150 cases of loaders and iterators with random faults, in a
process of their own, none of which may hang or leave a process, thread, descriptor, mapping or
pinned registration behind. `make soak` runs the long one (10,000 iterators)."""

import os
import random
import subprocess
import sys

import pytest
import soak


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


def _held(per_100, step_at=None, step=0.0, samples=100, seed=0):
    """(iterators, MiB held) every 100 iterators: 300 MiB, ``per_100`` MiB more each sample,
    ``step`` MiB more from sample ``step_at`` on, and +-3 MiB of noise."""
    rng = random.Random(seed)
    return [
        (
            100 * i,
            300
            + per_100 * i
            + (step if step_at is not None and i >= step_at else 0.0)
            + rng.uniform(-3, 3),
        )
        for i in range(samples)
    ]


@pytest.mark.parametrize("step_at", [1, 50, 99])
def test_a_one_time_step_to_a_plateau_is_not_a_leak(step_at):
    # malloc's arenas (seed 3 of the long soak): held memory steps up once, then stays. Its
    # growth from first to last sample is above the soak's 64 MiB, which judged it a leak.
    samples = _held(0.0, step_at=step_at, step=80.0)
    assert samples[-1][1] - samples[0][1] > 64
    assert abs(soak.leak_growth(samples)) < 16


@pytest.mark.parametrize("step", [0.0, 80.0])
def test_memory_that_grows_with_every_iterator_is_a_leak(step):
    # 0.8 MiB per 100 iterators: 80 MiB over 10,000, with or without a step besides.
    samples = _held(0.8, step_at=30, step=step)
    assert soak.leak_growth(samples) > 64
