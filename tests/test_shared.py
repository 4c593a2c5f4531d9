"""rloader.shared: read-only containers whose data lives once per node in shared memory.

Python's list, numpy and dict are the oracles for what the containers read; /proc is the
witness of where their memory lives (one memfd, the same inode in every process that uses it,
mapped read-only) and of what is left when the processes holding them end.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from _children import TESTS, short_scratch_dir
from _datasets import Labelled, Whereabouts, labelled_items
from hypothesis import given, settings
from hypothesis import strategies as st

import rloader
from rloader.shared import SharedArray, SharedDict, SharedList

# Strings of every width CPython stores (ASCII, Latin-1, UCS-2, UCS-4), empty ones, a lone
# surrogate (a list can hold it; UTF-8 cannot without surrogatepass) and long ones.
ODD_STRINGS = [
    "",
    "a",
    "path/to/x.jpg",
    "été",
    "日本語",
    "😀 emoji",
    "\ud800x",
    "x" * 300,
    "\x00nul",
]


def fresh_key(what: str) -> str:
    """A key no other test (nor another run of this one) uses."""
    return f"test-{what}-{uuid.uuid4().hex[:12]}"


def outcome(f, *args):
    """What `f(*args)` gives: ("ok", value) or ("raises", the exception's type)."""
    try:
        return ("ok", f(*args))
    except Exception as e:  # noqa: BLE001 - the type is the outcome compared
        return ("raises", type(e))


def assert_reads_as(shared, plain, indices) -> None:
    """`shared` reads as the Python list `plain`: len, iteration, every index in `indices`
    (out of range and negative ones included), slices, and take over several index types."""
    assert len(shared) == len(plain)
    assert list(shared) == plain
    for i in indices:
        assert outcome(shared.__getitem__, i) == outcome(plain.__getitem__, i), i
    for s in [slice(None), slice(1, None, 2), slice(None, None, -1), slice(-3, 100), slice(5, 2)]:
        assert shared[s] == plain[s], s
    valid = [i for i in indices if -len(plain) <= i < len(plain)]
    want = [plain[i] for i in valid]
    assert shared.take(valid) == want
    assert shared.take(tuple(valid)) == want
    assert shared.take(np.array(valid, dtype=np.int64)) == want
    assert shared.take(np.array(valid, dtype=np.int32)[::-1]) == want[::-1]
    assert shared.take(torch.tensor(valid, dtype=torch.int64)) == want
    assert shared.take(iter(valid)) == want
    assert shared.take([]) == []


# ---- SharedList


@pytest.mark.parametrize(
    "items",
    [
        ODD_STRINGS,
        [s.encode("utf-8", "surrogatepass") for s in ODD_STRINGS],
        # Similar lengths: kept in fixed-width slots; a few longer ones lie outside them.
        [f"data/class{i % 10}/img_{i:07d}.jpg" for i in range(500)] + ["y" * 500, "z" * 40],
        # Lengths spread wide: offsets and bytes.
        ["w" * ((i * 7919) % 700) for i in range(300)],
        [],
    ],
    ids=["str", "bytes", "slots", "offsets", "empty"],
)
def test_a_list_reads_as_the_python_list(items):
    shared = SharedList(items)
    n = len(items)
    assert_reads_as(shared, items, [0, 1, n - 1, n, -1, -n, -n - 1, 10**30, 2])
    assert all(type(x) is type(y) for x, y in zip(shared, items))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40)), st.data())
def test_any_list_of_str_round_trips(items, data):
    shared = SharedList(items)
    assert list(shared) == items
    if items:
        idx = data.draw(st.lists(st.integers(-len(items), len(items) - 1), max_size=50))
        assert shared.take(idx) == [items[i] for i in idx]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=200)))
def test_any_list_of_bytes_round_trips(items):
    assert list(SharedList(items)) == items


def test_indices_must_be_integers():
    shared, plain = SharedList(["a", "b"]), ["a", "b"]
    for bad in [1.0, "0", None, [0]]:
        assert (
            outcome(shared.__getitem__, bad)
            == outcome(plain.__getitem__, bad)
            == ("raises", TypeError)
        )
    assert shared[np.int16(1)] == "b"
    assert shared[torch.tensor(-1)] == "b"
    for bad in [[0.5], ["a"], "01", b"\x00", np.array([0.0]), np.array([[0, 1]]), 3]:
        with pytest.raises(TypeError):
            shared.take(bad)
    for bad in [[2], [-3], np.array([5]), np.array([2**63], dtype=np.uint64)]:
        with pytest.raises(IndexError):
            shared.take(bad)


@pytest.mark.parametrize(
    "items, words",
    [
        ([1, 2], "item 0 is int"),
        (["a", b"b"], "item 0 is str, item 1 is bytes"),
        ([b"a", "b"], "item 0 is bytes, item 1 is str"),
        (["a", "b", None], "item 2 is NoneType"),
        ("abc", "not a single str"),
        (b"abc", "not a single bytes"),
        (5, "not int"),
        ([bytearray(b"x")], "item 0 is bytearray"),
    ],
)
def test_a_list_of_other_items_is_a_type_error(items, words):
    with pytest.raises(TypeError, match=words):
        SharedList(items)


def test_a_list_takes_tuples_and_iterables():
    assert list(SharedList(("a", "b"))) == ["a", "b"]
    assert list(SharedList(f"{i}" for i in range(3))) == ["0", "1", "2"]


def test_reads_write_nothing_and_the_memory_is_a_sealed_memfd():
    key = fresh_key("maps")
    shared = SharedList(["x" * 100] * 1000, key=key)
    [line] = [m for m in open("/proc/self/maps") if f"memfd:rloader-shared:{key}" in m]
    perms, inode = line.split()[1], int(line.split()[4])
    assert perms == "r--s", line  # mapped read-only: reading cannot write to it
    assert inode == shared._inode
    del shared
    gc.collect()
    assert not [m for m in open("/proc/self/maps") if key in m]
    assert not [fd for fd in os.listdir("/proc/self/fd") if key in _link(f"/proc/self/fd/{fd}")]


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


# ---- SharedArray


@pytest.mark.parametrize(
    "data",
    [
        np.arange(-50, 50, dtype=np.int64),
        np.arange(100, dtype=np.uint8),
        np.array([True, False, True]),
        np.linspace(0, 1, 7, dtype=np.float32),
        np.linspace(0, 1, 7, dtype=np.float16),
        np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
        np.arange(24, dtype=np.int16).reshape(4, 3, 2),
        np.arange(10, dtype=">i4"),  # big-endian in, native order kept
        np.arange(20, dtype=np.int64)[::3],  # not contiguous
        np.zeros((0,), dtype=np.float64),
    ],
    ids=lambda d: f"{d.dtype.str}{list(d.shape)}",
)
def test_an_array_reads_as_numpy(data):
    shared = SharedArray(data)
    view = shared.numpy()
    np.testing.assert_array_equal(view, data)
    assert view.dtype == data.dtype.newbyteorder("=")
    assert shared.shape == data.shape and shared.ndim == data.ndim and len(shared) == len(data)
    n = len(data)
    for i in [0, n - 1, -1, -n, n, -n - 1]:
        got = outcome(shared.__getitem__, i)
        want = outcome(lambda j: data[j].item() if data.ndim == 1 else data[j], i)
        if got[0] == "ok" and data.ndim > 1:
            np.testing.assert_array_equal(got[1], want[1])
        else:
            assert got == want, i
            if got[0] == "ok":
                assert type(got[1]) is type(want[1])
    if n:
        idx = [0, n - 1, -1, 0]
        np.testing.assert_array_equal(shared.take(idx), np.take(data, idx, axis=0))
        np.testing.assert_array_equal(shared.take(torch.tensor(idx)), np.take(data, idx, axis=0))
    assert (list(shared) == data.tolist()) if data.ndim == 1 else len(list(shared)) == n


def test_the_numpy_view_is_read_only_and_shares_the_memory():
    shared = SharedArray(np.arange(1000))
    a, b = shared.numpy(), np.asarray(shared)
    assert np.shares_memory(a, b)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 5
    with pytest.raises(ValueError):
        a.flags.writeable = True
    view_of_view = a[10:20]
    del shared, a, b
    gc.collect()
    assert view_of_view.tolist() == list(range(10, 20)), "a view keeps the memory mapped"


def test_an_array_from_a_tensor_and_a_list():
    assert SharedArray(torch.arange(5)).numpy().tolist() == [0, 1, 2, 3, 4]
    assert SharedArray([[1.5, 2], [3, 4]]).numpy().tolist() == [[1.5, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize(
    "data, error",
    [
        (["a", "b"], TypeError),
        (np.array([object(), 1], dtype=object), TypeError),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), TypeError),
        (5, ValueError),
        ([[1], [2, 3]], ValueError),  # ragged: numpy refuses it
    ],
)
def test_an_array_of_other_things_is_refused(data, error):
    with pytest.raises(error):
        SharedArray(data)


# ---- SharedDict


def test_a_dict_reads_as_the_python_dict():
    plain = {s: i * 7 - 20 for i, s in enumerate(ODD_STRINGS)} | {
        f"class{i}": i for i in range(1000)
    }
    plain["big"] = -(2**63)
    shared = SharedDict(plain)
    assert len(shared) == len(plain)
    assert list(shared) == list(plain)
    assert shared.keys() == list(plain.keys())
    assert shared.values() == list(plain.values())
    assert shared.items() == list(plain.items())
    assert dict(shared) == plain
    for k in list(plain) + ["absent", "class1000", "", 5, None, b"a", ("a",)]:
        assert outcome(shared.__getitem__, k) == outcome(plain.__getitem__, k), k
        assert (k in shared) == (k in plain)
        assert shared.get(k, "d") == plain.get(k, "d")
    assert shared.get("absent") is None
    assert shared.take(["class3", "a", "class3"]) == [3, plain["a"], 3]
    with pytest.raises(KeyError, match="nope"):
        shared.take(["a", "nope"])


def test_a_dict_takes_mappings_and_pairs():
    assert dict(SharedDict([("a", 1), ("b", 2)])) == {"a": 1, "b": 2}
    assert dict(SharedDict({})) == {}


@pytest.mark.parametrize(
    "mapping, error, words",
    [
        ({1: 2}, TypeError, "keys must be str: key 1 is int"),
        ({"a": 1.5}, TypeError, "values must be int: the value of key 'a' is float"),
        ({"a": "1"}, TypeError, "is str"),
        ({"a": 2**64}, OverflowError, None),
        ("ab", TypeError, "not str"),
        ([1, 2], TypeError, None),
    ],
)
def test_a_dict_of_other_things_is_refused(mapping, error, words):
    with pytest.raises(error, match=words):
        SharedDict(mapping)


# ---- Keys, versions and handles in one process


def test_pickles_as_a_small_handle_to_the_same_memory():
    for shared in [
        SharedList([f"p{i}" for i in range(100_000)]),
        SharedArray(np.arange(100_000)),
        SharedDict({f"k{i}": i for i in range(10_000)}),
    ]:
        data = pickle.dumps(shared)
        assert len(data) < 400, len(data)
        again = pickle.loads(data)
        assert type(again) is type(shared)
        assert again._inode == shared._inode
        assert again.content_hash == shared.content_hash


def test_the_same_items_under_a_key_are_one_copy_and_others_another():
    key = fresh_key("content")
    a = SharedList(["x", "y"], key=key)
    b = SharedList(["x", "y"], key=key)
    c = SharedList(["x", "z"], key=key)
    assert a._inode == b._inode
    assert c._inode != a._inode and list(c) == ["x", "z"]
    assert a.content_hash == b.content_hash != c.content_hash


def test_attach_finds_a_key_and_version_or_builds_once():
    key = fresh_key("version")
    calls = []

    def build():
        calls.append(1)
        return ["v1-a", "v1-b"]

    with pytest.raises(LookupError, match=key):
        SharedList.attach(key, version=1)
    a = SharedList.attach(key, version=1, build=build)
    b = SharedList.attach(key, version=1, build=build)
    c = SharedList.attach(key, version="1")
    assert calls == [1] and list(b) == ["v1-a", "v1-b"]
    assert a._inode == b._inode == c._inode
    with pytest.raises(LookupError):
        SharedList.attach(key, version=2)
    with pytest.raises(LookupError):
        SharedDict.attach(key, version=1)  # another class under the same key is another name
    with pytest.raises(TypeError, match="version"):
        SharedList.attach(key, version=1.5)


def test_a_failed_build_serves_nothing():
    key = fresh_key("fails")

    def build():
        raise RuntimeError("no items today")

    with pytest.raises(RuntimeError, match="no items today"):
        SharedList.attach(key, version=1, build=build)
    with pytest.raises(TypeError, match="item 1 is int"):
        SharedList.attach(key, version=1, build=lambda: ["a", 1])
    with pytest.raises(LookupError):
        SharedList.attach(key, version=1)
    assert list(SharedList.attach(key, version=1, build=lambda: ["ok"])) == ["ok"]


def test_a_handle_refuses_other_content_under_its_key_and_version():
    key = fresh_key("rebuilt")
    old = SharedList.attach(key, version="v", build=lambda: ["old"])
    handle = pickle.dumps(old)
    del old
    gc.collect()
    with pytest.raises(LookupError, match="any more"):
        pickle.loads(handle)  # nobody holds it: nothing to attach to
    new = SharedList.attach(key, version="v", build=lambda: ["new", "items"])
    with pytest.raises(ValueError, match="content hash"):
        pickle.loads(handle)
    assert list(pickle.loads(pickle.dumps(new))) == ["new", "items"]


def test_arrays_and_dicts_attach_by_key_too():
    key = fresh_key("kinds")
    a = SharedArray.attach(key, version=1, build=lambda: np.arange(6).reshape(2, 3))
    d = SharedDict.attach(key, version=1, build=lambda: {"x": 1})
    assert SharedArray.attach(key, version=1).numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert SharedDict.attach(key, version=1)["x"] == 1
    assert SharedArray(np.arange(6).reshape(2, 3), key=key)._inode != a._inode  # content key
    assert SharedDict({"x": 1}, key=key)._inode != d._inode


# ---- Every kind of worker


def _labelled(n: int, shared: bool, key: str | None = None):
    paths, labels, classes = labelled_items(n)
    if shared:
        return Labelled(
            SharedList(paths, key=key), SharedArray(labels, key=key), SharedDict(classes, key=key)
        )
    return Labelled(paths, labels, classes)


def test_each_engine_reads_the_same_batches_as_torch_from_python_lists(engine):
    kwargs = engine.torch_kwargs(batch_size=7, shuffle=False)
    want = list(tud.DataLoader(_labelled(100, shared=False), **kwargs))
    got = list(rloader.DataLoader(_labelled(100, shared=True), **engine.kwargs(batch_size=7)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[0] == w[0]
        assert torch.equal(g[1], w[1]) and torch.equal(g[2], w[2])


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_worker_processes_map_the_parents_memory(context):
    paths = SharedList([f"item-{i}" for i in range(200)])
    loader = rloader.DataLoader(
        Whereabouts(paths), batch_size=20, num_workers=2, multiprocessing_context=context
    )
    pids, inodes, items = set(), set(), []
    for pid, inode, item in loader:
        pids.update(pid.tolist())
        inodes.update(inode.tolist())
        items += item
    assert items == list(paths)
    assert os.getpid() not in pids and len(pids) == 2
    assert inodes == {paths._inode}, "every worker read the parent's memfd, not a copy"


def test_worker_threads_share_the_object():
    paths = SharedList([f"item-{i}" for i in range(200)])
    ds = Whereabouts(paths)
    got = list(rloader.DataLoader(ds, batch_size=20, num_workers=3, worker_type="thread"))
    assert {p for b in got for p in b[0].tolist()} == {os.getpid()}
    assert [x for b in got for x in b[2]] == list(paths)


# ---- Other processes: started fresh (as torchrun starts ranks), spawned, killed


class Child:
    """tests/_shared_child.py in a fresh interpreter, its report once it is ready."""

    def __init__(self, role, key, version, n="-", workers=0, context="spawn"):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(TESTS, "_shared_child.py"),
                role,
                key,
                str(version),
                str(n),
                str(workers),
                context,
            ],  # fmt: skip
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=TESTS,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(self.proc.communicate(timeout=60)[1])
        self.report = json.loads(line)

    @property
    def pids(self) -> list:
        return [self.report["pid"], *self.report["workers"]]

    def finish(self) -> None:
        out, err = self.proc.communicate("", timeout=120)
        assert self.proc.returncode == 0, err


def test_fresh_interpreters_attach_to_one_copy():
    key = fresh_key("ranks")
    builder = Child("build", key, 3, n=5000, workers=2)
    ranks = [Child("attach", key, 3, workers=2, context=c) for c in ["spawn", "fork"]]
    inode = builder.report["inode"]
    for c in [builder, *ranks]:
        assert c.report["items"] == ["item-00000000", "item-00004999"]
        assert c.report["inode"] == inode, "one memfd for every rank"
        assert c.report["worker_inodes"] == [inode], "and for every rank's workers"
        assert len(c.report["workers"]) == 2
    # This process attaches too, through a handle or by key.
    mine = SharedList.attach(key, version=3)
    assert mine._inode == inode and len(mine) == 5000
    for c in [builder, *ranks]:
        c.finish()


def test_torchrun_ranks_build_once_and_share_one_copy(tmp_path, request):
    # Ranks started by torchrun (not forked from one another) all attach with a build: one
    # builds, the others wait for it and map its memory, and so do their worker processes.
    key = fresh_key("torchrun")
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", TMPDIR=short_scratch_dir(request)
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=3",
            os.path.join(TESTS, "_shared_rank.py"),
            str(tmp_path),
            key,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=TESTS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert sum(r["built"] for r in ranks) == 1, "one rank builds"
    inode = ranks[0]["inode"]
    for r in ranks:
        assert r["inode"] == inode, "one memfd for every rank"
        assert r["worker_inodes"] == [inode], "and for every rank's workers"
        assert r["items"] == ["item-00000000", "item-00002999", 3000]


def test_a_handle_attaches_in_a_fresh_interpreter():
    shared = SharedList([f"h{i}" for i in range(1000)])  # built without a key
    code = textwrap.dedent("""
        import pickle, sys
        shared = pickle.loads(sys.stdin.buffer.read())
        print(shared._inode, shared[0], shared[-1], len(shared))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(shared), capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == [str(shared._inode), "h0", "h999", "1000"]


def _gone(pids) -> None:
    """Waits (on pidfds: no polling) until none of `pids` runs."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass  # already gone
    try:
        for fd in fds:
            ready, _, _ = select.select([fd], [], [], 60)
            assert ready, "a killed process is still running after 60 s"
    finally:
        for fd in fds:
            os.close(fd)


def _holders(key: str) -> list:
    """Every process that maps or holds a descriptor of the memfd of `key`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            maps = open(f"/proc/{pid}/maps").read()
            fds = [_link(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if f"rloader-shared:{key}" in maps or any(f"rloader-shared:{key}" in f for f in fds):
            found.append(int(pid))
    return found


def test_sigkill_of_every_holder_leaves_nothing():
    key = fresh_key("killed")
    shm_before = set(os.listdir("/dev/shm"))
    builder = Child("build", key, 1, n=20_000, workers=2, context="fork")
    ranks = [Child("attach", key, 1, workers=2, context="spawn")]
    everyone = builder.pids + ranks[0].pids
    assert sorted(_holders(key)) == sorted(everyone)
    for pid in everyone:
        os.kill(pid, signal.SIGKILL)
    for c in [builder, *ranks]:
        c.proc.communicate(timeout=60)
    _gone(everyone)
    assert _holders(key) == [], "no process maps the memfd or holds it: the kernel freed it"
    with pytest.raises(LookupError):
        SharedList.attach(key, version=1)  # and nobody serves its name
    new_in_shm = set(os.listdir("/dev/shm")) - shm_before
    assert not [n for n in new_in_shm if "rloader" in n or key in n], new_in_shm


def test_a_holder_serves_once_the_builder_is_killed():
    key = fresh_key("takeover")
    builder = Child("build", key, 1, n=1000)
    rank = Child("attach", key, 1)
    builder.proc.kill()
    builder.proc.communicate(timeout=60)
    # The rank takes the name over when it reads that the builder's connection ended; this
    # process waits for that to show in /proc/net/unix rather than for a while.
    _wait_listening(key, rank.report["pid"])
    again = SharedList.attach(key, version=1)
    assert again._inode == builder.report["inode"] and again[999] == "item-00000999"
    rank.finish()


def _listening_inodes(name_part: str) -> set:
    found = set()
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            listening = len(parts) >= 8 and int(parts[3], 16) & 0x10000  # __SO_ACCEPTCON
            if listening and name_part in parts[7]:
                found.add(parts[6])
    return found


def _wait_listening(key: str, pid: int) -> None:
    """Until process `pid` holds a listening socket whose name shows `key`. It is polled: the
    kernel has no notification for a bind. Bounded by 60 s."""
    import time

    deadline = time.monotonic() + 60
    while True:
        sockets = {_link(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
        if _listening_inodes(key[:24]) & sockets:
            return
        assert time.monotonic() < deadline, "the rank did not take over within 60 s"
        time.sleep(0.01)


def test_a_container_larger_than_dev_shm():
    """A 16 MB /dev/shm (Docker's default is 64 MB), mounted in a user and mount namespace of
    its own, and a 48 MB container read by spawned and forked workers: the container's memory
    is a memfd, which /dev/shm's size does not limit, and /dev/shm stays empty."""
    script = textwrap.dedent("""
        import os, sys
        import rloader
        from _datasets import Whereabouts
        from rloader.shared import SharedList
        items = [f"{i:010d}" + "x" * 70 for i in range(600_000)]   # 80 bytes each
        paths = SharedList(items)
        assert paths.nbytes > 48 * 2**20, paths.nbytes
        st = os.statvfs("/dev/shm")
        shm_size = st.f_blocks * st.f_frsize
        for ctx in ["spawn", "fork"]:
            seen = []
            loader = rloader.DataLoader(Whereabouts(paths), batch_size=20_000, num_workers=2,
                                        multiprocessing_context=ctx)
            for _, inode, item in loader:
                assert set(inode.tolist()) == {paths._inode}
                seen += item
            assert seen == items, ctx
        st = os.statvfs("/dev/shm")
        print(shm_size, (st.f_blocks - st.f_bfree) * st.f_frsize, paths.nbytes)
    """)
    mount = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$0" -c "$1"'
    contained = ["unshare", "-rm", "sh", "-c", mount, sys.executable, script]
    if shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"]).returncode == 0:
        done = subprocess.run(contained, capture_output=True, text=True, cwd=TESTS, timeout=300)
        assert done.returncode == 0, done.stderr
        shm_size, shm_used, nbytes = map(int, done.stdout.split())
        assert shm_size == 16 * 2**20 and nbytes > 3 * shm_size
        assert shm_used < 2**20, "the container is not in /dev/shm"
    else:
        # No user namespaces here: the same script against the real /dev/shm, whose usage
        # must not grow by the container's size (a memfd is not counted there).
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, cwd=TESTS, timeout=300
        )
        assert done.returncode == 0, done.stderr
        shm_size, shm_used, nbytes = map(int, done.stdout.split())
        assert shm_used < nbytes // 2
