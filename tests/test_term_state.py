"""A term's state that survives every re-run (issue 43): grades that say which checks made them,
a batch of another lesson refused and a batch withdrawn, one batch of a lesson at a time that
grades the bytes it hashed, feedback pages current while their grades are, files written
whole, a read-only or damaged course directory said in one line.

One class of lesson 01 is graded once per test run (tests/grading_helpers.graded_class, which
tests/test_distributed.py reads too): s1 the instructor's answers, s2 one exercise wrong, s3
flagged (its code reaches for the file system), s4 the student version untouched. Each test
works on its own copy of that course directory. The faults are real: a second grader's
process, a grader stopped or blocked at a chosen moment (the wrapper of tests/test_faults.py),
a tmpfs that fills or is mounted read-only, the test run's PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.content.lessons import load_lesson
from tests import servers
from tests.grading_helpers import (
    REPO,
    WRONG_ANSWERS,
    graded_class,
    grader,
    grader_env,
    points,
    read_export,
    read_notebook,
    submit,
)
from tests.test_faults import WRAPPER, wrapped_grader

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("term-state")]

LESSON = load_lesson("01_float_formats")
NAME = LESSON.notebook.name
FULL = sum(points(read_notebook(LESSON.notebook)).values())
WRONG, WRONG_SOURCE = WRONG_ANSWERS[LESSON.name]
ONE_WRONG = FULL - points(read_notebook(LESSON.notebook))[WRONG]


@pytest.fixture(scope="module")
def graded(shared_tmp) -> dict:
    """The run's graded class of lesson 01 (``course``, ``class``, ``printed``): read it, copy
    the course directory before writing."""
    graded = graded_class(LESSON, shared_tmp)
    assert "3 graded, 1 needs_review, 0 invalid of 4" in graded["printed"], graded["printed"]
    return graded


def copy_of(graded: dict, where: Path) -> Path:
    shutil.copytree(graded["course"], where, symlinks=True)
    return where


def ledger(course: Path) -> dict[str, dict]:
    from grader.gradebook import ledger as rows

    return rows.read(f"sqlite:///{course / 'gradebook.db'}", LESSON.name).get(LESSON.name, {})


def set_details(course: Path, **changes) -> None:
    """Change the ledger's rows as another grader (another version of the checks, a clock
    ahead) would have written them: ``student=(key, value)`` in ``details``, or
    ``graded_at=seconds`` for everyone."""
    import sqlite3

    with sqlite3.connect(course / "gradebook.db") as db:
        for student, change in changes.items():
            if student == "graded_at":
                continue
            key, value = change
            details = json.loads(db.execute(
                "SELECT details FROM ctc_grading_status WHERE student_id = ?",
                (student,)).fetchone()[0])
            details[key] = value
            db.execute("UPDATE ctc_grading_status SET details = ? WHERE student_id = ?",
                       (json.dumps(details, sort_keys=True), student))
        if "graded_at" in changes:
            db.execute("UPDATE ctc_grading_status SET graded_at = ?", (changes["graded_at"],))


def version(course: Path) -> str:
    from grader.course import Course

    return Course(course, log=lambda _: None).checks_version(LESSON)


# ------------------------------------------------------------------ item 1: the checks' version

def test_every_grade_says_which_checks_made_it_and_resume_grades_again_the_others(
        graded, tmp_path) -> None:
    course = copy_of(graded, tmp_path / "course")
    current = version(course)
    assert {s: r.get("checks") for s, r in ledger(course).items()} == {
        s: current for s in ("s1", "s2", "s3", "s4")}
    grader("review", LESSON.name, "s3", "--accept", "--course-dir", course)
    # s1 and s3 graded with checks since fixed (a `git pull`, a case corrected and synced)
    set_details(course, s1=("checks", "0ld0ld0ld0ld"), s3=("checks", "0ld0ld0ld0ld"))
    said = grader("report", LESSON.name, "--course-dir", course).stdout
    assert f"checks: 2 graded with the lesson's checks now ({current})" in said
    assert "2 graded with other checks (0ld0ld0ld0ld: 2)" in said and "--resume" in said
    shown = grader("review", LESSON.name, "s1", "--course-dir", course).stdout
    assert f"graded with checks 0ld0ld0ld0ld, not the lesson's now ({current})" in shown
    # a roster given since: the students --resume skips take its names too, ungraded
    (tmp_path / "roster.csv").write_text("student_id,name,email\n" + "".join(
        f"s{n},Student {n},s{n}@uni.edu\n" for n in range(1, 5)))
    grader("roster", tmp_path / "roster.csv", "--course-dir", course)
    before = ledger(course)["s2"]
    done = grader("autograde", LESSON.name, graded["class"], "--course-dir", course,
                  "--resume")
    after = ledger(course)["s2"]
    assert (after["handin"]["name"], after["handin"]["email"]) == ("Student 2", "s2@uni.edu")
    assert {k: v for k, v in after.items() if k != "handin"} == {
        k: v for k, v in before.items() if k != "handin"}
    assert ("2 of these very notebooks were graded with other checks than the lesson's now "
            f"({current}; theirs: 0ld0ld0ld0ld: 2): graded again") in done.stdout
    assert "skipped s2 (Student 2)" in done.stdout and "skipped s4" in done.stdout
    assert "skipped s1" not in done.stdout and "skipped s3" not in done.stdout
    # s3's flag is settled by the decision kept: the summary says so rather than "lost"
    assert ("1 graded, 1 needs_review (1 settled by review decisions, kept), 0 invalid of 4; "
            "2 skipped") in done.stdout
    assert {r.get("checks") for r in ledger(course).values()} == {current}
    shown = grader("review", LESSON.name, "s1", "--course-dir", course).stdout
    assert f"graded with checks {current} (the lesson's checks now)" in shown


def test_the_checks_version_follows_the_cases_the_reference_and_the_release(tmp_path,
                                                                          monkeypatch) -> None:
    """Whatever decides an expected value changes the version: the hidden cases, the
    reference code, the released lesson; the same files give the same version."""
    from dataclasses import replace

    from grader.gradebook.checks import checks_version

    class Course:
        root = tmp_path

    import importlib.util

    cases = Path(importlib.util.find_spec(LESSON.cases).origin).read_text()
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "ctc_cases_a.py").write_text(cases)
    (tmp_path / "mods" / "ctc_cases_b.py").write_text(cases + "\n# a case fixed\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    a, b = replace(LESSON, cases="ctc_cases_a"), replace(LESSON, cases="ctc_cases_b")
    assert checks_version(Course, a) == checks_version(Course, a)
    assert checks_version(Course, a) != checks_version(Course, b)
    assert checks_version(Course, a) != checks_version(Course,
                                                       replace(a, module="grader.common.text"))
    released = tmp_path / "source" / LESSON.name / NAME
    released.parent.mkdir(parents=True)
    before = checks_version(Course, a)
    released.write_text("{}")
    assert checks_version(Course, a) != before
    # the grader's own judging too: the expected values of each student's checks, the
    # comparison, the verdicts, the cases' tolerances (a fix there was invisible to --resume)
    from grader.gradebook import checks

    for module in ("grader.grading.plans", "grader.grading.probe", "grader.grading.execute",
                   "grader.content.cases"):
        copy = tmp_path / "mods" / f"judging_{module.replace('.', '_')}.py"
        copy.write_text(Path(importlib.util.find_spec(module).origin).read_text()
                        + "\n# a bug fixed\n")
        as_now = checks_version(Course, a)
        monkeypatch.setattr(checks, "JUDGING", tuple(copy.stem if m == module else m
                                                     for m in checks.JUDGING))
        assert checks_version(Course, a) != as_now, module
        monkeypatch.undo()
        monkeypatch.syspath_prepend(str(tmp_path / "mods"))


# ------------------------------------------------------------------ item 2: wrong lesson, withdraw

def test_a_download_of_another_lesson_is_refused_before_anything_is_graded(graded,
                                                                           tmp_path) -> None:
    course = copy_of(graded, tmp_path / "course")
    done = grader("autograde", "05_adamw_memory", graded["class"], "--course-dir", course,
                  check=False)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith("error: every hand-in is float_formats.ipynb, the notebook of "
                              "01_float_formats, and none is adamw_memory.ipynb: did you mean")
    assert not (course / "release" / "05_adamw_memory").exists()  # refused before release
    from grader.gradebook import ledger as rows

    assert "05_adamw_memory" not in rows.read(f"sqlite:///{course / 'gradebook.db'}")


def test_a_link_or_a_pipe_at_the_lock_is_refused_and_nothing_it_names_is_written(
        graded, tmp_path) -> None:
    """The lesson's lock file is opened without following a link, and must be a regular file:
    a symlink put at its name pointing to the course's key (once, ``withdraw`` truncated the
    key through it) and a named pipe are each refused in one line, the key untouched."""
    course = copy_of(graded, tmp_path / "course")
    key = course / "variants.key"
    before = key.read_bytes()
    lock = course / f".gradebook.db.{LESSON.name}.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(key)
    for command in (("withdraw", LESSON.name, "s2", "--reason", "x"),
                    ("autograde", LESSON.name, graded["class"])):
        done = grader(*command, "--course-dir", course, check=False)
        assert done.returncode != 0 and "is a symbolic link, not the grader's lock file; " \
            "remove it and run again" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert key.read_bytes() == before and lock.is_symlink()
    lock.unlink()
    os.mkfifo(lock)
    done = grader("withdraw", LESSON.name, "s2", "--reason", "x", "--course-dir", course,
                  check=False)
    assert done.returncode != 0 and "is not a regular file" in done.stderr, done.stderr
    lock.unlink()
    grader("withdraw", LESSON.name, "s2", "--reason", "x", "--course-dir", course)  # then it runs


def test_withdraw_removes_a_batchs_grades_and_logs_why(graded, tmp_path) -> None:
    from grader.gradebook.decisions import state_of
    from grader.gradebook.ledger import read_decisions

    course = copy_of(graded, tmp_path / "course")
    url = f"sqlite:///{course / 'gradebook.db'}"
    grader("review", LESSON.name, "s2", "--set", f"{WRONG}=1", "--note", "close enough",
           "--course-dir", course)
    unknown = grader("withdraw", LESSON.name, "s9", "--reason", "x", "--course-dir", course,
                     check=False)
    assert unknown.returncode == 2 and "no grades of 01_float_formats to withdraw for s9; " \
        "graded: s1, s2, s3, s4" in unknown.stderr
    done = grader("withdraw", LESSON.name, "s2", "s4", "--reason", "handed in for lesson 02",
                  "--by", "ta_1", "--course-dir", course)
    assert "withdrew the grades of 2 student(s), as ta_1 (handed in for lesson 02): s2, s4" \
        in done.stdout
    assert set(ledger(course)) == {"s1", "s3"}
    grader("export", "--course-dir", course, "--csv", tmp_path / "g.csv")
    assert {s for s, _ in read_export(tmp_path / "g.csv")} == {"s1", "s3"}
    with __import__("sqlite3").connect(course / "gradebook.db") as db:
        left = db.execute("SELECT COUNT(*) FROM submitted_assignment sa JOIN student s ON "
                          "sa.student_id = s.id WHERE s.id IN ('s2', 's4')").fetchone()[0]
    assert left == 0
    logged = [r for r in read_decisions(url, LESSON.name) if r["action"] == "withdraw"]
    assert {(r["student_id"], r["by"], r["note"]) for r in logged} == {
        ("s2", "ta_1", "handed in for lesson 02"), ("s4", "ta_1", "handed in for lesson 02")}
    assert state_of(url, LESSON.name, "s2").in_force == []  # made on the grades withdrawn
    assert not (course / "autograded" / "s2" / LESSON.name).exists()
    # graded again, afresh: the withdrawn decision is not applied
    grader("autograde", LESSON.name, graded["class"], "--course-dir", course, "--resume")
    assert float(read_export_after(course, tmp_path)[("s2", LESSON.name)]["score"]) == ONE_WRONG


def test_withdrawn_grades_leave_the_lms_files_and_say_whose_the_lms_still_holds(
        graded, tmp_path) -> None:
    """Grades exported for Canvas, then withdrawn: withdraw names the students whose grades
    the LMS file held (they must be cleared in Canvas); once no grade of the lesson is left,
    the next export removes the lesson's Canvas file (it would import withdrawn grades again)
    and says "no grades left", as a --lesson export does."""
    course = copy_of(graded, tmp_path / "course")
    (tmp_path / "assignments.csv").write_text(f"lesson,title,id,points\n{LESSON.name},"
                                              "Float formats,4242,\n")
    (tmp_path / "roster.csv").write_text("student_id,lms_id\n" + "".join(
        f"s{n},{100 + n}\n" for n in range(1, 5)))  # each student's Canvas user id
    canvas = ("export", "--format", "canvas", "--assignments", tmp_path / "assignments.csv",
              "--roster", tmp_path / "roster.csv", "--course-dir", course)
    grader(*canvas)
    target = course / f"grades-canvas-{LESSON.name}.csv"
    assert target.is_file()
    done = grader("withdraw", LESSON.name, "s1", "--reason", "wrong class", "--course-dir",
                  course)
    assert f"the LMS may still hold the grades you imported from {target.name} for s1: " \
        "clear them there" in done.stdout, done.stdout
    grader("withdraw", LESSON.name, "--reason", "wrong class", "--course-dir", course)
    done = grader(*canvas, check=False)
    assert f"no grades left for {LESSON.name}: removed {target}" in done.stdout, done.stdout
    assert not target.exists()
    done = grader(*canvas[:-2], "--lesson", LESSON.name, "--course-dir", course, check=False)
    assert done.returncode == 2 and "every one withdrawn" in done.stderr, done.stderr


def read_export_after(course: Path, tmp: Path) -> dict:
    grader("export", "--course-dir", course, "--csv", tmp / "after.csv")
    return read_export(tmp / "after.csv")


# ------------------------------------------------------------------ item 3: one batch at a time

def test_one_batch_of_a_lesson_at_a_time_grading_the_bytes_it_hashed(graded,
                                                                     tmp_path) -> None:
    """Batch A receives s5's notebook and, before grading it, something writes another over
    its copy in submitted/ (as a second batch of the lesson once did): A grades the bytes it
    hashed. Meanwhile batch B, a second --resume of the same lesson, is refused in one line,
    naming A: nobody is graded twice."""
    course = copy_of(graded, tmp_path / "course")
    hand_ins = tmp_path / "class"
    shutil.copytree(graded["class"], hand_ins)
    submit(hand_ins, "s5", read_notebook(LESSON.notebook), NAME)
    wrong = tmp_path / "wrong.ipynb"
    shutil.copyfile(graded["class"] / "s2" / NAME, wrong)
    target = course / "submitted" / "s5" / LESSON.name / NAME
    overwrite = ["sh", "-c", f"cp {wrong} {target} && sleep 6"]  # B comes meanwhile
    first = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, "grader.gradebook.batch:grade_submission", "1",
         f"run:{json.dumps(overwrite)}", "autograde", LESSON.name, str(hand_ins),
         "--course-dir", str(course), "--resume", "--jobs", "1"],
        cwd=REPO, env=grader_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (target.exists() and target.read_bytes() == wrong.read_bytes()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        second = grader("autograde", LESSON.name, hand_ins, "--course-dir", course,
                        "--resume", check=False)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stdout + second.stderr
    said = second.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(
        "error: another command is changing the grades of 01_float_formats (autograde on "), said
    assert f"process {first.pid}" in said[0] and "one batch of a lesson at a time" in said[0]
    assert "s5: graded" in out and "s5" not in second.stdout
    assert first.returncode == 0, err
    assert "1 graded, 0 needs_review, 0 invalid of 5; 4 skipped" in out
    record = ledger(course)["s5"]
    assert record["notebook_sha256"] == hashlib.sha256((hand_ins / "s5" / NAME).read_bytes()
                                                       ).hexdigest()
    assert float(read_export_after(course, tmp_path)[("s5", LESSON.name)]["score"]) == FULL
    assert not list(course.glob("batch-*"))  # the batch's own copies went with it


HOLD = """
import sys, time
from pathlib import Path
from grader.course import Course
from grader.gradebook.lock import lesson_lock
course = Course(Path(sys.argv[1]), log=print, database=sys.argv[2])
with lesson_lock(course, sys.argv[3], "autograde"):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def machine_behind_a_cable(name: str):
    """A network namespace joined to this one by a veth pair, 10.213.N.1 here and 10.213.N.2
    there: a machine of its own, whose cable ``cut()`` pulls (its end goes down: what this side
    sends is lost, nothing answers, no reset comes, as when a machine is preempted or powered
    off). Yields (this side's address, a command prefix that runs there, cut)."""
    number = os.getpid() % 200 + 20
    namespace, here, there = f"ctc-{name}-{number}", f"ctc{number}a", f"ctc{number}b"
    near, far = f"10.213.{number}.1", f"10.213.{number}.2"
    steps = [["ip", "netns", "add", namespace],
             ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
             ["ip", "link", "set", there, "netns", namespace],
             ["ip", "addr", "add", f"{near}/24", "dev", here], ["ip", "link", "set", here, "up"],
             ["ip", "netns", "exec", namespace, "ip", "addr", "add", f"{far}/24", "dev", there],
             ["ip", "netns", "exec", namespace, "ip", "link", "set", there, "up"],
             ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield near, ["ip", "netns", "exec", namespace], lambda: subprocess.run(
            ["ip", "netns", "exec", namespace, "ip", "link", "set", there, "down"], check=True)
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


LOST_MACHINE = "test_a_lost_machines_lock_is_ended_by_the_server_within_a_minute"


def lose_a_machine(where: Path) -> dict:
    """A grader on another machine holds the lesson's lock on a shared PostgreSQL gradebook;
    its machine is lost (the cable pulled). Another grader tries for the lock every 2 s until
    it gets it: what it was told meanwhile (``refusals``), the seconds from the cut until it got
    the lock (``freed``), and this side's address of the cable (``near``)."""
    from grader.course import Course
    from grader.gradebook.lock import Busy, lesson_lock

    with machine_behind_a_cable("lost") as (near, there, cut):
        server = servers.start_postgres(also_on=near)
        try:
            url = servers.create_database(server.url, "lost")
            far_url = url.replace("127.0.0.1", near)
            holder = subprocess.Popen([*there, sys.executable, "-c", HOLD,
                                       str(where / "machine-a"), far_url, LESSON.name],
                                      cwd=REPO, env=grader_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            other = Course(where / "machine-b", log=lambda _: None, database=url)
            try:
                assert holder.stdout.readline().strip() == "held", holder.stderr.read()
                cut()
                lost_at = time.monotonic()
                refusals = []
                while True:
                    try:
                        with lesson_lock(other, LESSON.name, "autograde"):
                            break
                    except Busy as refused:
                        refusals.append(str(refused))
                    assert time.monotonic() - lost_at < 90, refusals[-1]
                    time.sleep(2)
                freed = time.monotonic() - lost_at
            finally:
                holder.kill()
                holder.wait()
        finally:
            server.end()
    return {"refusals": refusals, "freed": freed, "near": near}


def play_lost_machine(where: str) -> None:
    """``lose_a_machine`` in a process of its own; what came of it, or the error that stopped
    it, goes to WHERE/met.json."""
    try:
        met = lose_a_machine(Path(where))
    except BaseException:
        import traceback

        met = {"error": traceback.format_exc()}
    (Path(where) / "met.json").write_text(json.dumps(met))


@pytest.fixture(scope="module", autouse=True)
def lost_machine(request, tmp_path_factory):
    """The lost machine's minute, started with the module's first test in a process of its
    own: it mostly waits on the server's keepalive, and so waits beside the module's other
    tests rather than before them (32 s of a worker's time, when it ran alone). Started only
    when its test is to run (not under -k another) and can run here: (process, folder)."""
    wanted = any(item.name == LOST_MACHINE for item in request.session.items)
    if not wanted or os.geteuid() != 0 or shutil.which("ip") is None \
            or servers.postgres_bin() is None:
        yield None
        return
    where = tmp_path_factory.mktemp("lost-machine")
    player = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom tests.test_term_state import play_lost_machine"
         "\nplay_lost_machine(sys.argv[1])", str(where)],
        cwd=REPO, env=grader_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield player, where
    if player.poll() is None:  # its test did not run to the end: interrupted, the process
        player.send_signal(signal.SIGINT)  # ends its server, holder and cable on the way out
        player.communicate(timeout=60)


def test_a_lost_machines_lock_is_ended_by_the_server_within_a_minute(lost_machine) -> None:
    """A grader on another machine holds the lesson's lock on a shared PostgreSQL gradebook;
    its machine is lost (the cable pulled: no FIN, no reset). Meanwhile another grader is
    refused, told how long the holder has been silent once it has; the server ends the lost
    session within about a minute (TCP keepalive and user timeout set on the lock's
    connection; the system's defaults held it 2 h 11 min), and the lesson is free again.
    Played by ``lost_machine`` from the module's start."""
    from grader.gradebook import lock

    if lost_machine is None:
        pytest.skip("needs root, iproute2 and PostgreSQL (a network namespace, a server)")
    player, where = lost_machine
    printed, _ = player.communicate(timeout=300)
    assert (where / "met.json").exists(), printed
    met = json.loads((where / "met.json").read_text())
    assert "error" not in met, met.get("error")
    refusals, freed, near = met["refusals"], met["freed"], met["near"]
    keepalive = lock.SERVER_KEEPALIVE
    # the server probes after its idle time, count probes interval apart; the holder's last
    # heartbeat may have come up to a beat before the cut
    probes = keepalive["tcp_keepalives_idle"] + keepalive["tcp_keepalives_count"] * keepalive[
        "tcp_keepalives_interval"]
    assert refusals and all("(autograde on " in r for r in refusals), refusals
    # (the line is the minute: on an idle machine it is about probes + a beat, ~40 s;
    # a busy one answers the polls late)
    assert freed < 60 and probes + lock.HEARTBEAT_SECONDS < 60, (freed, refusals[-1])
    far = near.rsplit(".", 1)[0] + ".2"
    for refusal in refusals:  # how long it has said nothing, once that is long, and whence
        if "has been silent for" in refusal:
            assert f"its connection from {far} has been silent for " in refusal, refusal


def test_the_lock_holds_across_machines_sharing_a_postgresql_gradebook(postgres_database,
                                                                       tmp_path,
                                                                       monkeypatch) -> None:
    """Two graders with course directories of their own (two machines) and one PostgreSQL
    gradebook: while one holds the lesson's lock the other is refused, naming it; another
    lesson is free; the lock goes with the holder's connection, however the holder ends. A
    holder that ends between another's refused try and its look at who holds it leaves the
    lesson free: the other takes it rather than being refused by no one."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from grader.course import Course
    from grader.gradebook import lock
    from grader.gradebook.lock import Busy, lesson_lock

    url = postgres_database
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "machine-a"), url,
                               LESSON.name], cwd=REPO, env=grader_env(),
                              stdout=subprocess.PIPE, text=True)
    other = Course(tmp_path / "machine-b", log=lambda _: None, database=url)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Busy) as refused, lesson_lock(other, LESSON.name, "autograde"):
            pass
        assert f"(autograde on {os.uname().nodename}, process {holder.pid}, since " in \
            str(refused.value)
        with lesson_lock(other, "02_tensors_and_strides", "autograde"):
            pass
    finally:
        holder.kill()  # as a machine lost: no goodbye to the server
        holder.wait()
    deadline = time.monotonic() + 30
    while True:
        try:
            with lesson_lock(other, LESSON.name, "autograde"):
                break
        except Busy:
            assert time.monotonic() < deadline
            time.sleep(0.5)

    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as holding:
        holding.execute(text("SELECT pg_advisory_lock(:key)"),
                        {"key": lock.advisory_key(LESSON.name)})
        holding.commit()
        looked = lock._pg_holder

        def holder_ends_meanwhile(connection, key):
            holding.execute(text("SELECT pg_advisory_unlock_all()"))
            holding.commit()
            return looked(connection, key)

        monkeypatch.setattr(lock, "_pg_holder", holder_ends_meanwhile)
        with lesson_lock(other, LESSON.name, "autograde"):
            pass
    engine.dispose()


# ------------------------------------------------------------------ items 4 and 6: feedback pages

def test_a_page_is_current_while_its_grades_are_whatever_the_clocks_say(graded,
                                                                       tmp_path) -> None:
    """The grades were stored by a machine whose clock runs an hour ahead (or this one's
    stepped back): every page stays current. s2's review is decided while the pages render
    (after nbgrader read the grades, before it wrote s2's page): that page shows the old
    grades and is withdrawn, never zipped for the LMS. Then a decision on s1 takes the LMS
    zip made from s1's page with it; the others stay."""
    course = copy_of(graded, tmp_path / "course")
    set_details(course, graded_at=time.time() + 3600)
    page = course / "feedback" / "s2" / LESSON.name / f"{LESSON.notebook_id}.html"
    review = [sys.executable, "-m", "grader", "review", LESSON.name, "s2", "--set",
              f"{WRONG}=1", "--note", "rounding only", "--course-dir", str(course)]
    during = ["sh", "-c", f"cp {page} {tmp_path}/page && {shlex.join(review)} >/dev/null && "
                          f"cp {tmp_path}/page {page}"]
    # (feedback lists the graded twice: to share them out, then, the pages made, to record them)
    done = wrapped_grader("grader.outputs.feedback:_graded", 2, f"run:{json.dumps(during)}",
                          "feedback", LESSON.name, "--zip", "--course-dir", course)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("withdrew 1 feedback"))
    assert "whose grades changed since they were made" in line and line.endswith(": s2")
    zips = course / "feedback-zips" / LESSON.name
    assert sorted(p.name for p in zips.glob("*.zip")) == ["s1.zip", "s3.zip", "s4.zip"]
    assert not page.exists()
    said = grader("review", LESSON.name, "s1", "--note", "see me", "--course-dir", course).stdout
    assert "withdrew 1 LMS feedback zip(s) of 01_float_formats" in said and "s1.zip" in said
    assert sorted(p.name for p in zips.glob("*.zip")) == ["s3.zip", "s4.zip"]
    # A page put back from a backup, with what it was made from: other grades. Withdrawn.
    from grader.course import Course

    s3 = course / "feedback" / "s3" / LESSON.name
    (s3 / "made-from.json").write_text(json.dumps({"grades": "0" * 64}))
    logged: list[str] = []
    pages = Course(course, log=logged.append).current_feedback(LESSON)
    assert [p.parent.parent.name for p in pages] == ["s4"]
    assert any("whose grades changed" in line and "s3" in line for line in logged)


# ------------------------------------------------------------------ items 5 and 9: the disk

@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> None:
    subprocess.run(["sh", "-c", f"fallocate -l $(df -B1 --output=avail {mount} | tail -1) "
                                f"{mount}/filler; dd if=/dev/zero of={mount}/rest bs=4096 "
                                "2>/dev/null; true"], check=True)


def test_a_full_disk_leaves_every_file_as_it_was_and_says_so_in_one_line(graded,
                                                                         small_disk) -> None:
    course = copy_of(graded, small_disk / "course")
    grader("export", "--course-dir", course)
    grader("report", LESSON.name, "--course-dir", course)
    before = {p: p.read_bytes() for p in [course / "grades.csv",
                                          *(course / "reports" / LESSON.name).iterdir()]}
    grader("review", LESSON.name, "s2", "--set", f"{WRONG}=1", "--note", "ok",
           "--course-dir", course)  # the export would change
    fill(small_disk)
    for command in (["export"], ["report", LESSON.name], ["release", LESSON.name],
                    ["withdraw", LESSON.name, "s2", "--reason", "handed in twice"]):
        done = grader(*command, "--course-dir", course, check=False)
        said = done.stderr.strip().splitlines()
        assert done.returncode == 3, (command, done.stdout, done.stderr)
        assert len(said) == 1 and said[0].startswith("stopped: the disk holding") \
            and "is full" in said[0] and "--resume" not in said[0], said
        assert "Traceback" not in done.stdout + done.stderr
    assert {p: p.read_bytes() for p in before} == before  # nothing cut, nothing lost
    assert not list(course.rglob("*.partial"))
    assert "s2" in set(ledger(course))  # the withdraw that could not finish removed nothing
    assert (course / "release" / LESSON.name / NAME).is_file()  # the earlier release stands


def test_a_file_written_whole_is_the_old_one_until_the_new_one_is_complete(tmp_path) -> None:
    from grader.common.files import written

    path = tmp_path / "grades.csv"
    path.write_text("old,complete\n")
    with pytest.raises(RuntimeError), written(path) as handle:
        handle.write("new,half")
        raise RuntimeError("killed half way")
    assert path.read_text() == "old,complete\n" and os.listdir(tmp_path) == ["grades.csv"]
    with written(path) as handle:
        handle.write("new,complete\n")
    assert path.read_text() == "new,complete\n" and os.listdir(tmp_path) == ["grades.csv"]


def test_a_writer_killed_half_way_leaves_a_file_the_next_writer_removes(tmp_path) -> None:
    """A process killed (kill -9) while it writes ``grades.csv`` leaves its temporary file;
    the next write of that file removes it. Another live process's temporary file stays, and
    one of another machine stays until it is a day old."""
    import signal

    from grader.common.files import written

    path = tmp_path / "grades.csv"
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal, sys\nfrom grader.common.files import "
         "written\nheld = written(sys.argv[1])\nhandle = held.__enter__()\n"
         "handle.write('half,')\n"
         "handle.flush()\nos.kill(os.getpid(), signal.SIGKILL)", str(path)],
        cwd=REPO, env=grader_env(), capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    [left] = tmp_path.glob(".grades.csv.*.partial")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = left.name.split(".")[3]  # .grades.csv.HOST.PID-XXXX.partial
        running = tmp_path / f".grades.csv.{host}.{live.pid}-abc.partial"
        running.write_text("being written")
        foreign, stale = (tmp_path / f".grades.csv.{name}.1-abc.partial"
                          for name in ("elsewhere", "long_gone"))
        foreign.write_text("another machine's")
        stale.write_text("another machine's, old")
        os.utime(stale, (time.time() - 2 * 86400,) * 2)
        with written(path) as handle:
            handle.write("whole\n")
        assert path.read_text() == "whole\n"
        assert sorted(p.name for p in tmp_path.glob(".*.partial")) == sorted(
            [running.name, foreign.name])
    finally:
        live.kill()
        live.wait()


def test_a_read_only_course_directory_reads_and_refuses_to_write_in_one_line(
        graded, small_disk, tmp_path) -> None:
    course = copy_of(graded, small_disk / "course")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for command in (["review", LESSON.name], ["review", LESSON.name, "s2"], ["variants"],
                    ["export", "--csv", tmp_path / "g.csv"],
                    ["report", LESSON.name, "--out", tmp_path / "report"],
                    ["similarity", LESSON.name, "--out", tmp_path / "similar"]):
        done = grader(*command, "--course-dir", course, check=False)
        assert done.returncode == 0, (command, done.stderr)
    assert ("s2", LESSON.name) in read_export(tmp_path / "g.csv")
    assert (tmp_path / "report" / "exercises.csv").is_file()
    assert (tmp_path / "similar" / "similarity.html").is_file()
    for command in (["autograde", LESSON.name, graded["class"]], ["feedback", LESSON.name],
                    ["report", LESSON.name], ["similarity", LESSON.name], ["export"],
                    ["review", LESSON.name, "s2", "--accept"]):
        done = grader(*command, "--course-dir", course, check=False)
        said = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(said) == 1, (command, done.stderr)
        assert "writes in the course directory" in said[0] and "read-only" in said[0]


# ------------------------------------------------------------------ item 9: damaged, a pipe

def test_a_damaged_gradebook_is_said_in_one_line(graded, tmp_path) -> None:
    course = copy_of(graded, tmp_path / "course")
    (course / "gradebook.db").write_bytes(b"not a database, " * 1000)
    for command in (["review", LESSON.name], ["export", "--csv", tmp_path / "g.csv"],
                    ["report", LESSON.name], ["autograde", LESSON.name, graded["class"]]):
        done = grader(*command, "--course-dir", course, check=False)
        said = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(said) == 1, (command, done.stderr)
        assert said[0] == (f"error: the gradebook's database {course / 'gradebook.db'} is "
                           "damaged (file is not a database): restore it from your backup, "
                           "and keep the damaged file aside; nothing was changed")


def test_a_reader_that_goes_away_is_no_error(graded, tmp_path) -> None:
    """``review ... | head``: the reader takes a line and goes; no BrokenPipeError."""
    course = copy_of(graded, tmp_path / "course")
    reading = subprocess.Popen([sys.executable, "-m", "grader", "review", LESSON.name, "s2",
                                "--course-dir", str(course)], cwd=REPO,
                               env=grader_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    reading.stdout.close()  # gone before the first line
    err = reading.stderr.read().decode()
    assert reading.wait(timeout=120) == 141 and err == "", err


# ------------------------------------------------------------------ item 10: smaller needs

def test_a_rerun_without_resume_says_what_resume_would_skip(graded, tmp_path) -> None:
    course = copy_of(graded, tmp_path / "course")
    done = wrapped_grader("grader.gradebook.batch:exercises", 1, "term", "autograde",
                          LESSON.name, graded["class"], "--course-dir", course)
    assert done.returncode == 130, done.stderr
    assert ("note: 4 of 4 were graded from these very notebooks with these checks already: "
            "--resume skips them") in done.stdout
    assert "--resume to finish" in done.stderr


def test_report_counts_after_review_in_the_notebooks_order_on_whole_ticks(graded,
                                                                         tmp_path) -> None:
    import csv

    course = copy_of(graded, tmp_path / "course")
    grader("review", LESSON.name, "s2", "--set", f"{WRONG}=1", "--note", "ok",
           "--course-dir", course)
    said = grader("report", LESSON.name, "--course-dir", course).stdout
    folder = course / "reports" / LESSON.name
    with (folder / "pass_rates.csv").open() as handle:
        rates = {r["exercise"]: (int(r["passed"]), int(r["graded"]))
                 for r in csv.DictReader(handle)}
    with (folder / "exercises.csv").open() as handle:
        spread = {r["exercise"]: (int(r["full_marks"]), int(r["submissions"]))
                  for r in csv.DictReader(handle)}
    assert list(rates) == list(spread) == list(points(read_notebook(LESSON.notebook)))
    assert rates == spread and rates[WRONG] == (3, 4)  # s1, s2 set in review, s3
    with (folder / "handins.csv").open() as handle:
        assert {r["checks"] for r in csv.DictReader(handle)} == {version(course)}
    with (folder / "variants.csv").open() as handle:  # s4's prediction: never attempted
        by_variant = list(csv.DictReader(handle))
    assert sum(int(r["graded"]) for r in by_variant) == 3
    # a variant no one drew has no pass rate (blank, as the terminal's "-"), not 0.000
    assert {r["pass_rate"] for r in by_variant if r["graded"] == "0"} == {""}
    assert all(r["pass_rate"] for r in by_variant if r["graded"] != "0")
    assert any(r["graded"] == "0" for r in by_variant)  # 3 students, more variants
    assert "not counted: 1 gave no number (never attempted)" in said


def test_the_score_histogram_has_whole_ticks() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grader.outputs.report import histogram

    fig = histogram([1.0, 2.0, 2.0], 3.0, LESSON)
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        ticks = [t for t in axis.get_majorticklocs()]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    plt.close(fig)


def test_a_commands_help_starts_with_its_own_usage(capsys) -> None:
    from grader.cli import main

    with pytest.raises(SystemExit):
        main(["autograde", "--help"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("usage: python -m grader autograde "), first


def test_a_new_gradebook_is_stamped_with_nbgraders_head_without_a_second_python(
        tmp_path, monkeypatch) -> None:
    """nbgrader stamps a new gradebook with its schema's Alembic head by running `alembic
    heads` (a second Python, 2 to 5 CPU seconds a course); the grader reads the same head in
    its own process (grader/gradebook/schema.py): the revision the command prints, and no
    process started to make the gradebook."""
    import sqlite3

    from nbgrader.dbutil import _temp_alembic_ini

    from grader.gradebook.coursedir import CourseDir
    from grader.gradebook.schema import alembic_head

    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        printed = subprocess.run([Path(sys.executable).parent / "alembic", "-c", ini, "heads"],
                                 capture_output=True, text=True, check=True).stdout
    assert printed.split()[:2] == [alembic_head(), "(head)"], printed

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "check_output", no_process)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    with CourseDir(tmp_path / "course", log=lambda _: None).gradebook():
        pass
    with sqlite3.connect(tmp_path / "course" / "gradebook.db") as db:
        [(stamped,)] = db.execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamped == alembic_head()


def test_a_gradebook_opened_again_asks_once_for_its_tables_and_still_makes_a_missing_one(
        tmp_path) -> None:
    """nbgrader's Gradebook looks for each of its tables whenever it is opened (three times a
    hand-in on a coordinator); the grader asks for the list once and creates nothing when every
    table is there (grader/gradebook/schema.py). A table that is missing is still made."""
    import sqlite3

    from nbgrader.api import Base
    from sqlalchemy import event, inspect

    from grader.gradebook.coursedir import CourseDir

    course = CourseDir(tmp_path / "course", log=lambda _: None)
    with course.gradebook():
        pass
    with sqlite3.connect(tmp_path / "course" / "gradebook.db") as db:
        db.execute("DROP TABLE comment")
    with course.gradebook() as gb:  # made again
        assert "comment" in inspect(gb.engine).get_table_names()
        statements: list[str] = []
        event.listen(gb.engine, "before_cursor_execute",
                     lambda *args: statements.append(args[2]))
        Base.metadata.create_all(bind=gb.engine)
    assert len(statements) == 1 and "sqlite_master" in statements[0], statements


# ------------------------------------------------------------------ a class of thousands

def test_the_instructors_commands_send_as_many_queries_for_2000_as_for_20(graded,
                                                                          tmp_path) -> None:
    """``report``, ``export`` (each table, each LMS's file), ``review``, ``variants`` and what
    a student's ``progress`` reads of the course read a class in a fixed number of SQL
    statements: the course graded once, its four grades copied
    to 20 students and then to 2,000 (benchmarks/class_scale.py: the same at 10,000, and the
    seconds), each command's statements counted. nbgrader's per-submission score and student
    were two queries a student (15 s at 2,000 hand-ins, minutes at 10,000)."""
    from benchmarks.class_scale import clone_class, counted, measure, student_workspace
    from grader.course import Course
    from grader.lab.server import workspace_variants

    def own_numbers() -> int:  # what a student's `progress` reads of the course
        with counted() as statements:
            assert workspace_variants(Course(course, log=lambda _: None), workspace)
        return statements[0]

    course = copy_of(graded, tmp_path / "course")
    clone_class(course, ["s1", "s2", "s3", "s4"], [str(100_000 + n) for n in range(20)])
    small = measure(course, LESSON.name, tmp_path)
    workspace = student_workspace(course, LESSON.name, tmp_path)
    few_for_progress = own_numbers()
    clone_class(course, ["s1", "s2", "s3", "s4"], [str(200_000 + n) for n in range(1980)])
    large = measure(course, LESSON.name, tmp_path)
    assert 0 < own_numbers() <= few_for_progress
    assert [name for name, _, _ in small] == [name for name, _, _ in large]
    for (name, _, few), (_, _, many) in zip(small, large, strict=True):
        assert many <= few, (name, few, many)  # the first run also makes what is made once
    with (tmp_path / "grades.csv").open() as handle:
        assert sum(1 for _ in handle) == 1 + 4 + 2000  # every student read, once
    with counted() as statements:
        grader("review", LESSON.name, "200001", "--course-dir", course)
    assert statements[0] < 60
