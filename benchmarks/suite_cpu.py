"""Where the test suite's time goes: CPU seconds per test file and per test, not only wall time.

    python benchmarks/suite_cpu.py [--top N] [PYTEST ARGS ...]     # runs the suite, then reports
    python benchmarks/suite_cpu.py --report DIR [--top N]          # reports an earlier run

On this project's 2-core machines the suite is CPU-bound (both cores busy about 95% of its wall
time), so what a change saves is CPU seconds, and pytest's ``--durations`` misleads: a test that
waits on a sleeping kernel shows long wall time and costs little, while a grading with
``--jobs 2`` costs twice its wall time. This script runs pytest as ``make test`` does (``-n 2
--dist loadgroup``) with itself loaded as a plugin; each test's cost is the CPU time of the
xdist worker and of every process it started and waited for (kernels, the grader's commands,
servers stopped by the test), from ``getrusage`` before and after the test's set-up, call and
tear-down. A module- or session-scoped fixture is charged to the first test that asks for it.

To report a ``make test`` run: ``PYTEST_ADDOPTS="-p benchmarks.suite_cpu"
CTC_CPU_REPORT=DIR make test``, then ``python benchmarks/suite_cpu.py --report DIR``.
A script that prints figures, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ENV = "CTC_CPU_REPORT"
REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    own, children = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get(ENV)
    cpu, wall = _cpu(), time.monotonic()
    yield
    if folder:
        line = {"test": item.nodeid, "cpu": round(_cpu() - cpu, 3),
                "wall": round(time.monotonic() - wall, 3)}
        with (Path(folder) / f"worker-{os.getpid()}.jsonl").open("a") as handle:
            handle.write(json.dumps(line) + "\n")


def report(folder: Path, top: int) -> None:
    rows = [json.loads(line) for path in sorted(folder.glob("worker-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"no figures in {folder}: was the suite run with -p benchmarks.suite_cpu?")
        return
    cpu, wall = sum(r["cpu"] for r in rows), sum(r["wall"] for r in rows)
    print(f"{len(rows)} tests: {cpu:.0f} CPU seconds, {wall:.0f} worker seconds of wall time")
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        entry = files[r["test"].split("::")[0]]
        entry[0] += r["cpu"]
        entry[1] += r["wall"]
        entry[2] += 1
    print(f"\n{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>6}  file")
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:8.1f} {c / cpu:6.1%} {w:8.1f} {n:6d}  {name}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test (with the fixtures it set up first)")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['test']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, help="report the figures written to DIR")
    parser.add_argument("--top", type=int, default=30, help="files and tests to list")
    args, pytest_args = parser.parse_known_args()
    if args.report is not None:
        report(args.report, args.top)
        return 0
    folder = Path(tempfile.mkdtemp(prefix="ctc-suite-cpu-"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-p", "benchmarks.suite_cpu", *pytest_args], cwd=REPO,
                          env={**os.environ, ENV: str(folder)})
    print(f"\npytest exited {done.returncode} after {time.monotonic() - started:.0f} s; "
          f"figures in {folder}\n")
    report(folder, args.top)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
