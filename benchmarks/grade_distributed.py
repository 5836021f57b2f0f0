"""Grade the same synthetic class with the local pool and with workers on a queue.

    .venv/bin/python benchmarks/grade_distributed.py [--students 30] [--workers 2]

Starts a Redis server on loopback (Debian's redis-server), grades the class of
``grade_class.py`` once with ``autograde --jobs W`` and once with ``--broker`` and W workers
started as separate processes (``--concurrency 1`` each) on this machine, and prints both
throughputs and their ratio. On one machine the queue can only cost: the point is how little.
Across machines throughput grows with the workers, each adding ``--concurrency`` submissions at
once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.grade_class import build_class  # noqa: E402
from grader.content.lessons import load_lesson  # noqa: E402
from grader.grading.distributed import queue_key  # noqa: E402
from tests import servers  # noqa: E402


def run(command: list[str], students: int) -> float:
    """Run ``command`` (an autograde); print its summary line, and the CPU seconds and peak
    memory of its process and what it waited for (with workers: the coordinator's own work,
    the kernels of the exercises it judges again included; on the local pool: every
    kernel's too). Returns its wall time."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, text=True)
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = 0
        seconds = time.perf_counter() - start
        out.seek(0)
        said = out.read()
    summary = [line for line in said.splitlines() if " of " in line and "graded" in line]
    print(f"  {summary[-1] if summary else said[-300:]}")
    cpu = usage.ru_utime + usage.ru_stime
    print(f"  {cpu:.0f} CPU s in the command and what it waited for "
          f"({cpu / students:.2f} a submission); peak memory {usage.ru_maxrss / 1024:.0f} MB")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lesson", default="01_float_formats")
    args = parser.parse_args()
    lesson = load_lesson(args.lesson)
    grader = [sys.executable, "-m", "grader"]
    with tempfile.TemporaryDirectory() as tmp_name, servers.redis_server() as redis:
        tmp, url = Path(tmp_name), redis.url.format(db=0)
        subprocess.run([*grader, "release", lesson.name, "--course-dir", str(tmp / "c0")],
                       cwd=REPO, check=True, capture_output=True)
        build_class(lesson, tmp / "c0" / "release" / lesson.name / lesson.notebook.name,
                    tmp / "class", args.students)
        print(f"{args.students} submissions of {lesson.name}; {args.workers} at once")
        print("local pool:")
        local = run([*grader, "autograde", lesson.name, str(tmp / "class"), "--jobs",
                     str(args.workers), "--cell-timeout", "20", "--course-dir",
                     str(tmp / "c1")], args.students)
        key = tmp / "c2" / "queue.key"  # the coordinator's, made before the workers start
        queue_key(key, create=True)
        workers = [subprocess.Popen([*grader, "worker", "--broker", url, "--concurrency", "1",
                                     "--queue-key", str(key)],
                                    cwd=REPO, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
                   for _ in range(args.workers)]
        try:
            time.sleep(8)  # the workers connect
            print(f"{args.workers} workers on a Redis queue:")
            queued = run([*grader, "autograde", lesson.name, str(tmp / "class"),
                          "--cell-timeout", "20", "--course-dir", str(tmp / "c2"),
                          "--broker", url], args.students)
        finally:
            for worker in workers:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    for name, seconds in (("local pool", local), ("workers", queued)):
        print(f"{name:>11}: {seconds:6.1f} s, {60 * args.students / seconds:5.1f} submissions/min")
    print(f"the queue costs {100 * (queued / local - 1):+.0f}% of the local pool's time")


if __name__ == "__main__":
    main()
