"""Running a bench script (benches/real_pipelines.py, benches/fresh_workers.py) as
`python benches/...` runs it, as a process or as a module, and reading its printed tables."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parent.parent / "benches"


def run_bench(name: str, args: list, results: Path) -> subprocess.CompletedProcess:
    """``python benches/<name>.py ARGS``, its output captured, its run's file written under
    ``results``."""
    return subprocess.run(
        [sys.executable, str(BENCHES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "RLOADER_BENCH_RESULTS": str(results)},
    )


def bench_module(monkeypatch, name: str):
    """``benches/<name>.py`` imported, with benches/ on the path (as a script has it)."""
    monkeypatch.syspath_prepend(str(BENCHES))
    spec = importlib.util.spec_from_file_location(name, BENCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # (its dataclasses look it up there)
    spec.loader.exec_module(module)
    return module


def table(lines: list, header: str) -> dict:
    """The rows of the table whose header line starts with ``header``, by first cell; cells
    are separated by two spaces or more."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith("- "):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))
