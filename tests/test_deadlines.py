"""Due dates, extensions and the late policy: the arithmetic around the deadline and across
daylight-saving changes, the file's checks (every bad value an error that says what to write,
every likely mistake a warning, ``python -m grader deadlines --check``), extensions by id, LMS
id, e-mail or name, where a submission time may come from (never a zip's member times nor a
student's own ``timestamp.txt``; Moodle's grading worksheet and Canvas's submissions JSON), the
LMS's late mark, and end to end on lesson 01 collected by ``python -m grader collect``:
export, report, feedback and review agree."""

from __future__ import annotations

import csv
import json
import re
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.content.lessons import load_lesson
from grader.gradebook.deadlines import Policy, _wall, late_periods, parse, penalty_fraction
from grader.intake.times import naive_time, nbgrader_timestamp, parse_time
from grader.intake.zips import unpack_zip
from tests.grading_helpers import grader, read_export, read_notebook, released_course
from tests.test_review import command

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
PER_DAY = Policy(per="day", rate=0.1, cap=0.5)
PER_HOUR = Policy(per="hour", rate=0.02, cap=0.3)


def at(zone: ZoneInfo, *fields: int) -> datetime:
    return datetime(*fields, tzinfo=zone)


def after(due: datetime, **elapsed: float) -> datetime:
    """``due`` plus elapsed time (aware + timedelta in one zone would add wall-clock time)."""
    return (due.astimezone(UTC) + timedelta(**elapsed)).astimezone(due.tzinfo)


# ------------------------------------------------------------------ arithmetic

@given(st.integers(min_value=-10 * 86400, max_value=20 * 86400))
def test_per_hour_penalty_is_started_hours_times_rate_up_to_the_cap(seconds: int) -> None:
    due = at(BERLIN, 2025, 3, 10, 23, 59)
    fraction, periods = penalty_fraction(PER_HOUR, due, after(due, seconds=seconds))
    if seconds <= 0:
        assert (fraction, periods) == (0.0, 0)
    else:
        assert periods == -(-seconds // 3600)  # ceil: one second late is one hour late
        assert fraction == min(0.3, 0.02 * periods)


def test_one_second_on_each_side_of_the_deadline() -> None:
    due = at(NEW_YORK, 2025, 3, 10, 23, 59)
    assert penalty_fraction(PER_DAY, due, due) == (0.0, 0)
    assert penalty_fraction(PER_DAY, due, due + timedelta(seconds=1)) == (0.1, 1)
    graced = Policy(per="day", rate=0.1, grace=timedelta(minutes=5))
    assert penalty_fraction(graced, due, due + timedelta(minutes=5)) == (0.0, 0)
    assert penalty_fraction(graced, due, due + timedelta(minutes=5, seconds=1))[0] == 0.1


def test_zero_after_the_cut_off_and_the_cap_before_it() -> None:
    due = at(BERLIN, 2025, 3, 10, 23, 59)
    policy = Policy(per="day", rate=0.1, cap=0.3, zero_after=timedelta(days=7))
    assert penalty_fraction(policy, due, due + timedelta(days=5))[0] == 0.3
    assert penalty_fraction(policy, due, due + timedelta(days=7))[0] == 0.3
    assert penalty_fraction(policy, due, due + timedelta(days=7, seconds=1))[0] == 1.0
    only_cut = Policy(per="none", zero_after=timedelta(hours=1))
    assert penalty_fraction(only_cut, due, due + timedelta(minutes=59))[0] == 0.0
    assert penalty_fraction(only_cut, due, due + timedelta(minutes=61))[0] == 1.0


def test_a_day_across_the_autumn_change_in_berlin_is_25_hours() -> None:
    due = at(BERLIN, 2025, 10, 25, 23, 59)  # clocks go back at 03:00 on 26 October
    assert late_periods("day", due, after(due, hours=24, minutes=30)) == 1
    assert late_periods("day", due, after(due, hours=25)) == 1
    assert late_periods("day", due, after(due, hours=25, seconds=1)) == 2
    assert late_periods("hour", due, after(due, hours=24, minutes=30)) == 25
    cut = Policy(per="none", zero_after=timedelta(days=1))
    assert penalty_fraction(cut, due, after(due, hours=24, minutes=30))[0] == 0.0


def test_a_day_across_the_spring_change_in_new_york_is_23_hours() -> None:
    due = at(NEW_YORK, 2025, 3, 8, 23, 59)  # clocks go forward at 02:00 on 9 March
    assert late_periods("day", due, after(due, hours=23)) == 1
    assert late_periods("day", due, after(due, hours=23, seconds=1)) == 2
    graced = Policy(per="hour", rate=0.1, grace=timedelta(hours=3))
    assert penalty_fraction(graced, due, after(due, hours=3))[0] == 0.0
    assert penalty_fraction(graced, due, after(due, hours=3, seconds=1)) == (
        pytest.approx(0.4), 4)  # past the grace, lateness counts from the due time


@given(st.sampled_from([BERLIN, NEW_YORK]),
       st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2026, 12, 31)),
       st.integers(min_value=1, max_value=40 * 86400))
def test_day_periods_end_at_the_due_wall_time_on_later_dates(zone: ZoneInfo, naive: datetime,
                                                             seconds: int) -> None:
    due = naive.replace(tzinfo=zone, fold=0)
    due = due.astimezone(UTC).astimezone(zone)  # a wall time that exists
    submitted = after(due, seconds=seconds)
    days = late_periods("day", due, submitted)
    assert days >= 1
    utc = submitted.astimezone(UTC)
    assert _wall(due, days - 1).astimezone(UTC) < utc <= _wall(due, days).astimezone(
        UTC)
    assert days <= late_periods("day", due, submitted + timedelta(hours=1))  # monotonic


# ------------------------------------------------------------------ the file

FILE = """
timezone = "Europe/Berlin"
[policy]
per = "day"
rate = 0.1
cap = 0.5
[lessons.01_float_formats]
due = "2025-03-10 23:59"
[lessons.02_tensors_and_strides]
due = "2025-03-17T23:59:00-04:00"
policy = { per = "hour", rate = 0.05 }
[[extensions]]
student = "s1"
lesson = "01_float_formats"
days = 2
"""


def test_the_file_reads_zones_policies_and_extensions() -> None:
    found = parse(FILE)
    assert found.due["01_float_formats"] == at(BERLIN, 2025, 3, 10, 23, 59)
    assert found.due["02_tensors_and_strides"].utcoffset() == timedelta(hours=-4)
    assert found.policies["02_tensors_and_strides"] == Policy("hour", 0.05, 0.5)
    assert found.extensions[("s1", "01_float_formats")] == at(BERLIN, 2025, 3, 12, 23, 59)
    due = at(BERLIN, 2025, 3, 11, 12, 0).timestamp()
    assert found.judge("01_float_formats", "s1", due, "x").fraction == 0.0  # extended
    assert found.judge("01_float_formats", "s2", due, "x").fraction == 0.1
    unknown = found.judge("01_float_formats", "s2", None, "none")
    assert (unknown.fraction, unknown.note) == (0.0, "no submission time: no penalty")
    marked = found.judge("01_float_formats", "s2", None, "Canvas's LATE mark", late_mark=True)
    assert marked.fraction == 0.1  # one period, the least a late hand-in can be
    assert found.judge("03_matmul_flops", "s2", due, "x").fraction == 0.0  # no due date


@pytest.mark.parametrize(("text", "message"), [
    ('[lessons.01_float_formats]\ndue = "2025-03-10 23:59"', "has no time zone"),
    ('timezone = "Europe/Berlin"\n[lessons.a]\ndue = "2025-03-30 02:30"', "does not exist"),
    ('timezone = "Europe/Berlin"\n[lessons.a]\ndue = "2025-10-26 02:30"', "happens twice"),
    ('timezone = "Mars/Olympus"', "no IANA time zone"),
    ('[policy]\nper = "week"', "one of"),
    ('[policy]\nrate = 1.5', "from 0 to 1"),
    ('deadline = 3', "unknown key"),
    ('timezone = "UTC"\n[lessons.a]\ndue = "2025-01-01 10:00"\n[[extensions]]\n'
     'student = "s"\nlesson = "b"\ndays = 1', "has no due date"),
])
def test_a_bad_file_is_refused_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(CourseError, match=message):
        parse(text)


def test_times_from_nbgrader_zips_and_offsets() -> None:
    assert nbgrader_timestamp("2025-03-10 22:59:00.5 UTC") == at(
        UTC, 2025, 3, 10, 22, 59).timestamp() + 0.5
    assert nbgrader_timestamp("not a time") is None
    assert nbgrader_timestamp("2025-03-10T22:59Z") == at(UTC, 2025, 3, 10, 22,
                                                         59).timestamp()
    for odd in ("2026-11 03:03:16 UTC", "03:03:16", "now", "2026-11-25",  # filled in from today
                "2025-03-11 00:59 +02:00",  # dateutil reads +02:00 as UTC-2
                "2025-12-31 23:59:60 UTC", "2025-02-30 10:00 UTC"):
        assert nbgrader_timestamp(odd) is None, odd
    assert naive_time((2025, 3, 10, 23, 59, 0), BERLIN, "zip") == at(
        BERLIN, 2025, 3, 10, 23, 59).timestamp()
    assert naive_time((2025, 3, 10, 23, 59, 0), None, "zip") is None  # no zone: no time
    assert parse_time("2025-03-10T22:59:00Z", None, "x") == at(UTC, 2025, 3, 10, 22,
                                                                  59)


# ------------------------------------------------------------------ mistakes in the file

UTC_LESSON = 'timezone = "UTC"\n[lessons.01_float_formats]\ndue = "2025-03-10 23:59"\n'
EXTENSION = '[[extensions]]\nstudent = "s1"\nlesson = "01_float_formats"\n'


@pytest.mark.parametrize(("text", "message"), [
    ('timezone = "Europe"', "no IANA time zone"),  # a folder of zones: IsADirectoryError
    ('timezone = "' + "x" * 300 + '"', "no IANA time zone"),  # OSError: name too long
    ('timezone = "../../etc/passwd"', "no IANA time zone"),
    ("timezone = 3", "no IANA time zone"),
    ('timezone = "UTC"\n[lessons.01_float_formats]\ndue = "9999-12-31 23:59"', "1971 to 2199"),
    ('timezone = "UTC"\n[lessons.01_float_formats]\ndue = "0001-01-01 00:00"', "1971 to 2199"),
    ("[lessons.01_float_formats]\ndue = 0001-01-01T00:00:00Z", "1971 to 2199"),  # TOML's own
    (UTC_LESSON + EXTENSION + "days = 1e12", "from 0 to 3,660"),
    (UTC_LESSON + EXTENSION + "days = nan", "must be a number"),
    (UTC_LESSON + EXTENSION + "days = -1", "must be a number"),
    (UTC_LESSON.replace("2025", "2199") + EXTENSION + "days = 3000", "past the year 2199"),
    (UTC_LESSON + EXTENSION + 'due = "9999-01-01 00:00"', "1971 to 2199"),
    ("[policy]\ngrace_minutes = 1e12", "grace_minutes = 1000000000000.0 must be"),
    ("[policy]\nzero_after_days = inf", "zero_after_days"),
    ("[policy]\nrate = nan", "rate"),
    (UTC_LESSON + "extension = 3", "unknown key"),  # in a lesson's table
    (UTC_LESSON + EXTENSION + 'days = 1\nstudnet = "x"', "unknown key"),
    (UTC_LESSON + '[[extensions]]\nstudent = ""\nlesson = "01_float_formats"\ndays = 1',
     "needs student"),
])
def test_every_bad_value_is_refused_saying_what_to_write(text: str, message: str) -> None:
    with pytest.raises(CourseError, match=re.escape(message)):
        parse(text)


def test_a_bad_file_stops_every_command_with_a_message_not_a_traceback(tmp_path) -> None:
    bad = tmp_path / "deadlines.toml"
    bad.write_text('timezone = "Europe"\n')
    root = tmp_path / "course"
    submissions = tmp_path / "class" / "s1"
    submissions.mkdir(parents=True)
    for args in (("export",), ("report", LESSON.name), ("review", LESSON.name),
                 ("feedback", LESSON.name), ("deadlines", "--check"),
                 ("autograde", LESSON.name, submissions.parent)):
        done = command(*args, "--course-dir", root, "--deadlines", bad, check=False)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "timezone = 'Europe' is no IANA time zone" in done.stderr, args
        assert "Traceback" not in done.stdout + done.stderr


def known_class(root: Path) -> None:
    """A graded class of lesson 01 as the ledger keeps it: ids, names, e-mails, LMS ids."""
    from grader.gradebook import ledger

    people = {"s003": ("Ada Lovelace", "ada@uni.edu", ""),
              "ana@uni.es": ("Ana Ruiz", "ana@uni.es", "A 1234"),  # Gradescope SID, no id
              "s010": ("Jean Dupont", "", ""), "s011": ("Jean  Dupont", "", ""),
              "s020": ("Bob Roe", "bob@uni.edu", "")}
    ledger.write(f"sqlite:///{root / 'gradebook.db'}", LESSON.name, [
        {"student_id": sid, "status": "graded", "details": {"handin": {
            "from": "gradescope", "name": name, "email": email, "lms_id": lms_id}}}
        for sid, (name, email, lms_id) in people.items()])


def test_extensions_name_students_by_id_lms_id_email_or_name_and_mistakes_are_warned(
        tmp_path) -> None:
    root = tmp_path / "course"
    root.mkdir()
    known_class(root)
    extension = '[[extensions]]\nstudent = "{}"\nlesson = "01_float_formats"\ndays = 2\n'
    (root / "deadlines.toml").write_text(
        DEADLINES.replace(f"[[extensions]]\nstudent = \"extended\"\nlesson = \"{LESSON.name}\"\n"
                          'due = "2025-03-14 12:00"\n', "")
        + '[lessons.01_float_format]\ndue = "2025-03-10 23:59"\n'  # misspelt
        + "".join(extension.format(who) for who in (
            "S003", "A 1234", "BOB@uni.edu", "JEAN DUPONT", "s999", "bob roe")))
    done = command("deadlines", "--check", "--course-dir", root, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "01_float_format]: the course has no lesson '01_float_format'" in out
    assert "did you mean 01_float_formats?" in out
    assert "extension 1: 'S003', 01_float_formats: due 2025-03-12T23:59+01:00 -> s003" in out
    assert "read as 's003' (ids are case-sensitive" in out
    assert "extension 2: 'A 1234'" in out and "-> ana@uni.es" in out  # the SID
    assert "extension 3: 'BOB@uni.edu'" in out and "-> s020" in out  # the e-mail
    assert "extension 4: 'JEAN DUPONT'" in out and "names 2 students" in out
    assert "extension 5: 's999'" in out and "applies to no one" in out
    assert "extension 6: 'bob roe'" in out and "earlier extension" in out  # the name
    assert out.count("warning: ") == 5
    from grader.course import Course

    found = Course(root, log=lambda _: None).deadlines()
    assert {student for student, _ in found.extensions} == {"s003", "ana@uni.es", "s020"}
    late = at(BERLIN, 2025, 3, 12, 12, 0).timestamp()
    assert found.judge(LESSON.name, "ana@uni.es", late, "x").fraction == 0.0  # extended
    assert found.judge(LESSON.name, "s010", late, "x").fraction == 0.2  # neither Jean
    said = command("export", "--course-dir", root, "--csv", tmp_path / "g.csv").stdout
    assert said.count("warning: ") == 5  # every command reads the file, and says so, once
    clean = tmp_path / "clean.toml"
    clean.write_text(DEADLINES.split("[[extensions]]")[0])
    assert command("deadlines", "--check", "--course-dir", root, "--deadlines",
                   clean).returncode == 0


# ------------------------------------------------------------------ where times come from

def test_the_lms_late_mark_costs_what_one_second_late_costs_and_says_so() -> None:
    plain = parse(FILE)
    marked = plain.judge("01_float_formats", "s2", None, "Canvas's LATE mark", late_mark=True)
    assert (marked.fraction, marked.periods) == (0.1, 1)
    assert marked.note == "marked late by the LMS, time unknown: charged as one period late " \
        "(-10%)"
    graced = parse(FILE.replace("cap = 0.5", "cap = 0.5\ngrace_minutes = 5")).judge(
        "01_float_formats", "s2", None, "Canvas's LATE mark", late_mark=True)
    assert (graced.fraction, graced.periods, graced.late) == (0.0, 0, False)
    assert graced.note == "marked late by the LMS, time unknown: no penalty (it may lie " \
        "within the 5-minute grace)"
    extended = plain.judge("01_float_formats", "s1", None, "Canvas's LATE mark", late_mark=True)
    assert extended.fraction == 0.0 and "an extension applies" in extended.note
    forged = plain.judge("01_float_formats", "s2", 1e13, "Gradescope's created_at")
    assert forged.fraction == 0.0 and "out of range" in forged.source  # year 318857


def moodle_class(tmp_path: Path, stamped: tuple) -> Path:
    """Moodle's "Download all submissions" zip: every member stamped ``stamped``, the time of
    the download (mod/assign's downloader), as Moodle does."""
    archive = tmp_path / "CS101-Floats-77.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for name, number in (("Adélaïde Lovelace", 5001), ("Jean Dupont", 5002)):
            out.writestr(zipfile.ZipInfo(f"{name}_{number}_assignsubmission_file_/{NOTEBOOK}",
                                         stamped), "{}")
    return archive


def stored(course, layout: str, folder: Path, times: dict | None = None,
           received=None) -> tuple[list, dict[str, dict]]:
    """The hand-ins of ``folder``, their times stored, and the late policy's rows."""
    from grader.gradebook.batch import store_times
    from grader.gradebook.grades import apply_deadlines
    from grader.intake.handins import recognise
    from grader.intake.zips import Received

    found_layout, handins, _ = recognise(folder, LESSON.name, NOTEBOOK, layout)
    store_times(course, LESSON, found_layout, handins, received or Received(folder),
                times or {}, course.deadlines())
    rows = [{"lesson": LESSON.name, "student_id": h.student_id, "score": 10.0} for h in handins]
    apply_deadlines(course, rows)
    return handins, {r["student_id"]: r for r in rows}


def test_a_zips_member_times_never_count_and_moodles_worksheet_gives_the_times(tmp_path) -> None:
    """Moodle stamps every member of its download with the download's time: four days after
    the due date here, which cost an on-time student 40%. Its grading worksheet gives each
    participant's time ("Last modified (submission)", as English Moodle's userdate() writes
    it, in the instructor's zone)."""
    from grader.course import Course
    from grader.intake.lms_names import named_by_lms

    said: list[str] = []
    course = Course(tmp_path / "course", log=said.append)
    (course.root / "deadlines.toml").write_text(DEADLINES)
    received = unpack_zip(moodle_class(tmp_path, (2025, 3, 14, 9, 0, 0)), tmp_path / "out",
                          named_by_lms)
    _, rows = stored(course, "moodle", received.root, received=received)
    for row in rows.values():
        assert (row["late_penalty"], row["score"]) == (0.0, 10.0)
        assert row["time_source"] == "none: no submission time in a Moodle download"
        assert row["late_note"] == "no submission time: no penalty"
    assert any("2 unknown, so no late penalty for them (give Moodle's grading worksheet with "
               "--times FILE)" in line for line in said), said
    worksheet = tmp_path / "worksheet.csv"
    worksheet.write_text(
        "\ufeffIdentifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be "
        "changed,Last modified (submission),Online text,Last modified (grade),Feedback comments\n"
        "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted for grading,,100.00,Yes,"
        "\"Monday, 10 March 2025, 11:58 PM\",,-,\n"
        "Participant 5002,Jean Dupont,jean@uni.fr,Submitted for grading,,100.00,Yes,"
        "\"Wednesday, 12 March 2025, 1:05 AM\",,-,\n", encoding="utf-8")
    from grader.gradebook.deadlines import times_file

    times = times_file(worksheet, BERLIN)
    assert times["5001"][0] == at(BERLIN, 2025, 3, 10, 23, 58).timestamp()
    _, rows = stored(course, "moodle", received.root, times, received)
    assert rows["5001"]["late_penalty"] == 0.0 and rows["5001"]["late_note"] == "on time"
    assert rows["5002"]["late_penalty"] == pytest.approx(2.0)  # 1 d 1 h late: two days
    assert rows["5002"]["time_source"] == "Moodle's grading worksheet (Last modified " \
        "(submission))"
    folders = tmp_path / "zipped-folders"  # a zip an instructor made of student folders
    with zipfile.ZipFile(folders.with_suffix(".zip"), "w") as out:
        out.writestr(zipfile.ZipInfo(f"s1/{NOTEBOOK}", (2025, 3, 20, 9, 0, 0)), "{}")
    received = unpack_zip(folders.with_suffix(".zip"), folders)
    _, rows = stored(course, "folders", received.root, received=received)
    assert rows["s1"]["late_penalty"] == 0.0
    assert rows["s1"]["time_source"] == "none: no submission time in student folders"
    # The same worksheet downloaded in French and in German: headings, identifiers and times
    # as those languages write them.
    Path(tmp_path / "fr.csv").write_text(
        "Identifiant,Nom complet,Adresse de courriel,Statut,Note,Note maximale,"
        "Dernière modification (travail remis),Dernière modification (note)\n"
        "Participant5001,Adélaïde Lovelace,ada@uni.fr,Remis,,\"100,00\","
        "\"lundi 10 mars 2025, 23:58\",-\n", encoding="utf-8")
    Path(tmp_path / "de.csv").write_text(
        "ID,Vollständiger Name,E-Mail-Adresse,Status,Bewertung,Bestwertung,"
        "Zuletzt geändert (Abgabe),Zuletzt geändert (Bewertung)\n"
        "Teilnehmer/in5001,Adélaïde Lovelace,ada@uni.fr,Abgegeben,,\"100,00\","
        "\"Montag, 10. März 2025, 23:58\",-\n", encoding="utf-8")
    for language in ("fr", "de"):
        assert times_file(tmp_path / f"{language}.csv", BERLIN) == {"5001": times["5001"]}
    Path(tmp_path / "odd.csv").write_text("Identifier,Last modified (submission)\n"
                                          "Participant 1,10/03/2025 23:58\n")
    with pytest.raises(CourseError, match="not a time as Moodle writes it"):
        times_file(tmp_path / "odd.csv", BERLIN)
    with pytest.raises(CourseError, match="set timezone"):
        times_file(worksheet, None)


def test_canvas_times_come_from_its_submissions_api_json(tmp_path) -> None:
    from grader.course import Course
    from grader.gradebook.deadlines import times_file
    from tests.test_handins import canvas_file_name

    pages = [[{"id": 1, "user_id": 101, "submitted_at": "2025-03-11T12:30:00Z", "late": True,
               "seconds_late": 45060, "workflow_state": "submitted", "attempt": 2},
              {"id": 2, "user_id": 102, "submitted_at": None, "workflow_state": "unsubmitted"}],
             [{"id": 3, "anonymous_id": "x1Y2z", "submitted_at": "2025-03-10T20:00:00Z"}]]
    api = tmp_path / "submissions.json"
    api.write_text(json.dumps(pages))
    times = times_file(api, None)
    assert set(times) == {"101", "anon_x1Y2z"}  # nothing submitted: no time
    assert times["101"] == (at(UTC, 2025, 3, 11, 12, 30).timestamp(),
                            "Canvas's submitted_at (submissions API)")
    course = Course(tmp_path / "course", log=lambda _: None)
    (course.root / "deadlines.toml").write_text(DEADLINES)
    download = tmp_path / "submissions"
    download.mkdir()
    (download / canvas_file_name("Lovelace, Ada", 101, 905, NOTEBOOK, late=True)).write_text("{}")
    (download / canvas_file_name("Roe, Rick", 102, 906, NOTEBOOK, late=True)).write_text("{}")
    handins, rows = stored(course, "canvas", download, times)
    assert [h.reasons for h in handins] == [[], []]  # LATE_ reads as one user, not two
    assert rows["101"]["late_penalty"] == pytest.approx(1.0)  # 12 h 31 min late: one day
    assert rows["102"]["late_note"] == "marked late by the LMS, time unknown: charged as " \
        "one period late (-10%)"
    for text in ('[{"user_id": 1, "submitted_at": "yesterday"}]', '{"a": 1}', "[1, 2]"):
        api.write_text(text)
        with pytest.raises(CourseError, match="Canvas"):
            times_file(api, None)
    api.write_text("who,when\n1,2\n")
    with pytest.raises(CourseError, match="none of the forms read"):
        times_file(api, None)


def test_only_a_timestamp_our_collect_wrote_decides_lateness(tmp_path) -> None:
    """nbgrader's collect copies timestamp.txt as the student left it: one that says 2020 on a
    hand-in ten days late is no time at all. Ours (grader/intake/exchange.py) writes its own."""
    from grader.course import Course

    course = Course(tmp_path / "course", log=lambda _: None)
    (course.root / "deadlines.toml").write_text(DEADLINES)
    for root, stamp in ((tmp_path / "submitted", "2020-01-01 00:00:00.000000 UTC"),
                        (course.root / "collected", "2025-03-12 00:59:00.000000 UTC")):
        folder = root / "mallory" / LESSON.name
        folder.mkdir(parents=True)
        (folder / NOTEBOOK).write_text("{}")
        (folder / "timestamp.txt").write_text(stamp)
    handins, rows = stored(course, "nbgrader", tmp_path / "submitted")
    assert rows["mallory"]["late_penalty"] == 0.0
    assert rows["mallory"]["time_source"] == "none: timestamp.txt says 2020-01-01T00:00:00+00:00" \
        ", but the student wrote it (not python -m grader collect)"
    assert "its timestamp.txt says 2020-01-01T00:00:00+00:00, but the student's side wrote it" \
        in handins[0].reasons[0]  # needs_review, with the reason
    handins, rows = stored(course, "nbgrader", course.root / "collected")
    assert handins[0].reasons == [] and rows["mallory"]["late_penalty"] == pytest.approx(2.0)
    assert rows["mallory"]["time_source"] == "timestamp.txt (written by python -m grader collect)"


# ------------------------------------------------------------------ end to end

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
DUE = at(BERLIN, 2025, 3, 10, 23, 59)
DEADLINES = f"""
timezone = "Europe/Berlin"
[policy]
per = "day"
rate = 0.1
cap = 0.5
[lessons.{LESSON.name}]
due = "2025-03-10 23:59"
[[extensions]]
student = "extended"
lesson = "{LESSON.name}"
due = "2025-03-14 12:00"
"""


@pytest.fixture(scope="module")
def course(tmp_path_factory, shared_tmp):
    """Four full-marks notebooks as ``python -m grader collect`` leaves them in collected/
    (its timestamp.txt is trusted): on time, two days late, late within an extension, and no
    timestamp.txt."""
    tmp = tmp_path_factory.mktemp("deadlines")
    root = released_course([LESSON], shared_tmp, tmp / "course")
    (root / "deadlines.toml").write_text(DEADLINES)
    instructor = read_notebook(LESSON.notebook)
    stamps = {"on_time": DUE - timedelta(minutes=1), "late": DUE + timedelta(days=1, hours=2),
              "extended": DUE + timedelta(days=3), "no_time": None}
    for student, when in stamps.items():
        folder = root / "collected" / student / LESSON.name
        folder.mkdir(parents=True)
        nbformat.write(instructor, folder / NOTEBOOK)
        if when is not None:  # nbgrader writes UTC, as "%Y-%m-%d %H:%M:%S.%f %Z"
            (folder / "timestamp.txt").write_text(
                when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    done = grader("autograde", LESSON.name, "--collected", "--course-dir", root)
    assert "4 graded" in done.stdout, done.stdout
    return root


@pytest.mark.slow
@pytest.mark.xdist_group("deadlines")
def test_export_has_raw_score_penalty_and_final(course, tmp_path) -> None:
    path = tmp_path / "grades.csv"
    command("export", "--course-dir", course, "--csv", path)
    rows = {s: r for (s, _), r in read_export(path).items()}
    full = float(rows["on_time"]["raw_score"])
    assert full > 0 and float(rows["on_time"]["score"]) == full
    late = rows["late"]  # a day and two hours late: two started days, 20%
    assert float(late["late_penalty"]) == pytest.approx(0.2 * full)
    assert float(late["score"]) == float(late["final_score"]) == pytest.approx(0.8 * full)
    assert late["time_source"] == "timestamp.txt (written by python -m grader collect)"
    assert late["submitted_at"].startswith("2025-03-12T00:59")  # UTC
    assert float(rows["extended"]["late_penalty"]) == 0.0
    assert rows["extended"]["due"].endswith("(extended)")
    assert rows["no_time"]["late_note"] == "no submission time: no penalty"
    assert float(rows["no_time"]["score"]) == full
    header = next(csv.reader(path.open()))
    assert header[:14] == ["student_id", "lesson", "score", "max_score", "status", "reason",
                           "name", "late", "from", "lms_id", "computed_score", "review",
                           "review_note", "reviewed_by"]  # the existing columns stay


@pytest.mark.slow
@pytest.mark.xdist_group("deadlines")
def test_report_names_the_penalised_and_those_without_a_time(course) -> None:
    done = command("report", LESSON.name, "--course-dir", course)
    assert "late policy: 1 submission(s) penalised" in done.stdout
    assert "no submission time known, so no penalty: 1 (no_time)" in done.stdout
    with (course / "reports" / LESSON.name / "late.csv").open() as handle:
        late = {r["student_id"]: r for r in csv.DictReader(handle)}
    assert float(late["late"]["final_score"]) < float(late["late"]["raw_score"])


@pytest.mark.slow
@pytest.mark.xdist_group("deadlines")
def test_an_extension_granted_later_counts_without_grading_again(course, tmp_path) -> None:
    other = tmp_path / "deadlines.toml"
    other.write_text(DEADLINES + f'[[extensions]]\nstudent = "late"\nlesson = "{LESSON.name}"\n'
                     "days = 2\n")
    path = tmp_path / "grades.csv"
    command("export", "--course-dir", course, "--deadlines", other, "--csv", path)
    row = read_export(path)[("late", LESSON.name)]
    assert float(row["late_penalty"]) == 0.0
    missing = command("export", "--course-dir", course, "--deadlines", tmp_path / "nope.toml",
                      check=False)
    assert missing.returncode == 2 and "no deadlines file" in missing.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("deadlines")
def test_review_decides_the_points_and_the_penalty_applies_after(course, tmp_path) -> None:
    command("review", LESSON.name, "late", "--total", "10", "--note", "partial redo",
            "--course-dir", course)
    path = tmp_path / "grades.csv"
    command("export", "--course-dir", course, "--csv", path)
    row = read_export(path)[("late", LESSON.name)]
    assert (float(row["raw_score"]), float(row["score"])) == (10.0, pytest.approx(8.0))
    grader("feedback", LESSON.name, "--course-dir", course)
    page = (course / "feedback" / "late" / LESSON.name / f"{LESSON.notebook_id}.html").read_text()
    assert "late penalty 2, final 8" in page and "timestamp.txt" in page
    assert "Score: 8.0 / " in page  # the page's total is the final score
    command("review", LESSON.name, "late", "--clear-total", "--course-dir", course)
