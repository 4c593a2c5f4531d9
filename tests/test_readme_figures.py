"""The README's figures are runs' figures: each row of its table for this machine kind (the
2-core VM's, made with ``benches/bench_results.py --markdown``) is a comparison row, with its
ratio and spread, of a run kept in benches/results/."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| (?P<name>.+) \| (?P<ratio>[\d.]+)× \| (?P<lo>[\d.]+)–(?P<hi>[\d.]+)× \|$")


def _readme_rows(section: str) -> list:
    text = (REPO / "README.md").read_text()
    body = text.split(f"### {section}", 1)[1].split("\n#", 1)[0]
    return [m.groupdict() for line in body.splitlines() if (m := ROW.match(line))]


def _results() -> dict:
    rows = {}
    for path in sorted((REPO / "benches" / "results").glob("*.json")):
        record = json.loads(path.read_text())
        for row in record["figures"].get("comparisons", []):
            lo, hi = row["spread"]
            rows.setdefault(row["name"], set()).add(
                (f"{row['ratio']:.2f}", f"{lo:.2f}", f"{hi:.2f}")
            )
    return rows


def test_the_2_core_tables_rows_are_runs_in_benches_results():
    rows = _readme_rows("2-core VM")
    assert len(rows) >= 10, "the README's 2-core table was not found"
    results = _results()
    for row in rows:
        figures = (row["ratio"], row["lo"], row["hi"])
        assert figures in results.get(row["name"], set()), (
            f"README row {row['name']!r} ({figures}) is no run in benches/results/"
        )


# The GPU machines' tables, older runs whose files hold the printed table and its text (no
# comparison rows): each figure a row prints is one of its run's.
GPU_TABLES = {
    "NVIDIA H100": "2026-11-26-gpu-h100.json",
    "NVIDIA H200": "2026-11-27-gpu-h200.json",
}
NUMBER = re.compile(r"\d(?:[\d,]*\d)?(?:\.\d+)?")  # (1,129 and 2.58; not a trailing comma)


def _table_figures(section: str) -> list:
    """Every number in the rows of the README's table under ``### {section}``."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"### {section}", 1)[1].split("\n#", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ") and "---" not in line]
    return [n for row in rows[1:] for n in NUMBER.findall(row)]  # (the header's names aside)


def _unrecorded(figures: list, record: dict) -> list:
    recorded = set(NUMBER.findall(json.dumps(record["figures"], ensure_ascii=False)))
    return [n for n in figures if n not in recorded]


def test_the_gpu_tables_figures_are_their_runs():
    for section, name in GPU_TABLES.items():
        record = json.loads((REPO / "benches" / "results" / name).read_text())
        figures = _table_figures(section)
        assert len(figures) >= 10, f"the README's {section} table was not found"
        assert _unrecorded(figures, record) == [], f"{section}: figures not in {name}"


def test_a_figure_of_no_run_is_seen():
    record = {"figures": {"table": {"rows": [["4", "2.58 GB/s"]]}, "text": "1,129 img/s"}}
    assert _unrecorded(["4", "2.58", "1,129"], record) == []
    assert _unrecorded(["2.59", "1,130"], record) == ["2.59", "1,130"]
