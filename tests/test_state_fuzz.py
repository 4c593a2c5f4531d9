"""load_state_dict() with malformed, truncated and hostile states (tests/fuzz_state.py; `make
fuzz` runs 100,000): each is refused with a TypeError or ValueError that names the field, or
gives a valid epoch; never another exception, a hang or a batch that is not the dataset's."""

import os
import subprocess
import sys

import pytest
import torch

import rloader


@pytest.mark.timeout(600)
def test_malformed_states_are_refused_or_give_a_valid_epoch():
    fuzz = os.path.join(os.path.dirname(__file__), "fuzz_state.py")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", fuzz, "--states", "3000", "--seed", "5"],
        capture_output=True,
        text=True,
        timeout=550,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ", 0 failures," in done.stdout


def saved(loader, batches=1):
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_each_refusal_names_what_is_wrong():
    data = list(range(40))
    make = lambda: rloader.DataLoader(  # noqa: E731
        data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    good = saved(make())
    cases = [
        (dict(good, position=-1), ValueError, r"\['position'\] must be at least 0"),
        (dict(good, position="3"), TypeError, r"\['position'\] must be an int"),
        (dict(good, position=10**18), ValueError, "an epoch of this loader has 10 batches"),
        (dict(good, holes=[5]), ValueError, r"\['holes'\] must name batches below position=1"),
        (dict(good, holes=None), TypeError, r"\['holes'\] must be a list"),
        (dict(good, in_order="yes"), TypeError, r"\['in_order'\] must be True or False"),
        (dict(good, generators={"loader": b"\1" + b"junk"}), ValueError, "is corrupt"),
        (
            dict(good, generators={"loader": good["generators"]["loader"][:-9]}),
            ValueError,
            "truncated, corrupt or another kind of generator's",
        ),
        (dict(good, generators={"other": b""}), ValueError, "only 'loader' and 'sampler'"),
        ({k: v for k, v in good.items() if k != "generators"}, ValueError, "has no 'generators'"),
        (dict(good, sampler={"distributed": None}), TypeError, r"\['distributed'\] must be a dict"),
        ([good, 3], TypeError, r"state\[1\] must be a dict"),
    ]
    for state, error, words in cases:
        loader = make()
        with pytest.raises(error, match=words):
            loader.load_state_dict(state)
        assert [b.tolist() for b in loader] == [b.tolist() for b in make()]  # nothing applied


def test_a_generator_state_that_inflates_past_its_size_is_refused_without_inflating_it():
    import zlib

    loader = rloader.DataLoader(list(range(8)), batch_size=2, shuffle=True)
    state = saved(loader)
    bomb = b"\1" + zlib.compress(bytes(1 << 28), 9)  # 256 MiB of zeros, ~260 KB packed
    with pytest.raises(ValueError, match="truncated, corrupt or another kind"):
        loader.load_state_dict(dict(state, generators={"loader": bomb}))
