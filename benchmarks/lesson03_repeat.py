"""Run lesson 03's notebook several times and say how much each measured figure moves between runs.

    python benchmarks/lesson03_repeat.py [--runs 5] [--grading]

Each run executes the whole instructor notebook in a fresh kernel (as a student's Run All does;
``--grading`` sets NBGRADER_EXECUTION, as nbgrader does, so the demo cells shrink), then reads the
figures its measurement cells computed: the copy bandwidth, each matmul's FLOP/s, the best MFU,
the large add's share of its roofline and how many times longer a FLOP of it takes than one of
the best matmul. For each figure the table gives every run's value (each itself the median of the
notebook's rounds), their median and their spread: half the range, as a share of the median. The
aim is a spread within +-15% on an idle machine; the load average before each run is printed, since
other programs busy on the machine make the figures lower and the spread wider.

A script for checking the lesson, not a test: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import nbformat

from grader.lab.progress import execute

LESSON = Path(__file__).resolve().parent.parent / "notebooks" / "03_matmul_flops"
MARKER = "LESSON03-FIGURES "
# Appended to the notebook: the figures its cells left in the kernel, as one JSON line.
REPORT = f"""
import json as _json
_figures = {{"copy bandwidth GB/s": bandwidth / 1e9 if device.type == "cpu" else None,
             "best matmul MFU %": 100 * best["mfu"],
             "large add, % of its roofline": 100 * large["measured"] / large["predicted"],
             "add / matmul time per FLOP": best["measured"] / large["measured"]}}
_figures.update({{f"matmul n={{row['n']}} GFLOP/s": row["measured"] / 1e9 for row in matmul_rows}})
print({MARKER!r} + _json.dumps(_figures))
"""


def run_once(grading: bool) -> dict[str, float]:
    """Execute the notebook in a fresh kernel; the figures its measurement cells computed."""
    nb = nbformat.read(next(LESSON.glob("*.ipynb")), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    execute(nb, LESSON, "validate" if grading else None, 300)
    text = "".join(output.get("text", "") for output in nb.cells[-1].outputs)
    line = next(line for line in text.splitlines() if line.startswith(MARKER))
    return {name: value for name, value in json.loads(line[len(MARKER):]).items()
            if value is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--grading", action="store_true",
                        help="set NBGRADER_EXECUTION, as nbgrader does (smaller demo cells)")
    args = parser.parse_args()
    runs: list[dict[str, float]] = []
    for i in range(args.runs):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        start = time.perf_counter()
        runs.append(run_once(args.grading))
        print(f"run {i + 1}: {time.perf_counter() - start:.1f} s (notebook and kernel start), "
              f"load average before it {load:.2f}", flush=True)
    names = [name for name in runs[0] if all(name in run for run in runs)]
    width = max(len(name) for name in names)
    print()
    print(f"{'figure':<{width}}  {'runs':<{9 * args.runs}}{'median':>9}{'spread':>9}")
    worst = 0.0
    for name in names:
        values = [run[name] for run in runs]
        median = statistics.median(values)
        spread = (max(values) - min(values)) / 2 / median if median else float("nan")
        worst = max(worst, spread)
        print(f"{name:<{width}}  {''.join(f'{v:<9.3g}' for v in values)}{median:>9.3g}"
              f"{spread:>8.0%}{'' if spread <= 0.15 else ' *'}")
    print(f"\nspread = (largest - smallest) / 2 / median; * marks a spread beyond +-15%. "
          f"Widest: +-{worst:.0%}.")


if __name__ == "__main__":
    main()
