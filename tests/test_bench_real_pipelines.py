"""benches/real_pipelines.py: its tokens pipeline (numpy only, so it runs wherever the tests do)
run with --quick prints tables whose figures agree with each other and with what rloader's
loaders did; and its cache of generated data is made once and made again when its
parameters change."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from _bench_output import bench_module, number, run_bench, table

pytestmark = pytest.mark.timeout(280)

QUICK_WINDOWS, BATCH = 4_096, 32  # the tokens pipeline's epoch with --quick


def test_tokens_pipeline_quick_prints_tables_that_agree(tmp_path):
    results = tmp_path / "results"
    done = run_bench(
        "real_pipelines",
        ["--quick", "--pipelines", "tokens", "--repeats", "1", "--data-dir", str(tmp_path)],
        results,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    section = lines[next(i for i, line in enumerate(lines) if line.startswith("== tokens:")) :]

    loaders = table(section, "loader")
    names = ["torch num_workers=0", "rloader num_workers=0", "torch 2 processes"]
    names += ["rloader 2 processes", "torch 2 persistent processes"]
    names.append("rloader 2 persistent processes")
    assert list(loaders) == names
    rates = {}
    for name, cells in loaders.items():
        rate, epoch_s = number(cells[0]), number(cells[1])
        assert rate > 0 and epoch_s > 0
        # With one run the slowest and the fastest are that run.
        assert cells[2] == f"{cells[0]}-{cells[0]}"
        # rate x epoch = the epoch's windows (both rounded as printed).
        assert abs(rate * epoch_s - QUICK_WINDOWS) <= rate * 0.005 + 1
        if name.startswith("rloader"):
            # loader.stats() of that epoch: every batch handed out, the dataset's time seen.
            assert int(cells[3]) == QUICK_WINDOWS // BATCH
            stages = [number(c) for c in cells[4:]]
            assert len(stages) == 6 and all(s >= 0 for s in stages)
        else:
            assert cells[3:] == ["-"] * 7
        rates[name] = rate

    comparisons = table(section, "rloader vs torch")
    expected = {
        "num_workers=0": ("rloader num_workers=0", "torch num_workers=0"),
        "2 processes": ("rloader 2 processes", "torch 2 processes"),
        "rloader 2 processes vs rloader num_workers=0": (
            "rloader 2 processes",
            "rloader num_workers=0",
        ),
        "2 persistent processes": (
            "rloader 2 persistent processes",
            "torch 2 persistent processes",
        ),
        "rloader 2 persistent processes vs rloader num_workers=0": (
            "rloader 2 persistent processes",
            "rloader num_workers=0",
        ),
        "torch 2 processes vs torch num_workers=0": ("torch 2 processes", "torch num_workers=0"),
    }
    assert list(comparisons) == list(expected)
    for label, (ours, theirs) in expected.items():
        ratio, runs, shown_target, verdict = comparisons[label]
        assert abs(number(ratio) - rates[ours] / rates[theirs]) <= 0.01 + 0.01 * number(ratio)
        assert runs == f"{ratio[:-1]}-{ratio}"  # one run: its ratio is the median's
        # A --quick run is a smoke test: its rows are shown, never scored.
        assert (shown_target, verdict) == ("-", "(smoke)")
    assert "targets met" not in done.stdout

    # The run's file: under smoke/, its rows those of the table, none scored.
    (path,) = (results / "smoke").glob("*-real_pipelines.json")
    record = json.loads(path.read_text())
    assert record["smoke"] is True and record["bench"] == "real_pipelines"
    assert record["machine"]["cores"] == os.cpu_count()
    assert {"python", "torch", "rloader", "rloader_git_rev"} <= set(record["versions"])
    rows = {row["name"]: row for row in record["figures"]["comparisons"]}
    assert list(rows) == [f"tokens: {label}" for label in expected]
    for label in expected:
        row = rows[f"tokens: {label}"]
        assert f"{row['ratio']:.2f}x" == comparisons[label][0]
        assert row["target"] is None and row["runs"] == 1

    assert re.search(r"^- page cache: train\.bin \(10 MB\) read at [\d.]+ GB/s", done.stdout, re.M)
    assert re.search(r"^- one core .*: [\d,]+ windows/s", done.stdout, re.M)
    # A progress line per epoch on stderr: a warm-up and one run per loader.
    assert len(re.findall(r"^\[tokens\] (warm-up|run 1/1) ", done.stderr, re.M)) == 12


def test_generated_data_is_cached_until_its_parameters_change(tmp_path, monkeypatch):
    bench = bench_module(monkeypatch, "real_pipelines")
    made = []

    def make(folder: Path) -> None:
        made.append(folder.name)
        (folder / "data").write_text(str(len(made)))

    (tmp_path / "set.partial").mkdir()  # what an interrupted run left: not kept
    (tmp_path / "set.partial" / "stray").write_text("")
    first = bench.cached(tmp_path, "set", {"n": 1}, make)
    assert bench.cached(tmp_path, "set", {"n": 1}, make) == first
    assert made == ["set.partial"] and (first / "data").read_text() == "1"
    assert not (first / "stray").exists()
    # New parameters: made again, in place of the old data.
    assert bench.cached(tmp_path, "set", {"n": 2}, make) == first
    assert (first / "data").read_text() == "2"
    # An interrupted generation (no manifest) is not taken for finished data.
    (first / "manifest.json").unlink()
    bench.cached(tmp_path, "set", {"n": 2}, make)
    assert (first / "data").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]
