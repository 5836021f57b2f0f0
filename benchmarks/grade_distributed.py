"""Grade the same synthetic class with the local pool and with workers on a queue.

    .venv/bin/python benchmarks/grade_distributed.py [--students 30] [--workers 2]
    .venv/bin/python benchmarks/grade_distributed.py --coordinator-only [--students 1000]
        [--workers 2] [--profile FILE]

Starts a Redis server on loopback (Debian's redis-server), grades the class of
``grade_class.py`` once with ``autograde --jobs W`` and once with ``--broker`` and W workers
started as separate processes (``--concurrency 1`` each) on this machine, and prints both
throughputs and their ratio. On one machine the queue can only cost: the point is how little.
Across machines throughput grows with the workers, each adding ``--concurrency`` submissions at
once.

``--coordinator-only`` measures the coordinator alone, at a class far larger than this machine
could run: how many workers one coordinator can feed. It grades three templates of the lesson
(right, one exercise wrong, the untouched student version) once for real through a worker that
records what it returns (benchmarks/replay_worker.py), then grades a class of N hand-ins made of
them with the real coordinator (a PostgreSQL gradebook) and W workers that run nothing: each
answers a task with the recorded result of its template, signed for that task by the grader's
own code, and the coordinator verifies and judges it as any worker's. Execution is replayed, not
run. It prints hand-ins a minute, the coordinator's CPU seconds a hand-in and peak memory, and
the CPU of the replay workers, Redis and PostgreSQL a hand-in. ``--profile FILE`` runs the
coordinator under py-spy (``pip install py-spy``; every thread, raw collapsed stacks). The
course has no key (``variants.key`` removed after release, as a course released before keys
existed): with one, each student's drawn numbers would make their notebook's run differ from
the template's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.grade_class import build_class  # noqa: E402
from grader.content.lessons import load_lesson  # noqa: E402
from grader.grading.distributed import queue_key  # noqa: E402
from tests import servers  # noqa: E402


def run(command: list[str], students: int) -> tuple[float, float, float]:
    """Run ``command`` (an autograde); print its summary line, and the CPU seconds and peak
    memory of its process and what it waited for (with workers: the coordinator's own work,
    the kernels of the exercises it judges again included; on the local pool: every
    kernel's too). Returns its wall time, those CPU seconds and the peak memory in MB."""
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
          f"({cpu / students:.3f} a submission); peak memory {usage.ru_maxrss / 1024:.0f} MB")
    return seconds, cpu, usage.ru_maxrss / 1024


def templates(lesson, release_nb: Path, folder: Path, wrong: str) -> list[Path]:
    """The notebooks the class is made of: right (the instructor's), with exercise ``wrong``
    raising NotImplementedError, and the untouched student version."""
    right = nbformat.read(lesson.notebook, as_version=4)
    partial = copy.deepcopy(right)
    for cell in partial.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == wrong \
                and cell.metadata.nbgrader.get("solution"):
            cell.source = cell.source.split("### BEGIN SOLUTION")[0] + \
                "    raise NotImplementedError()"
    paths = []
    for kind, nb in (("right", right), ("wrong", partial),
                     ("untouched", nbformat.read(release_nb, as_version=4))):
        path = folder / kind / lesson.notebook.name
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        paths.append(path)
    return paths


def workers_started(command: list[str], count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            for _ in range(count)]


def workers_stopped(workers: list[subprocess.Popen]) -> float:
    """Stop the workers; the CPU seconds they and their pool's processes used."""
    cpu = 0.0
    for worker in workers:
        os.killpg(worker.pid, signal.SIGTERM)
        _, _, usage = os.wait4(worker.pid, 0)
        worker.returncode = 0
        cpu += usage.ru_utime + usage.ru_stime
    return cpu


def server_cpu(folder: str) -> float:
    """The CPU seconds of the PostgreSQL server whose folder is ``folder`` (tests/servers.py):
    its postmaster's and those of the connections' processes it has reaped (one a connection),
    read from /proc."""
    pid = (Path(folder) / "data" / "postmaster.pid").read_text().split()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def coordinator_only(args, lesson, grader: list[str]) -> None:
    """Record three templates through a real worker, then grade N hand-ins of them on the
    real coordinator with replaying workers (see the module's docstring)."""
    import shutil

    import redis as redis_client
    from sqlalchemy import delete

    from grader.gradebook import ledger

    print("EXECUTION IS REPLAYED, NOT RUN: the workers answer with results recorded once; "
          "what is measured is the coordinator")
    with tempfile.TemporaryDirectory() as tmp_name, servers.redis_server() as redis, \
            servers.postgres_server() as postgres:
        tmp, url = Path(tmp_name), redis.url.format(db=0)
        db = servers.create_database(postgres.url, "replay")
        course = ["--course-dir", str(tmp / "course"), "--db-url", db]
        subprocess.run([*grader, "release", lesson.name, *course], cwd=REPO, check=True,
                       capture_output=True)
        for kept in (tmp / "course").glob("variants.key*"):  # a keyless course (see above)
            kept.unlink()
        with ledger.engine(db).begin() as connection:
            connection.execute(delete(ledger.COURSE_STATE))
        made = templates(lesson, tmp / "course" / "release" / lesson.name /
                         lesson.notebook.name, tmp / "templates", args.wrong)
        key = tmp / "course" / "queue.key"
        queue_key(key, create=True)
        worker = [sys.executable, str(REPO / "benchmarks" / "replay_worker.py"), "--broker",
                  url, "--queue-key", str(key)]
        recorded = tmp / "recorded"
        print(f"recording {len(made)} templates of {lesson.name} (right, {args.wrong} wrong, "
              "untouched) through a real worker:")
        workers = workers_started([*worker, "--record", str(recorded)], 1)
        try:
            run([*grader, "autograde", lesson.name, str(tmp / "templates"), *course,
                 "--broker", url], len(made))
        finally:
            worker_cpu = workers_stopped(workers)
        results = [json.loads(path.read_text()) for path in recorded.glob("*.json")]
        if len(results) != len(made):
            raise SystemExit(f"recorded {len(results)} results of {len(made)} templates")
        print(f"  the real worker: {worker_cpu:.1f} CPU s in all (its start included); the "
              "notebooks' own run times: "
              + ", ".join(f"{result.get('seconds', 0):.1f} s" for result in results))
        for number in range(args.students):
            target = tmp / "class" / f"student{number:05d}"
            target.mkdir(parents=True)
            shutil.copyfile(made[number % len(made)], target / lesson.notebook.name)
        print(f"{args.students} hand-ins of {lesson.name} on the coordinator, {args.workers} "
              "replaying workers (execution replayed, not run):")
        command = [*grader, "autograde", lesson.name, str(tmp / "class"), *course,
                   "--broker", url]
        if args.profile:
            command = [str(Path(sys.executable).parent / "py-spy"), "record", "--rate", "50",
                       "--format", "raw", "--output", str(args.profile.resolve()), "--",
                       *command]
        cpu_before = redis_client.Redis.from_url(url).info("cpu")
        postgres_before = server_cpu(postgres.folder)
        workers = workers_started([*worker, "--replay", str(recorded)], args.workers)
        try:
            seconds, cpu, peak = run(command, args.students)
        finally:
            replay_cpu = workers_stopped(workers)
        cpu_after = redis_client.Redis.from_url(url).info("cpu")
        postgres_cpu = server_cpu(postgres.folder) - postgres_before
    redis_cpu = sum(cpu_after[k] - cpu_before[k] for k in ("used_cpu_user", "used_cpu_sys"))
    n = args.students
    print(f"summary (EXECUTION REPLAYED, NOT RUN; {lesson.name}, a keyless course, PostgreSQL "
          f"gradebook{', under py-spy' if args.profile else ''}):")
    print(f"  {n} hand-ins in {seconds:.1f} s: {60 * n / seconds:.0f} a minute")
    print(f"  coordinator: {cpu / n:.3f} CPU s a hand-in ({cpu:.0f} s), peak memory {peak:.0f} MB")
    print(f"  replay workers: {replay_cpu / n:.3f} CPU s a hand-in; Redis: "
          f"{redis_cpu / n:.3f}; PostgreSQL: {postgres_cpu / n:.3f} (its connections' processes "
          "that ended)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lesson", default="01_float_formats")
    parser.add_argument("--coordinator-only", action="store_true",
                        help="measure the coordinator alone, the workers replaying results")
    parser.add_argument("--wrong", default="tensor_bytes",
                        help="with --coordinator-only: the exercise the wrong template fails")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="with --coordinator-only: py-spy's raw stacks of the coordinator")
    args = parser.parse_args()
    lesson = load_lesson(args.lesson)
    grader = [sys.executable, "-m", "grader"]
    if args.coordinator_only:
        coordinator_only(args, lesson, grader)
        return
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
                     str(tmp / "c1")], args.students)[0]
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
                          "--broker", url], args.students)[0]
        finally:
            for worker in workers:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    for name, seconds in (("local pool", local), ("workers", queued)):
        print(f"{name:>11}: {seconds:6.1f} s, {60 * args.students / seconds:5.1f} submissions/min")
    print(f"the queue costs {100 * (queued / local - 1):+.0f}% of the local pool's time")


if __name__ == "__main__":
    main()
