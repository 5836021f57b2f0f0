"""nbgrader's exchange, as a JupyterHub's students use it, without the hub: the grader publishes
a lesson, students fetch and submit it with nbgrader's own commands, the grader collects,
grades and releases feedback, and each student's ``fetch_feedback`` finds their own page.
tests/test_hub.py does the same through a real hub and browser; here run the parts a hub
cannot reach quickly: what a hostile exchange holds, and the errors of the command line."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import nbformat
import pytest

from grader.cli import main
from grader.common.errors import CourseError
from grader.content.lessons import load_lesson
from grader.course import Course
from grader.intake import exchange
from grader.intake.exchange import collect, settings
from grader.intake.times import nbgrader_timestamp
from grader.outputs import publish
from tests.grading_helpers import grader, grader_env, read_notebook, submit

LESSON = load_lesson("01_float_formats")
NAME = LESSON.notebook.name
SCORE = re.compile(r"Score: ([0-9.]+) / ([0-9.]+)")


def nbgrader_as(student: str, home: Path, exchange: Path, *args: str) -> str:
    """One of nbgrader's student commands, as the Assignment List runs it, for ``student``."""
    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, LESSON.name, f"--Exchange.root={exchange}",
         "--course=counting-the-cost", f"--Exchange.cache={home / '.cache'}",
         f"--student={student}"],
        cwd=home, env=grader_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def answered(student_version: Path) -> nbformat.NotebookNode:
    """The student version with every answer cell filled in from the instructor's."""
    reference = {c.metadata.nbgrader.grade_id: c.source for c in read_notebook(LESSON.notebook)
                 .cells if c.metadata.get("nbgrader", {}).get("solution")}
    nb = read_notebook(student_version)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("solution"):
            c.source = reference[c.metadata.nbgrader.grade_id]
    return nb


def fetched_scores(home: Path) -> list[tuple[float, float]]:
    pages = sorted((home / LESSON.name / "feedback").glob(f"*/{LESSON.notebook.stem}.html"))
    assert len(pages) == 1, pages
    return [(float(a), float(b)) for a, b in SCORE.findall(pages[0].read_text())]


@pytest.mark.slow
def test_publish_fetch_submit_collect_grade_and_fetch_feedback(tmp_path) -> None:
    course, exchange = tmp_path / "course", tmp_path / "exchange"
    homes = {s: tmp_path / "home" / s for s in ("alice", "bob")}
    grader("--course-dir", course, "release", LESSON.name, "--exchange", exchange)
    assert (exchange / "counting-the-cost" / "outbound" / LESSON.name / NAME).is_file()
    assert exchange.stat().st_mode & 0o1777 == 0o1777  # sticky: no one renames another's folder
    for student, home in homes.items():
        assert "Fetched as" in nbgrader_as(student, home, exchange, "fetch_assignment")
    nbformat.write(answered(homes["alice"] / LESSON.name / NAME), homes["alice"] / LESSON.name
                   / NAME)
    for student, home in homes.items():
        nbgrader_as(student, home, exchange, "submit")
    # Every submission is written by this test's user, so none is the student it names.
    refused = grader("--course-dir", course, "collect", LESSON.name)
    assert refused.stdout.count("written by user") == 2 and "0 new or newer" in refused.stdout
    done = grader("--course-dir", course, "collect", LESSON.name, "--no-check-owner")
    assert "2 new or newer submission(s), 0 unchanged" in done.stdout
    assert oct((course / "collected").stat().st_mode & 0o777) == "0o700"
    # A student graded from a folder, not the exchange, has no secret: left out, not failed.
    submit(tmp_path / "folder", "dave", read_notebook(course / "release" / LESSON.name / NAME),
           NAME)
    grader("--course-dir", course, "autograde", LESSON.name, tmp_path / "folder")
    graded = grader("--course-dir", course, "autograde", LESSON.name, "--collected")
    assert "2 graded, 0 needs_review, 0 invalid of 2" in graded.stdout
    assert "nbgrader's collect layout" in graded.stdout and "ignored" not in graded.stdout
    released = grader("--course-dir", course, "feedback", LESSON.name, "--exchange")
    assert "feedback of 2 student(s)" in released.stdout and "left out: dave" in released.stdout
    assert len(list((exchange / "counting-the-cost" / "feedback").glob("*.html"))) == 2
    for student, home in homes.items():
        nbgrader_as(student, home, exchange, "fetch_feedback")
    alice, bob = fetched_scores(homes["alice"]), fetched_scores(homes["bob"])
    assert alice[0] == (15.0, 15.0) and bob[0] == (0.0, 15.0)
    # A regraded exchange hand-in keeps its secret: its feedback is released again.
    grader("--course-dir", course, "review", LESSON.name, "bob", "--regrade")
    assert "feedback of 2 student(s)" in grader("--course-dir", course, "feedback",
                                                LESSON.name, "--exchange").stdout
    # Collected again: nothing new. Bob submits again: his newest is taken, Alice's stays.
    assert "0 new or newer submission(s), 2 unchanged" in grader(
        "--course-dir", course, "collect", LESSON.name, "--no-check-owner").stdout
    time.sleep(1)
    nbformat.write(answered(homes["bob"] / LESSON.name / NAME), homes["bob"] / LESSON.name / NAME)
    nbgrader_as("bob", homes["bob"], exchange, "submit")
    assert "1 new or newer submission(s), 1 unchanged" in grader(
        "--course-dir", course, "collect", LESSON.name, "--no-check-owner").stdout
    collected = read_notebook(course / "collected" / "bob" / LESSON.name / NAME)
    assert "raise NotImplementedError" not in "".join(
        c.source for c in collected.cells if c.metadata.get("nbgrader", {}).get("solution"))


def stamp_at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def inbound_entry(inbound: Path, student: str, stamp: str, notebook: bytes | None = b"{}",
                  lesson: str = LESSON.name) -> Path:
    folder = inbound / f"{student}+{lesson}+{stamp}+abcdef"
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text(stamp)
    (folder / "submission_secret.txt").write_text("ab" * 64)
    if notebook is not None:
        (folder / NAME).write_bytes(notebook)
    return folder


def test_collect_takes_the_newest_and_refuses_what_it_cannot_trust(tmp_path) -> None:
    course = Course(tmp_path / "course", log=lambda _: None)
    where = settings(course, str(tmp_path / "exchange"), None, remember=True)
    inbound = where.course_path / "inbound"
    me = pwd.getpwuid(os.geteuid()).pw_name
    # The notebooks are written now: stamps within two minutes of now are believed.
    early, late = stamp_at(time.time() - 60), stamp_at(time.time() - 30)
    inbound_entry(inbound, me, early, b'{"old": 1}')
    inbound_entry(inbound, me, late, b'{"new": 1}')
    inbound_entry(inbound, "mallory", late)  # written by this user, not by mallory
    inbound_entry(inbound, me, late, lesson="02_tensor_storage")  # another lesson: not looked at
    done = collect(course, LESSON, where)
    assert done["collected"] == [me] and len(done["refused"]) == 1
    assert f"written by user {me}, not by mallory" in done["refused"][0]
    target = course.root / "collected" / me / LESSON.name
    assert (target / NAME).read_bytes() == b'{"new": 1}'
    assert (target / "timestamp.txt").read_text() == late
    assert oct((target / "submission_secret.txt").stat().st_mode & 0o777) == "0o600"

    # The rest, with the owner check off: each refused for what it is, and nothing blocks.
    linky = inbound_entry(inbound, "linky", late, None)
    (linky / NAME).symlink_to("/etc/passwd")
    piper = inbound_entry(inbound, "piper", late)
    (piper / "timestamp.txt").unlink()
    os.mkfifo(piper / "timestamp.txt")
    big = inbound_entry(inbound, "big", late, None)
    with open(big / NAME, "wb") as handle:
        handle.truncate(51 * 2**20)
    inbound_entry(inbound, "..", late)
    (inbound / f"filey+{LESSON.name}+{late}+x").write_text("{}")
    (inbound / f"sym+{LESSON.name}+{late}+x").symlink_to(linky)
    garbled = inbound_entry(inbound, "garbled", late)
    (garbled / "timestamp.txt").write_text("yesterday")
    backdated = stamp_at(time.time() - 3 * 86400)  # written now, stamped three days ago
    inbound_entry(inbound, "sly", backdated)
    inbound_entry(inbound, "later", backdated, None)  # the notebook to come after the scan
    odd = os.fsencode(inbound) + f"/odd+{LESSON.name}+{late}+".encode() + b"\xff\xfe"
    os.mkdir(odd)  # a name that is not UTF-8: collected all the same
    for file, data in (("timestamp.txt", late.encode()), (NAME, b"{}")):
        Path(os.fsdecode(odd + b"/" + file.encode())).write_bytes(data)
    inbound_entry(inbound, "seer", stamp_at(time.time() + 86400))  # stamped tomorrow
    started = time.monotonic()
    done = collect(course, LESSON, where, check_owner=False)
    assert time.monotonic() - started < 10
    reasons = {line.split("+")[0]: line for line in done["refused"]}
    assert sorted(done["collected"]) == ["mallory", "odd", "seer", "sly"]
    assert done["unchanged"] == [me]
    assert "no float_formats.ipynb" in reasons["later"]
    assert sorted(note.split(":")[0] for note in done["notes"]) == ["seer", "sly"]
    for student in ("sly", "seer"):
        counted = (course.root / "collected" / student / LESSON.name / "timestamp.txt")
        assert abs(time.time() - nbgrader_timestamp(counted.read_text())) < 60
    assert "no float_formats.ipynb" in reasons["linky"]
    assert "no float_formats.ipynb" in reasons["big"]
    assert "no readable timestamp.txt" in reasons["piper"]
    assert "no readable timestamp.txt" in reasons["garbled"]
    assert "not a student id" in reasons[".."]
    assert "not a folder" in reasons["filey"] and "not a folder" in reasons["sym"]
    assert not (course.root / "collected" / "linky").exists()
    assert sorted(p.name for p in (course.root / "collected").iterdir()) == sorted(
        ["mallory", "odd", "seer", "sly", me])
    again = collect(course, LESSON, where, check_owner=False)
    assert sorted(again["unchanged"]) == sorted(["mallory", "odd", "seer", "sly", me])


def test_a_folder_changed_during_collection_is_read_as_it_was_opened_or_refused(
        tmp_path, monkeypatch) -> None:
    """A student owns their submission folders: they may swap one for a link to someone
    else's (or the instructor's) folder, or write the notebook, between the scan and the copy.
    """
    course = Course(tmp_path / "course", log=lambda _: None)
    where = settings(course, str(tmp_path / "exchange"), None)
    inbound = where.course_path / "inbound"
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / NAME).write_text('{"solutions": 1}')
    me = pwd.getpwuid(os.geteuid()).pw_name
    folder = inbound_entry(inbound, me, stamp_at(time.time()), b'{"mine": 1}')
    inbound_fd = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY)
    try:
        scanned = exchange._scan(folder.name, me, LESSON, inbound_fd, True)
        target = course.root / "collected" / me / LESSON.name
        folder.rename(inbound / "elsewhere")
        folder.symlink_to(solutions)  # a link in its place: not followed
        assert "not a folder" in exchange._copy_submission(scanned, LESSON, inbound_fd, target,
                                                           True, [])
        folder.unlink()
        shutil.copytree(solutions, folder)  # another folder in its place: not the one scanned
        assert "replaced while being collected" in exchange._copy_submission(
            scanned, LESSON, inbound_fd, target, True, [])
        assert not target.exists()
        # The notebook written after the scan: its time is that of the file read.
        shutil.rmtree(folder)
        (inbound / "elsewhere").rename(folder)
        monkeypatch.setattr(exchange, "CLOCK_SLACK_SECONDS", 1)
        scanned = exchange._scan(folder.name, me, LESSON, inbound_fd, True)
        time.sleep(1.5)
        (folder / NAME).write_bytes(b'{"finished later": 1}')
        notes = []
        assert exchange._copy_submission(scanned, LESSON, inbound_fd, target, True, notes) == ""
        assert (target / NAME).read_bytes() == b'{"finished later": 1}'
        counted = nbgrader_timestamp((target / "timestamp.txt").read_text())
        assert counted > scanned.stamp_time + 1 and len(notes) == 1
        # A folder prepared early under a name collect ignores, renamed into view later.
        prepared = inbound_entry(inbound, me, stamp_at(time.time()), lesson="prepared")
        time.sleep(1.5)
        shown = inbound / f"{me}+{LESSON.name}+{stamp_at(time.time() - 2)}+late"
        prepared.rename(shown)
        scanned = exchange._scan(shown.name, me, LESSON, inbound_fd, True)
        assert scanned.time > scanned.stamp_time + 1  # the folder's ctime: the renaming
    finally:
        os.close(inbound_fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user: needs root")
def test_what_another_user_owns_is_refused(tmp_path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    course = Course(tmp_path / "course", log=lambda _: None)
    where = settings(course, str(tmp_path / "exchange"), None)
    inbound = where.course_path / "inbound"
    me = pwd.getpwuid(os.geteuid()).pw_name
    folder = inbound_entry(inbound, me, stamp_at(time.time()))
    os.chown(folder / NAME, nobody, -1)  # someone else's notebook linked or moved in
    done = collect(course, LESSON, where)
    assert done["collected"] == [] and "not the student's own file" in done["refused"][0]
    os.chown(inbound, nobody, -1)  # the course's inbound folder replaced by someone's own
    with pytest.raises(CourseError, match="is a folder of user nobody, not a folder of yours"):
        collect(course, LESSON, where)


def test_a_course_folder_planted_in_the_exchange_is_refused(tmp_path) -> None:
    """Before the course is first published, any user may create its folder in the exchange,
    or a link in its place, and serve the class lessons of their own: refused, not used."""
    course = Course(tmp_path / "course", log=lambda _: None)
    assert oct(course.root.stat().st_mode & 0o777) == "0o700"  # solutions: not for students
    where = settings(course, str(tmp_path / "exchange"), None)
    planted = tmp_path / "planted"
    (planted / "inbound").mkdir(parents=True)
    where.root.mkdir()
    where.course_path.symlink_to(planted)
    for attempt in (lambda: publish.publish(course, LESSON, where),
                    lambda: collect(course, LESSON, where),
                    lambda: publish.release_feedback(course, LESSON, where)):
        with pytest.raises(CourseError, match="is a link of user"):
            attempt()
    where.course_path.unlink()
    (where.course_path / "inbound").mkdir(parents=True)
    logged = []
    course.log = logged.append
    course.root.chmod(0o755)
    collect(course, LESSON, where)
    assert any("may be read by other users" in line for line in logged)


def test_hand_ins_sharing_a_secret_get_no_feedback_through_the_exchange(tmp_path) -> None:
    """Two hand-ins with one secret (a copied submission folder) would share one feedback
    file: neither is released; the others are."""
    course = Course(tmp_path / "course", log=lambda _: None)
    where = settings(course, str(tmp_path / "exchange"), None)
    for student, secret in (("ann", "ab" * 64), ("ben", "ab" * 64), ("cat", "cd" * 64)):
        page = course.root / "feedback" / student / LESSON.name / f"{LESSON.notebook.stem}.html"
        page.parent.mkdir(parents=True)
        page.write_text(f"<p>{student}</p>")
        submitted = course.root / "submitted" / student / LESSON.name
        submitted.mkdir(parents=True)
        (submitted / "submission_secret.txt").write_text(secret)
        (submitted / "timestamp.txt").write_text(stamp_at(time.time()))
    logged = []
    course.log = logged.append
    # Pages written here, not by feedback from grades (there are none): taken as current, so
    # that the secrets alone decide (feedback's currency: tests/test_term_state.py)
    course.current_feedback = lambda lesson: sorted(
        (course.root / "feedback").glob(f"*/{lesson.name}/*.html"))
    with pytest.raises(CourseError, match="publish it"):  # nothing in the exchange yet
        publish.release_feedback(course, LESSON, where)
    where.course_path.mkdir(parents=True)
    assert publish.release_feedback(course, LESSON, where) == 1
    released = list((where.course_path / "feedback").glob("*.html"))
    assert [p.read_text() for p in released] == ["<p>cat</p>"]
    assert "one and the same secret" in logged[-1] and "ann, ben" in logged[-1]


def test_the_exchange_commands_say_what_is_missing(tmp_path, capsys) -> None:
    def error(*args: object) -> str:
        assert main(["--course-dir", str(tmp_path / "course"), *map(str, args)]) == 2
        return capsys.readouterr().err

    assert "publish the lesson first" in error("collect", LESSON.name, "--exchange",
                                               tmp_path / "none")
    assert "give SUBMISSIONS" in error("autograde", LESSON.name)
    assert "not both" in error("autograde", LESSON.name, tmp_path, "--collected")
    assert "run python -m grader collect" in error("autograde", LESSON.name, "--collected")
    assert "give --exchange" in error("release", LESSON.name, "--course-id", "x")
    assert "give --exchange" in error("feedback", LESSON.name, "--course-id", "x")
    assert "name the lessons first" in error("release", "--exchange", LESSON.name)
    assert "letters, digits" in error("collect", LESSON.name, "--course-id", "../up")
