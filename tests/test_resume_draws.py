"""A map-style dataset that says where it is (``state_dict``/``load_state_dict``, torchdata's
convention) has each worker's copy resumed from its state after its last batch handed out: the
random draws of a resumed epoch (augmentations) are the uninterrupted run's, on worker
processes and threads."""

import time

import pytest
import torch
import torch.utils.data as tud
from _datasets import Augmenting, SeedOfReader, StateFails, StateFailsLater, StateUnpicklable
from _resume_helpers import (
    POINTS,
    as_lists,
    checkpointed,
    epochs_of,
    interrupted,
    restarted,
    uninterrupted,
)

import rloader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 37  # samples: batches of 4 leave a short last batch


def augmenting(worker_type="process", persistent=False, dataset=Augmenting):
    def make(workers, g):
        return rloader.DataLoader(
            dataset(N),
            batch_size=4,
            shuffle=True,
            generator=g,
            num_workers=workers,
            worker_type=worker_type,
            persistent_workers=persistent and workers > 0,
        )

    return make


def draws_of(epochs):
    return [[row[1] for batch in epoch for row in batch] for epoch in epochs]


def order_of(epochs):
    return [[row[0] for batch in epoch for row in batch] for epoch in epochs]


# (a persistent worker that has not handed out a batch of the second epoch yet goes on from its
# last batch of the first)
DRAW_POINTS = {**POINTS, "second epoch's first batch": (1, 1)}


@pytest.mark.parametrize("point", DRAW_POINTS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_resume_on_worker_processes_draws_as_the_uninterrupted_run(workers, persistent, point):
    make = augmenting("process", persistent)
    expected = uninterrupted(make, workers, 3, True)
    epoch, batch = DRAW_POINTS[point]
    assert interrupted(make, workers, workers, epoch, batch, 3, True) == expected


@pytest.mark.parametrize("point", DRAW_POINTS)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 3])
def test_a_resume_on_worker_threads_draws_as_the_uninterrupted_run(workers, persistent, point):
    # Each thread worker draws from its own generator (get_worker_info().rng), seeded as
    # torch seeds a worker process: its state is saved and restored as a process's is.
    make = augmenting("thread", persistent)
    expected = uninterrupted(make, workers, 3, True)
    epoch, batch = DRAW_POINTS[point]
    assert interrupted(make, workers, workers, epoch, batch, 3, True) == expected


def test_states_of_threads_are_not_loaded_into_processes():
    # A thread worker's state is its own generator's, a process's torch's global one: the
    # order resumes, and the processes draw afresh.
    make = {w: augmenting(w) for w in ("thread", "process")}
    expected = uninterrupted(make["thread"], 2, 1, True)
    torch.manual_seed(3)
    loader = make["thread"](2, torch.Generator().manual_seed(11))
    it = iter(loader)
    seen = [as_lists(next(it)) for _ in range(4)]
    state = checkpointed(loader.state_dict())
    assert state["workers"]["kind"] == "thread"
    resumed = make["process"](2, torch.Generator().manual_seed(99))
    resumed.load_state_dict(state)
    seen += epochs_of(resumed, 1)[0]
    assert order_of([seen]) == order_of(expected)
    assert draws_of([seen])[0][16:] != draws_of(expected)[0][16:]


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_resume_at_an_epochs_end_then_mid_epoch_is_the_uninterrupted_run(worker_type):
    # Persistent workers: resumed from a state at epoch 0's last batch, the next epoch goes on
    # without a base seed, as the saving loader's would; a state saved in it says so.
    make = augmenting(worker_type, persistent=True)
    expected = uninterrupted(make, 3, 2, True)
    torch.manual_seed(3)
    loader = make(3, torch.Generator().manual_seed(11))
    seen, it = [], iter(loader)
    for cut in (len(loader), 3):
        seen += [as_lists(next(it)) for _ in range(cut)]
        state, rng = checkpointed(loader.state_dict()), torch.get_rng_state()
        del it
        loader = make(3, torch.Generator().manual_seed(99))
        loader.load_state_dict(state)
        torch.set_rng_state(rng)
        it = iter(loader)
    seen += list(map(as_lists, it))
    assert seen == expected[0] + expected[1]


@pytest.mark.parametrize("worker_type", ["process", "thread"])
@pytest.mark.parametrize("dataset", [StateFails, StateUnpicklable])
def test_a_state_that_cannot_be_taken_leaves_loading_as_torchs(dataset, worker_type):
    # The state is an extra: a dataset whose state_dict() raises, or whose state does not
    # pickle, loads as with torch, and a resume starts its workers afresh (the order exact).
    def rows(batches):  # (sample, its worker's seed) pairs
        return [list(zip(*(column.tolist() for column in b))) for b in batches]

    torch.manual_seed(0)
    want = rows(tud.DataLoader(dataset(N), batch_size=4, num_workers=2))
    kwargs = dict(batch_size=4, num_workers=2, worker_type=worker_type)
    torch.manual_seed(0)
    loader = rloader.DataLoader(dataset(N), **kwargs)
    assert rows(loader) == want
    torch.manual_seed(0)
    it = iter(loader)
    next(it)
    resumed = rloader.DataLoader(dataset(N), **kwargs)
    resumed.load_state_dict(loader.state_dict())
    assert rows(resumed) == want[1:]


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_worker_whose_state_could_not_be_taken_is_resumed_afresh(worker_type):
    # Its state after its newest batch is unknown: not the one it had an epoch before.
    loader = rloader.DataLoader(
        StateFailsLater(N, works=5), batch_size=4, num_workers=2, worker_type=worker_type,
        persistent_workers=True,
    )  # fmt: skip
    list(loader)  # 10 batches, 5 a worker: every state taken
    it = iter(loader)
    next(it)  # worker 0's sixth batch, whose state could not be taken
    states = loader.state_dict()["workers"]["states"]
    assert states[0] is None and states[1] is not None  # (worker 1: epoch 0's end)


def test_the_uninterrupted_draws_are_torchs():
    # What the resumed runs are compared with: torch's worker processes' draws. The orders are
    # rloader's own, and so is how much of the generator they take (docs/migrating.md): the
    # first epoch's draws are compared, batch by batch.
    torch_epochs = uninterrupted(
        lambda w, g: tud.DataLoader(
            Augmenting(N), batch_size=4, shuffle=True, generator=g, num_workers=w
        ),
        2,
        1,
        True,
    )
    assert draws_of(uninterrupted(augmenting("process"), 2, 1, True)) == draws_of(torch_epochs)
    assert draws_of(uninterrupted(augmenting("thread"), 2, 1, True)) == draws_of(torch_epochs)


def test_every_draw_of_a_resume_mid_epoch_differs_without_the_states():
    # The test above can fail: resumed as a plain dataset, a worker draws again from its seed.
    class Plain(Augmenting):
        state_dict = load_state_dict = None

    expected = uninterrupted(augmenting("process", dataset=Plain), 2, 1, True)
    resumed = interrupted(augmenting("process", dataset=Plain), 2, 2, 0, 4, 1, True)
    assert order_of(resumed) == order_of(expected)  # the order is exact
    assert draws_of(resumed)[0][16:] != draws_of(expected)[0][16:]


@pytest.mark.parametrize("saved,loaded", [(2, 3), (2, 0), (0, 2)])
def test_another_worker_count_resumes_the_order_and_draws_afresh(saved, loaded):
    make = augmenting("process")
    expected = uninterrupted(make, saved, 2, True)
    resumed = interrupted(make, saved, loaded, 0, 4, 2, True)
    assert order_of(resumed) == order_of(expected)


def test_worker_states_are_saved_only_where_they_apply():
    loader = augmenting("process")(2, torch.Generator().manual_seed(1))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["workers"]["num_workers"] == 2 and state["workers"]["kind"] == "process"
    assert state["workers"]["next_worker"] == 1
    assert state["workers"]["states"][1] is None  # worker 1 has handed out nothing yet
    # A dataset without a state, or under auto, or in the main process: no workers' states.
    for make in (
        lambda: rloader.DataLoader(SeedOfReader(N), batch_size=4, num_workers=2),
        lambda: rloader.DataLoader(Augmenting(N), batch_size=4, num_workers=0),
        lambda: rloader.DataLoader(Augmenting(N), batch_size=4, num_workers="auto"),
    ):
        loader = make()
        it = iter(loader)
        next(it)
        assert "workers" not in loader.state_dict()
        del it


def test_a_module_is_not_a_stateful_dataset():
    class Module(torch.nn.Module, tud.Dataset):
        def __len__(self):
            return N

        def __getitem__(self, i):
            return i

    loader = rloader.DataLoader(Module(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    assert "workers" not in loader.state_dict()


def test_worker_states_go_through_a_checkpoint_and_a_resume_of_a_resume():
    make = augmenting("process")
    expected = uninterrupted(make, 2, 1, True)
    torch.manual_seed(3)
    loader = make(2, torch.Generator().manual_seed(11))
    it = iter(loader)
    seen = [as_lists(next(it)) for _ in range(3)]
    state = checkpointed(loader.state_dict())
    for taken in (2, 3):  # resumed, then saved again before and after its own batches
        loader = make(2, torch.Generator().manual_seed(99))
        loader.load_state_dict(state)
        it = iter(loader)
        seen += [as_lists(next(it)) for _ in range(taken)]
        state = checkpointed(loader.state_dict())
    loader = make(2, torch.Generator().manual_seed(99))
    loader.load_state_dict(state)
    seen += epochs_of(loader, 1)[0]
    assert seen == expected[0]


def left_early(make, leave, stop=None, total=3, held=False, workers=3):
    """Epochs of persistent workers whose first epoch is left after ``leave`` batches (a
    ``break``, as Lightning's ``limit_train_batches`` makes one; 0: right after ``iter()``)
    while they had loaded more; with ``stop=(epoch, batches)``, saved there and continued by
    a new loader. ``held``: left once the pin thread holds a batch (every worker must be
    started by then)."""
    torch.manual_seed(3)
    loader = make(workers, torch.Generator().manual_seed(11))
    seen = []
    for epoch in range(total):
        it, batches = iter(loader), []
        while True:
            if stop == (epoch, len(batches)):
                loader = restarted(loader, lambda: make(workers, torch.Generator().manual_seed(99)))
                del it
                it = iter(loader)
            if epoch == 0 and len(batches) == leave:
                if held:
                    until_the_pin_thread_holds_a_batch(it)
                break
            batch = next(it, None)
            if batch is None:
                break
            batches.append(as_lists(batch))
        seen.append(batches)
    return seen


def until_the_pin_thread_holds_a_batch(it):
    """With pinning (rloader's PinnedBatches), waits until the pin thread has taken a batch
    not handed out: left then, that batch's worker state is what the next epoch starts from."""
    pinned = getattr(it, "_queue", None)
    deadline = time.monotonic() + 60
    while pinned is not None and not pinned.full():
        assert time.monotonic() < deadline, "the pin thread took no batch in 60 s"
        time.sleep(0.001)


@pytest.mark.parametrize(
    "workers,leave,stop",
    [
        (3, 0, (1, 1)),
        (3, 1, (1, 0)),
        (3, 3, (1, 1)),
        (3, 3, (1, 2)),
        (3, 2, (2, 1)),
        (3, 8, (1, 1)),
        (1, 3, (1, 0)),
    ],
)
@pytest.mark.parametrize("pinned", [False, True], ids=["", "pinned"])
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_after_an_epoch_left_early_persistent_workers_resume_their_draws(
    monkeypatch, worker_type, pinned, workers, leave, stop
):
    # The batches its workers made and nobody took moved their generators on: the next
    # epoch's state says where each worker went on from. Worker processes' batches are pinned
    # on a thread of the main process; thread workers pin their own.
    if pinned:
        monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: lambda b: b)
    make = augmenting(worker_type, persistent=True)
    # Left with the pin thread holding a batch: at 8 of 10 batches of 3 workers, worker 2's
    # last, whose state comes from the pin thread's hands; with 1 worker, one older than those
    # still owed, which come after it.
    held = pinned and leave >= 3 and (workers == 1 or leave == 8)
    expected = left_early(make, leave, held=held, workers=workers)
    assert left_early(make, leave, stop, held=held, workers=workers) == expected


@pytest.mark.parametrize("pinned", [False, True], ids=["", "pinned"])
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_an_epoch_left_early_moves_persistent_workers_draws_as_torchs(
    monkeypatch, worker_type, pinned
):
    # What the resumes above are compared with: torch's persistent workers also make every
    # batch whose keys were drawn before the next epoch starts, and draw for them.
    if pinned:
        # A slow pin thread: the keys drawn as the last batch was handed out are still in the
        # main thread's feed when the epoch is left; torch had put them to a worker.
        def slow(batch):
            time.sleep(0.2)
            return batch

        monkeypatch.setattr(rloader._pinning.policy, "pin_plan", lambda loader: slow)

    def torchs(workers, g):
        return tud.DataLoader(
            Augmenting(N), batch_size=4, shuffle=True, generator=g, num_workers=workers,
            persistent_workers=True,
        )  # fmt: skip

    theirs = left_early(torchs, 3)
    ours = left_early(augmenting(worker_type, persistent=True), 3)
    assert draws_of(ours) == draws_of(theirs)
