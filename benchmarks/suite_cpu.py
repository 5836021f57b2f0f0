"""Where the test suite's time goes: CPU seconds per test file and per test, not only wall time.

    python benchmarks/suite_cpu.py [--top N] [PYTEST ARGS ...]     # runs the suite, then reports
    python benchmarks/suite_cpu.py --report DIR [--top N]          # reports an earlier run

On this project's 2-core machines the suite is CPU-bound (both cores busy about 95% of its wall
time), so what a change saves is CPU seconds, and pytest's ``--durations`` misleads: a test that
waits on a sleeping kernel shows long wall time and costs little, while a grading with
``--jobs 2`` costs twice its wall time. This script runs pytest as ``make test`` does (``-n 2
--dist loadgroup``) with itself loaded as a plugin, and charges each test (its set-up, call and
tear-down; a module- or session-scoped fixture goes to the first test that asks for it) with
the machine's CPU time while it ran (``/proc/stat``), shared equally with the test the other
worker ran at the same moment. That counts every process, sandboxed kernels, servers and the
browser included; what else runs on the machine meanwhile is counted too, so measure on an
otherwise idle one. ``own`` is the part that ``getrusage`` sees: the worker and the processes
it waited for (not the kernels, which the grader's sandbox ends as a group).

To report a ``make test`` run: ``PYTEST_ADDOPTS="-p benchmarks.suite_cpu"
CTC_CPU_REPORT=DIR make test``, then ``python benchmarks/suite_cpu.py --report DIR``.
A script that prints figures, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import itertools
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


def _machine() -> float:
    """CPU seconds the whole machine has been busy since it started (every core)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    own, busy, began = _cpu(), _machine(), time.monotonic()  # CLOCK_MONOTONIC: one per machine
    yield
    line = {"test": item.nodeid, "own": round(_cpu() - own, 3), "t0": began,
            "t1": time.monotonic(), "b0": busy, "b1": _machine()}
    Path(folder).mkdir(parents=True, exist_ok=True)  # the report's folder, made if new
    with (Path(folder) / f"worker-{os.getpid()}.jsonl").open("a") as handle:
        handle.write(json.dumps(line) + "\n")


def charged(rows: list[dict]) -> None:
    """Each row's ``cpu``: the machine's busy time over the row's run, each stretch between two
    samples (any test's start or end) shared equally by the tests running through it."""
    points = sorted({(r["t0"], r["b0"]) for r in rows} | {(r["t1"], r["b1"]) for r in rows})
    for r in rows:
        r["cpu"] = 0.0
    for (a, busy_a), (b, busy_b) in itertools.pairwise(points):
        running = [r for r in rows if r["t0"] <= a and r["t1"] >= b]
        for r in running:
            r["cpu"] += max(0.0, busy_b - busy_a) / len(running)


def report(folder: Path, top: int) -> None:
    rows = [json.loads(line) for path in sorted(folder.glob("worker-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"no figures in {folder}: was the suite run with -p benchmarks.suite_cpu?")
        return
    charged(rows)
    cpu = sum(r["cpu"] for r in rows)
    wall = sum(r["t1"] - r["t0"] for r in rows)
    span = max(r["t1"] for r in rows) - min(r["t0"] for r in rows)
    print(f"{len(rows)} tests in {span:.0f} s: {cpu:.0f} CPU seconds of the machine "
          f"({cpu / span:.2f} cores busy on average), {wall:.0f} worker seconds")
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        entry = files[r["test"].split("::")[0]]
        entry[0] += r["cpu"]
        entry[1] += r["own"]
        entry[2] += r["t1"] - r["t0"]
        entry[3] += 1
    print(f"\n{'CPU s':>8} {'share':>6} {'own s':>7} {'wall s':>7} {'tests':>6}  file")
    for name, (c, o, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:8.1f} {c / cpu:6.1%} {o:7.1f} {w:7.1f} {n:6d}  {name}")
    print(f"\n{'CPU s':>8} {'own s':>7} {'wall s':>7}  test (with the fixtures it set up first)")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:8.1f} {r['own']:7.1f} {r['t1'] - r['t0']:7.1f}  {r['test']}")


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
