"""Where the bench scripts keep their runs: one dated JSON file per run in benches/results/.

A run's file holds what its figures need to be read later: the command, when it ran, the machine
(cores, CPU model, memory, GPU, load average), the versions (Python, torch, rloader and the git
revision of the checkout) and the figures. Every comparison of rloader with torch is a row of
``figures["comparisons"]``: its ratio (rloader's throughput over torch's, from the medians), the
spread (the lowest and highest ratio of one rloader run to the torch run beside it), how many
runs, and whether it is scored against a target.

Smoke runs (``--quick``: sizes too small to mean anything on a shared machine) are written to
``benches/results/smoke/``, which git ignores, and their rows are never scored.

    python benches/bench_results.py FILE...                       # one table of these runs' rows
    python benches/bench_results.py --latest side_by_side real_pipelines   # each bench's newest run
    python benches/bench_results.py --markdown FILE...            # the rows as the README's table
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
# (RLOADER_BENCH_RESULTS: another folder, for the tests of the bench scripts)
RESULTS_DIR = Path(os.environ.get("RLOADER_BENCH_RESULTS") or REPO / "benches" / "results")
SMOKE_DIR = RESULTS_DIR / "smoke"


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def load_average() -> Optional[float]:
    """The 1-minute load average: above ~0.5 on 2 cores other programs take time from the
    workers, and a run's figures are noisier."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _first_line(path: str, prefix: str) -> Optional[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict:
    """What the figures were measured on."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    mem_kib = _first_line("/proc/meminfo", "MemTotal")
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # no torch, or a broken CUDA setup: the CPU figures stand alone
        pass
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "cpu_model": _first_line("/proc/cpuinfo", "model name") or platform.processor() or None,
        "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
        "gpu": gpu,
        "os": platform.platform(),
        "load_average": load_average(),
    }


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def versions(**more: Optional[str]) -> dict:
    """Python, torch, rloader and the checkout's git revision ("+dirty" with uncommitted changes
    to tracked files); ``more`` names other libraries a bench imports."""
    import torch

    import rloader

    rev = _git("rev-parse", "--short=12", "HEAD")
    if rev and _git("status", "--porcelain", "--untracked-files=no"):
        rev += "+dirty"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rloader": rloader.__version__,
        "rloader_git_rev": rev,
        **more,
    }


def comparison(
    name: str,
    torch_s: list,
    rloader_s: list,
    *,
    target: Optional[float] = None,
    smoke: bool = False,
    **extra: object,
) -> dict:
    """One row of rloader against torch from the seconds (or, for a memory row, the bytes) of
    their interleaved runs: less is better for both. ``target`` scores the row unless it is a
    smoke run's."""
    if not torch_s or len(torch_s) != len(rloader_s):
        raise ValueError(f"{name}: runs of torch and rloader must pair up")
    pairs = [t / r for t, r in zip(torch_s, rloader_s)]
    ratio = statistics.median(torch_s) / statistics.median(rloader_s)
    row = {
        "name": name,
        "ratio": round(ratio, 4),
        "spread": [round(min(pairs), 4), round(max(pairs), 4)],
        "runs": len(pairs),
        "torch": [round(t, 6) for t in torch_s],
        "rloader": [round(r, 6) for r in rloader_s],
        "target": None if smoke else target,
    }
    if row["target"] is not None:
        # (judged as printed: a ratio shown as 1.50x meets 1.5x)
        row["met"] = round(ratio, 2) >= row["target"]
    row.update(extra)
    return row


def save(bench: str, figures: dict, *, smoke: bool, started: dt.datetime, **more: object) -> Path:
    """Writes one run's file and returns its path: ``results/<UTC start>-<bench>.json``, or
    under ``results/smoke/`` for a smoke run."""
    folder = SMOKE_DIR if smoke else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{started.strftime('%Y-%m-%dT%H%M%SZ')}-{bench}.json"
    record = {
        "bench": bench,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "started": started.isoformat(timespec="seconds"),
        "finished": now().isoformat(timespec="seconds"),
        "smoke": smoke,
        "machine": machine(),
        "versions": versions(),
        **more,
        "figures": figures,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def latest(bench: str) -> Optional[Path]:
    """The newest run of ``bench``, smoke or not (file names start with their UTC start)."""
    found = [*RESULTS_DIR.glob(f"*-{bench}.json"), *SMOKE_DIR.glob(f"*-{bench}.json")]
    return max(found, key=lambda p: p.name, default=None)


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def summary(paths: list) -> list:
    """The lines of one table over the comparison rows of these runs."""
    rows, smoke_files, full_files = [], [], []
    met = scored = 0
    for path in paths:
        record = json.loads(Path(path).read_text())
        smoke = record.get("smoke", False)
        (smoke_files if smoke else full_files).append(_rel(Path(path)))
        for row in record["figures"].get("comparisons", []):
            if smoke:
                verdict = "smoke run: not scored"
            elif row.get("target") is None:
                verdict = "-"
            else:
                scored += 1
                met += bool(row["met"])
                verdict = f"{'met' if row['met'] else 'below'} (target {row['target']:g}x)"
            lo, hi = row["spread"]
            rows.append(
                (
                    record["bench"],
                    row["name"],
                    f"{row['ratio']:.2f}x",
                    f"{lo:.2f}-{hi:.2f}x",
                    verdict,
                )
            )
    headers = ("bench", "rloader vs torch (unless the row says)", "ratio", "spread", "")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(
        "ratio: rloader's throughput over torch's (or the first named's over the second's), from the "
        "medians; spread: the lowest and highest ratio of one run to the run beside it."
    )
    if scored:
        lines.append(f"{met} of {scored} scored rows at their target.")
    if smoke_files:
        lines.append(
            "Smoke rows (--quick) are too short to mean anything on a shared machine; "
            "`make bench-real` runs the real pipelines in full."
        )
    for f in full_files + smoke_files:
        lines.append(f"Figures of this run, with its machine and versions: {f}")
    lines.append("Earlier runs and the README's tables: benches/results/")
    return lines


def markdown(paths: list) -> list:
    """The README's table of these runs' comparison rows: workload, ratio, spread (the README's
    tables are made with this, and tests/test_readme_figures.py checks them against the files)."""
    lines = ["| workload | ratio | spread |", "|---|---|---|"]
    for path in paths:
        for row in json.loads(Path(path).read_text())["figures"].get("comparisons", []):
            lo, hi = row["spread"]
            lines.append(f"| {row['name']} | {row['ratio']:.2f}× | {lo:.2f}–{hi:.2f}× |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--latest", nargs="+", default=[], metavar="BENCH")
    parser.add_argument("--markdown", action="store_true", help="the rows as the README's table")
    args = parser.parse_args()
    paths = list(args.files)
    for bench in args.latest:
        path = latest(bench)
        if path is None:
            parser.error(f"no run of {bench} in {_rel(RESULTS_DIR)}")
        paths.append(path)
    if not paths:
        parser.error("name the files, or --latest BENCH...")
    print("\n".join(markdown(paths)) if args.markdown else "\n" + "\n".join(summary(paths)))


if __name__ == "__main__":
    main()
