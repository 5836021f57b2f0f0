"""Nothing lost: a batch killed at its worst moment, a database or broker gone mid-batch, a full
disk, and a zip whose junk or damaged member must not stop the class.

Each submission is stored as one unit (its grades, status and notebook hash in one transaction):
a batch killed with SIGKILL between the grades and the commit, then run again with --resume,
grades the student again and keeps everyone else; a PostgreSQL restarted mid-batch is waited
for; one that stays away, a Redis that goes away, and a disk that fills stop the batch early
with one line, charging no student, and --resume finishes it. The moments are picked by a
wrapper around the grader's command line that stops the server or kills the process from
inside the grader (no hook in the grader itself).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import nbformat
import pytest

from grader.content.lessons import load_lesson
from tests import servers
from tests.grading_helpers import (
    REPO,
    WRONG_ANSWERS,
    cell,
    grader,
    grader_env,
    points,
    read_export,
    read_notebook,
    released_course,
    start_worker,
    stop,
    submit,
    wait_for,
)

LESSON = load_lesson("01_float_formats")
NAME = LESSON.notebook.name
FULL = sum(points(read_notebook(LESSON.notebook)).values())
WRONG, WRONG_SOURCE = WRONG_ANSWERS[LESSON.name]
ONE_WRONG = FULL - points(read_notebook(LESSON.notebook))[WRONG]

# Runs the grader's command line (the arguments after the first three) with one function of
# the grader wrapped: on its Nth call, ACTION happens first. ACTION: "kill" (SIGKILL, as the
# OOM killer or a lost machine do), "term" (SIGTERM), or "run:CMD" (a JSON list: a command to
# run, e.g. to stop a server), optionally "+then:SECONDS:CMD" (another command that long after,
# in a thread: start the server again). TARGET is module:Class.method or module:function.
WRAPPER = r"""
import importlib, json, os, signal, subprocess, sys, threading, time
target, nth, action = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module, _, attribute = target.partition(":")
owner = importlib.import_module(module)
*path, name = attribute.split(".")
for part in path:
    owner = getattr(owner, part)
original = getattr(owner, name)
calls = []

def act():
    first, _, then = action.partition("+then:")
    if first == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif first == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    elif first.startswith("run:"):
        subprocess.run(json.loads(first[4:]), check=True, capture_output=True)
    elif first == "raise":
        raise RuntimeError("refused by the test")
    if then:
        seconds, _, command = then.partition(":")
        threading.Thread(target=lambda: (time.sleep(float(seconds)), subprocess.run(
            json.loads(command), check=True, capture_output=True)), daemon=True).start()

def wrapped(*args, **kwargs):
    calls.append(1)
    if len(calls) == nth:
        act()
    return original(*args, **kwargs)

setattr(owner, name, wrapped)
from grader.cli import main
sys.exit(main(sys.argv[4:]))
"""
COMMIT = "grader.gradebook.ledger:write_in"  # inside a submission's transaction, before its commit
STORED = "grader.gradebook.store:store_submission"  # a submission is about to be stored


def wrapped_grader(target: str, nth: int, action: str, *args: str | Path,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WRAPPER, target, str(nth), action,
                           *map(str, args)], cwd=REPO, env={**grader_env(), **(env or {})},
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def released(tmp_path_factory, shared_tmp) -> Path:
    """A course directory with lesson 01 released (SQLite gradebook), copied for each test."""
    return released_course([LESSON], shared_tmp, tmp_path_factory.mktemp("released") / "course")


def course_copy(released: Path, where: Path) -> Path:
    shutil.copytree(released, where)
    return where


def the_class(folder: Path, students: dict[str, str]) -> Path:
    """Hand-ins: ``students`` maps an id to "full" (the instructor's answers) or "wrong" (one
    exercise wrong)."""
    for student, kind in students.items():
        nb = read_notebook(LESSON.notebook)
        if kind == "wrong":
            cell(nb, WRONG).source = WRONG_SOURCE
        submit(folder, student, nb, NAME)
    return folder


def scores(course: Path, tmp: Path) -> dict[str, tuple[float, str]]:
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {s: (float(r["score"]), r["status"])
            for (s, _), r in read_export(tmp / "grades.csv").items()}


def ledger_rows(course: Path) -> dict[str, dict]:
    from grader.gradebook import ledger

    return ledger.read(f"sqlite:///{course / 'gradebook.db'}", LESSON.name).get(LESSON.name, {})


@pytest.mark.slow
def test_a_batch_killed_between_grades_and_commit_keeps_whole_units_and_resume_finishes(
        released, tmp_path) -> None:
    course = course_copy(released, tmp_path / "course")
    hand_ins = the_class(tmp_path / "first", {"s1": "full", "s2": "full", "s3": "wrong"})
    # Killed inside s2's transaction: s1 is stored whole (status included), s2 not at all.
    done = wrapped_grader(COMMIT, 2, "kill", "autograde", LESSON.name, hand_ins, "--course-dir",
                          course, "--jobs", "1")
    assert done.returncode == -signal.SIGKILL
    kept = ledger_rows(course)
    assert set(kept) == {"s1"} and kept["s1"]["status"] == "graded"
    assert kept["s1"]["notebook_sha256"]
    done = grader("autograde", LESSON.name, hand_ins, "--course-dir", course, "--resume")
    assert "skipped s1" in done.stdout and "1 skipped, graded already" in done.stdout
    assert scores(course, tmp_path) == {"s1": (FULL, "graded"), "s2": (FULL, "graded"),
                                        "s3": (ONE_WRONG, "graded")}

    # A regrade of s2 with a new notebook, killed in its transaction: the old unit stands
    # (its score and hash, not zeros), and --resume grades the new notebook.
    again = the_class(tmp_path / "again", {"s1": "full", "s2": "wrong", "s3": "wrong"})
    done = wrapped_grader(COMMIT, 1, "kill", "autograde", LESSON.name, again, "--course-dir",
                          course, "--resume")
    assert done.returncode == -signal.SIGKILL
    assert scores(course, tmp_path)["s2"] == (FULL, "graded")
    done = grader("autograde", LESSON.name, again, "--course-dir", course, "--resume")
    assert "2 skipped" in done.stdout
    assert scores(course, tmp_path)["s2"] == (ONE_WRONG, "graded")


@pytest.mark.slow
def test_a_flagged_status_survives_a_kill_and_sigterm_cleans_up(released, tmp_path) -> None:
    """A flagged submission stored before the kill stays flagged (review lists it, the export
    says needs_review); a SIGTERM unwinds: the unzipped files go, the ledger's copy is written,
    one line says what to do."""
    course = course_copy(released, tmp_path / "course")
    flagged = read_notebook(LESSON.notebook)
    cell(flagged, "machine_epsilon").source += "\nimport os  # reaches for the file system"
    submit(tmp_path / "class", "a_flagged", flagged, NAME)
    the_class(tmp_path / "class", {"b_full": "full", "c_full": "full"})
    zipped = tmp_path / "class.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in sorted((tmp_path / "class").rglob("*.ipynb")):
            archive.write(file, file.relative_to(tmp_path / "class"))
    done = wrapped_grader(COMMIT, 2, "term", "autograde", LESSON.name, zipped, "--course-dir",
                          course, "--jobs", "1")
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("interrupted.")
    assert "Traceback" not in done.stderr
    assert not list(course.glob("unzip-*"))  # the students' files went with the batch
    copy = json.loads((course / "grading_status.json").read_text())
    assert copy[LESSON.name]["a_flagged"]["status"] == "needs_review"
    assert "b_full" not in copy[LESSON.name]
    listed = grader("review", LESSON.name, "--course-dir", course)
    assert "a_flagged" in listed.stdout
    assert scores(course, tmp_path)["a_flagged"][1] == "needs_review"


@pytest.mark.slow
def test_a_kernel_that_does_not_start_is_the_graders_error_said_in_one_line(released,
                                                                             tmp_path) -> None:
    """A kernel that does not start (here its launch refused) sends the submission to review as
    the grader's error, charges the student nothing, and leaves no traceback at exit (nbclient's
    exit hook once failed on the kernel manager it had let go)."""
    course = course_copy(released, tmp_path / "course")
    the_class(tmp_path / "class", {"s1": "full"})
    done = wrapped_grader("grader.grading.sandbox:SandboxKernelManager._async_launch_kernel", 1,
                          "raise", "autograde", LESSON.name, tmp_path / "class",
                          "--course-dir", course, "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert "s1: needs_review (grading error: the kernel did not start" in done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert scores(course, tmp_path)["s1"][1] == "needs_review"


@pytest.mark.slow
def test_a_sigkilled_batch_leaves_no_unzipped_files_after_the_next_run(released,
                                                                        tmp_path) -> None:
    course = course_copy(released, tmp_path / "course")
    the_class(tmp_path / "class", {"s1": "full"})
    zipped = tmp_path / "class.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.write(tmp_path / "class" / "s1" / NAME, f"s1/{NAME}")
    done = wrapped_grader(COMMIT, 1, "kill", "autograde", LESSON.name, zipped, "--course-dir",
                          course)
    assert done.returncode == -signal.SIGKILL
    assert len(list(course.glob("unzip-*"))) == 1  # what SIGKILL leaves
    grader("autograde", LESSON.name, zipped, "--course-dir", course, "--resume")
    assert list(course.glob("unzip-*")) == []
    assert scores(course, tmp_path)["s1"] == (FULL, "graded")


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL server of this module's own, which its tests stop and start again: the
    test run's shared one (tests/conftest.py) serves the other worker's tests meanwhile. Its
    tests are one xdist group, so that one worker starts it once."""
    if servers.postgres_bin() is None:
        pytest.skip("needs Debian's postgresql (make test installs it where it can)")
    with servers.postgres_server() as server:
        yield server


@pytest.mark.slow
@pytest.mark.xdist_group("faults-postgres")
def test_postgres_restarted_mid_batch_is_waited_for_and_every_grade_is_right(pg,
                                                                            tmp_path) -> None:
    url = servers.create_database(pg.url, "restart")
    course = tmp_path / "course"
    grader("release", LESSON.name, "--course-dir", course, "--db-url", url)
    hand_ins = the_class(tmp_path / "class", {"s1": "full", "s2": "wrong", "s3": "full"})
    action = (f"run:{json.dumps(pg.stop_command)}+then:4:{json.dumps(pg.start_command)}")
    done = wrapped_grader(STORED, 2, action, "autograde", LESSON.name, hand_ins,
                          "--course-dir", course, "--db-url", url, "--jobs", "1")
    assert done.returncode == 0, done.stderr
    assert "is not answering" in done.stdout and "trying again" in done.stdout
    assert "3 graded, 0 needs_review, 0 invalid of 3" in done.stdout
    grader("export", "--course-dir", course, "--db-url", url, "--csv", tmp_path / "g.csv")
    got = {s: (float(r["score"]), r["status"]) for (s, _), r in
           read_export(tmp_path / "g.csv").items()}
    assert got == {"s1": (FULL, "graded"), "s2": (ONE_WRONG, "graded"), "s3": (FULL, "graded")}


@pytest.mark.slow
@pytest.mark.xdist_group("faults-postgres")
def test_postgres_gone_for_long_stops_the_batch_in_one_line_and_resume_finishes(
        pg, tmp_path) -> None:
    url = servers.create_database(pg.url, "outage")
    course = tmp_path / "course"
    grader("release", LESSON.name, "--course-dir", course, "--db-url", url)
    hand_ins = the_class(tmp_path / "class", {"s1": "full", "s2": "wrong", "s3": "full"})
    try:
        done = wrapped_grader(STORED, 2, f"run:{json.dumps(pg.stop_command)}", "autograde",
                              LESSON.name, hand_ins, "--course-dir", course, "--db-url", url,
                              "--jobs", "1", env={"CTC_INFRASTRUCTURE_WAIT": "3"})
    finally:
        pg.start()
    assert done.returncode == 3, done.stdout + done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("stopped: the gradebook's database"), said
    assert "--resume" in said[0] and "Traceback" not in done.stdout + done.stderr
    assert "OverwriteKernelspec" not in done.stdout  # not blamed on the student's notebook
    done = grader("autograde", LESSON.name, hand_ins, "--course-dir", course, "--db-url", url,
                  "--resume")
    assert "1 skipped" in done.stdout
    grader("export", "--course-dir", course, "--db-url", url, "--csv", tmp_path / "g.csv")
    got = {s: (float(r["score"]), r["status"]) for (s, _), r in
           read_export(tmp_path / "g.csv").items()}
    assert got == {"s1": (FULL, "graded"), "s2": (ONE_WRONG, "graded"), "s3": (FULL, "graded")}


@pytest.mark.slow
def test_redis_restarted_mid_batch_is_waited_for_and_the_class_is_graded(tmp_path,
                                                                       shared_tmp) -> None:
    """On a Redis of this test's own (it is stopped and started again: a restart loses what
    it held, as a real one's without persistence does), not the run's shared one."""
    from grader.grading.distributed import QUEUE_KEY

    if servers.redis_programs() is None:
        pytest.skip("needs Debian's redis-server (make test installs it where it can)")
    hand_ins = the_class(tmp_path / "class", {"s1": "full", "s2": "wrong", "s3": "full"})
    course = released_course([LESSON], shared_tmp, tmp_path / "course")
    with servers.redis_server() as redis:
        url = redis.url.format(db=0)
        log = tmp_path / "worker.log"
        worker = start_worker(url, log, course / QUEUE_KEY)
        try:
            wait_for(lambda: "ready" in log.read_text(), 60, "the worker")
            action = (f"run:{json.dumps(redis.stop_command)}"
                      f"+then:3:{json.dumps(redis.start_command)}")
            done = wrapped_grader(STORED, 1, action, "autograde", LESSON.name, hand_ins,
                                  "--course-dir", course, "--broker", url)
        finally:
            stop(worker)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "is not answering" in done.stdout and "answers again" in done.stdout
    assert "3 graded, 0 needs_review, 0 invalid of 3" in done.stdout
    assert scores(course, tmp_path) == {"s1": (FULL, "graded"), "s2": (ONE_WRONG, "graded"),
                                        "s3": (FULL, "graded")}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_disk_that_fills_mid_batch_stops_it_in_one_line_and_resume_finishes(released,
                                                                             tmp_path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    try:
        course = course_copy(released, mount / "course")
        hand_ins = the_class(tmp_path / "class", {"s1": "full", "s2": "wrong", "s3": "full"})
        filler = mount / "filler"
        # After s1 is stored, something else fills the disk to 1 MiB from full.
        fill = ["sh", "-c", f"fallocate -l $(( $(df -B1 --output=avail {mount} | tail -1) "
                            f"- 1048576 )) {filler}"]
        done = wrapped_grader(STORED, 1, f"run:{json.dumps(fill)}", "autograde", LESSON.name,
                              hand_ins, "--course-dir", course, "--jobs", "1")
        assert done.returncode == 3, done.stdout + done.stderr
        said = done.stderr.strip().splitlines()
        assert len(said) == 1 and "is full" in said[0] and "--resume" in said[0], said
        assert len(done.stdout.splitlines()) < 10 and "Traceback" not in done.stdout
        filler.unlink()
        done = grader("autograde", LESSON.name, hand_ins, "--course-dir", course, "--resume")
        assert scores(course, tmp_path) == {
            "s1": (FULL, "graded"), "s2": (ONE_WRONG, "graded"), "s3": (FULL, "graded")}
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# ------------------------------------------------------------------ one student's file


def test_junk_beside_a_notebook_is_received_by_name_and_never_written(tmp_path) -> None:
    from grader.intake.zips import unpack_zip

    nb = nbformat.writes(read_notebook(LESSON.notebook))
    zipped = tmp_path / "lms.zip"
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"s1/{NAME}", nb)
        archive.writestr("s1/zeros.bin", b"\0" * (64 * 2**20))  # 64 MiB, a few kB zipped
        archive.writestr("s1/notes.txt", "hello")
        archive.writestr(f"s2/{NAME}", nb)
    assert zipped.stat().st_size < 2**20
    received = unpack_zip(zipped, tmp_path / "out")
    assert (tmp_path / "out" / "s1" / "zeros.bin").stat().st_size == 0  # its name only
    assert (tmp_path / "out" / "s1" / "notes.txt").read_text() == "hello"
    assert (tmp_path / "out" / "s2" / NAME).read_text() == nb
    assert received.refused_members == []
    written = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written < 2 * len(nb) + 100


def test_a_notebook_over_its_limit_and_a_damaged_member_are_refused_alone(tmp_path) -> None:
    from grader.intake.zips import MAX_NOTEBOOK_BYTES, unpack_zip

    nb = nbformat.writes(read_notebook(LESSON.notebook))
    zipped = tmp_path / "lms.zip"
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"s1/{NAME}", nb)
        archive.writestr(f"s2/{NAME}", nb)
        archive.writestr(f"s3/{NAME}", " " * (MAX_NOTEBOOK_BYTES + 1))
    # Damage s2's deflate stream in place (its header and size stay as they were).
    data = bytearray(zipped.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        member = archive.getinfo(f"s2/{NAME}")
    start = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)
    data[start:start + 16] = b"\xff" * 16
    zipped.write_bytes(bytes(data))
    with pytest.raises(zlib.error), zipfile.ZipFile(zipped) as archive:
        archive.read(f"s2/{NAME}")  # what used to stop the whole intake
    received = unpack_zip(zipped, tmp_path / "out")
    refused = {parts[0]: why for parts, why in received.refused_members}
    assert set(refused) == {"s2", "s3"}
    assert "cannot be unpacked" in refused["s2"] and "error" in refused["s2"]
    assert "larger than the 50 MiB" in refused["s3"]
    assert (tmp_path / "out" / "s1" / NAME).read_text() == nb


def test_leftover_unzip_folders_of_dead_batches_go_and_live_ones_stay(tmp_path) -> None:
    from grader.gradebook.received import UNZIP, remove_leftovers

    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    folders = {"dead": tmp_path / f"{UNZIP}{host}-{dead.pid}-abc",
               "alive": tmp_path / f"{UNZIP}{host}-{os.getpid()}-def",
               "old_format": tmp_path / f"{UNZIP}xyz123"}
    for folder in folders.values():
        (folder / "s1").mkdir(parents=True)
        (folder / "s1" / NAME).write_text("{}")
    old = time.time() - 7 * 3600
    os.utime(folders["old_format"], (old, old))
    removed = remove_leftovers(tmp_path)
    assert sorted(removed) == sorted([folders["dead"].name, folders["old_format"].name])
    assert folders["alive"].exists()


def test_code_nested_too_deeply_to_parse_is_flagged_not_fatal() -> None:
    from grader.grading.autograde import scan

    nb = read_notebook(LESSON.notebook)
    deep = "x = " + "1 + " * 100_000 + "1"  # a left-deep tree: RecursionError in ast.parse
    nb.cells.append(nbformat.v4.new_code_cell(deep))
    assert "code nested too deeply for the grader to read" in scan(
        nb, read_notebook(LESSON.notebook))


def test_an_infrastructure_fault_is_retried_within_its_bound_then_named() -> None:
    from sqlalchemy.exc import OperationalError

    from grader.common.faults import Unavailable, is_database_error, retrying

    tries = []

    def flaky():
        tries.append(1)
        if len(tries) < 3:
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("refused"))
        return "stored"

    said = []
    assert retrying(flaky, what="the db", is_transient=is_database_error, wait_seconds=10,
                    log=said.append) == "stored"
    assert len(tries) == 3 and len(said) == 1 and "trying again" in said[0]
    with pytest.raises(Unavailable) as stopped:
        retrying(lambda: (_ for _ in ()).throw(OperationalError("x", {}, OSError("down"))),
                 what="the db", is_transient=is_database_error, wait_seconds=0.8)
    assert str(stopped.value).startswith("the db (OperationalError")
    with pytest.raises(ValueError):  # not a fault of the infrastructure: not retried
        retrying(lambda: int("x"), what="the db", is_transient=is_database_error)
