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
