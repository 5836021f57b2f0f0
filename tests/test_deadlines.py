"""Due dates, extensions and the late policy: the arithmetic around the deadline and across
daylight-saving changes, the file's checks, and end to end on lesson 01 handed in through
nbgrader's collect layout (``timestamp.txt``): export, report, feedback and review agree."""

from __future__ import annotations

import csv
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.deadlines import (
    Policy,
    _wall,
    late_periods,
    naive_time,
    nbgrader_timestamp,
    parse,
    parse_time,
    penalty_fraction,
)
from grader.intake import unpack_zip
from grader.lessons import CourseError, load_lesson
from tests.grading_helpers import grader, read_export, read_notebook
from tests.test_review import command

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
PER_DAY = Policy(per="day", rate=0.1, cap=0.5)
PER_HOUR = Policy(per="hour", rate=0.02, cap=0.3)


def at(zone: ZoneInfo, *fields: int) -> datetime:
    return datetime(*fields, tzinfo=zone)


def after(due: datetime, **elapsed: float) -> datetime:
    """``due`` plus elapsed time (aware + timedelta in one zone would add wall-clock time)."""
    return (due.astimezone(timezone.utc) + timedelta(**elapsed)).astimezone(due.tzinfo)


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
    due = due.astimezone(timezone.utc).astimezone(zone)  # a wall time that exists
    submitted = after(due, seconds=seconds)
    days = late_periods("day", due, submitted)
    assert days >= 1
    utc = submitted.astimezone(timezone.utc)
    assert _wall(due, days - 1).astimezone(timezone.utc) < utc <= _wall(due, days).astimezone(
        timezone.utc)
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
    ('[policy]\nrate = 1.5', "at most 1"),
    ('deadline = 3', "unknown key"),
    ('timezone = "UTC"\n[lessons.a]\ndue = "2025-01-01 10:00"\n[[extensions]]\n'
     'student = "s"\nlesson = "b"\ndays = 1', "has no due date"),
])
def test_a_bad_file_is_refused_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(CourseError, match=message):
        parse(text)


def test_times_from_nbgrader_zips_and_offsets() -> None:
    assert nbgrader_timestamp("2025-03-10 22:59:00.5 UTC") == at(
        timezone.utc, 2025, 3, 10, 22, 59).timestamp() + 0.5
    assert nbgrader_timestamp("not a time") is None
    assert nbgrader_timestamp("2025-03-10T22:59Z") == at(timezone.utc, 2025, 3, 10, 22,
                                                         59).timestamp()
    for odd in ("2026-11 03:03:16 UTC", "03:03:16", "now", "2026-11-25",  # filled in from today
                "2025-03-11 00:59 +02:00",  # dateutil reads +02:00 as UTC-2
                "2025-12-31 23:59:60 UTC", "2025-02-30 10:00 UTC"):
        assert nbgrader_timestamp(odd) is None, odd
    assert naive_time((2025, 3, 10, 23, 59, 0), BERLIN, "zip") == at(
        BERLIN, 2025, 3, 10, 23, 59).timestamp()
    assert naive_time((2025, 3, 10, 23, 59, 0), None, "zip") is None  # no zone: no time
    assert parse_time("2025-03-10T22:59:00Z", None, "x") == at(timezone.utc, 2025, 3, 10, 22,
                                                                  59)


def test_a_zip_keeps_each_members_time(tmp_path: Path) -> None:
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr(zipfile.ZipInfo("s1/nb.ipynb", (2025, 3, 11, 8, 30, 0)), "{}")
    received = unpack_zip(archive, tmp_path / "out")
    assert received.member_times[str(tmp_path / "out" / "s1" / "nb.ipynb")] == (
        2025, 3, 11, 8, 30, 0)


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
def course(tmp_path_factory):
    """Four full-marks notebooks in nbgrader's collect layout: on time, two days late, late
    within an extension, and no timestamp.txt."""
    tmp = tmp_path_factory.mktemp("deadlines")
    root = tmp / "course"
    grader("release", LESSON.name, "--course-dir", root)
    (root / "deadlines.toml").write_text(DEADLINES)
    instructor = read_notebook(LESSON.notebook)
    stamps = {"on_time": DUE - timedelta(minutes=1), "late": DUE + timedelta(days=1, hours=2),
              "extended": DUE + timedelta(days=3), "no_time": None}
    for student, when in stamps.items():
        folder = tmp / "submitted" / student / LESSON.name
        folder.mkdir(parents=True)
        nbformat.write(instructor, folder / NOTEBOOK)
        if when is not None:  # nbgrader writes UTC, as "%Y-%m-%d %H:%M:%S.%f %Z"
            (folder / "timestamp.txt").write_text(
                when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    done = grader("autograde", LESSON.name, tmp / "submitted", "--course-dir", root)
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
    assert late["time_source"] == "nbgrader's timestamp.txt"
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
