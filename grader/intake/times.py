"""Submission times: read from what can be trusted, and kept beside the grades.

Kept in the table ``ctc_submission_time`` of the gradebook's database (``write_times``,
``read_times``): the late policy (grader/gradebook/deadlines.py) is computed from them whenever
grades
are read. Read from nbgrader's ``timestamp.txt`` (``nbgrader_timestamp``), a time with no zone
(Blackboard's attempt date, ``naive_time``), or a file the instructor has (``autograde --times
FILE``, ``read``), in the form they have it. A zip's member times are never used: an LMS
stamps them when the zip is made (Moodle's "Download all submissions" gives every file the time
of the download), and a zip an instructor made of folders keeps whatever the files said. The
forms ``read`` reads:

- Our own CSV: ``student_id,submitted_at`` (ISO 8601; without an offset, in the deadlines
  file's ``timezone``).
- Moodle's grading worksheet (the assignment's View all submissions > Download grading
  worksheet), as it comes: ``Identifier`` ("Participant 5001": the participant id that its
  "Download all submissions" names folders by) and ``Last modified (submission)``, which Moodle
  writes with ``userdate()`` (mod/assign/gradingtable.php, ``col_timesubmitted``): in English
  "Tuesday, 4 March 2025, 9:05 AM" (langconfig ``strftimedaydatetime``), in the downloading
  user's time zone, so read in ``timezone``; "-" where nothing was submitted. Moodle writes
  minutes only: a hand-in counts from the start of its minute (never later than it was).
- Canvas's submissions API (``GET /api/v1/courses/:course_id/assignments/:assignment_id/
  submissions``), its JSON as it comes: a list of submissions, or a list of such pages;
  ``user_id`` (the id Canvas's download names files by; ``anonymous_id`` under anonymous
  grading, ``anon_<id>`` in the download) and ``submitted_at`` (ISO 8601, UTC; null where
  nothing was submitted).

``read`` returns student id -> (seconds since the epoch, where the time came from).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from grader.common.errors import CourseError
from grader.common.text import inert
from grader.intake.zips import MAX_METADATA_BYTES

OURS = "the timestamps file"
MOODLE = "Moodle's grading worksheet (Last modified (submission))"
CANVAS = "Canvas's submitted_at (submissions API)"
FORMS = ("a CSV student_id,submitted_at; Moodle's grading worksheet as it comes (Identifier, "
         "Last modified (submission)); or Canvas's submissions API JSON (user_id, "
         "submitted_at)")


def read(path: Path, zone: ZoneInfo | None) -> dict[str, tuple[float, str]]:
    """Each student's submission time in ``path`` (see the module's docstring)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_METADATA_BYTES + 1)
    except OSError as error:
        raise CourseError(f"cannot read the timestamps file {path}: "
                          f"{error.strerror or error}") from None
    if len(data) > MAX_METADATA_BYTES:
        raise CourseError(f"the timestamps file {path} is larger than "
                          f"{MAX_METADATA_BYTES // 2**20} MiB: give {FORMS}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CourseError(f"the timestamps file {path} is not UTF-8 text: give {FORMS}") from None
    if text.lstrip()[:1] in ("[", "{"):
        return _canvas(text, path)
    from grader.intake import worksheet
    from grader.intake.rosters import read_csv

    rows = read_csv(path, "timestamps file")
    header = set(rows[0]) if rows else set()
    if {"student_id", "submitted_at"} <= header:
        return _ours(rows, path, zone)
    if {"Identifier", "Last modified (submission)"} <= set(worksheet.columns(list(header))):
        return _moodle(worksheet.english_rows(rows), path, zone)
    raise CourseError(f"the timestamps file {path} is none of the forms read: {FORMS}")


def _ours(rows: list[dict[str, str]], path: Path, zone: ZoneInfo | None,
          ) -> dict[str, tuple[float, str]]:
    from grader.intake.times import parse_time

    return {row["student_id"]: (parse_time(row["submitted_at"], zone, f"{path}, "
                                           f"{inert(row['student_id'], 60)}").timestamp(), OURS)
            for row in rows if row.get("student_id") and row.get("submitted_at")}


def _moodle(rows: list[dict[str, str]], path: Path, zone: ZoneInfo | None,
            ) -> dict[str, tuple[float, str]]:
    if zone is None:
        raise CourseError(f"{path} is Moodle's grading worksheet, whose times have no zone (they "
                          "are in your Moodle profile's): set timezone = \"Area/City\" in the "
                          "deadlines file to that zone")
    from grader.intake.worksheet import participant

    found = {}
    for number, row in enumerate(rows, start=2):
        student = participant(row.get("Identifier", ""))
        written = row.get("Last modified (submission)", "").strip()
        if student is None or written in ("", "-"):
            continue
        when = moodle_time(written, zone)
        if when is None:
            raise CourseError(f"{path}, line {number}: 'Last modified (submission)' is "
                              f"{inert(written, 60)!r}, not a time as Moodle writes it in "
                              "English, German, French or Spanish (\"Tuesday, 4 March 2025, "
                              "9:05 AM\"): download the worksheet with your Moodle language set "
                              "to one of these, or give a CSV student_id,submitted_at")
        found[student] = (when, MOODLE)
    return found


def moodle_time(text: str, zone: ZoneInfo) -> float | None:
    """A time as Moodle's userdate() writes it ("Tuesday, 4 March 2025, 9:05 AM", or in German,
    French or Spanish: grader/intake/worksheet.py) in ``zone``, as seconds since the epoch;
    None for anything else. A wall time that happens twice (clocks going back) is read as the
    earlier."""
    from grader.intake.times import FIRST_YEAR, LAST_YEAR
    from grader.intake.worksheet import wall_time

    found = wall_time(text)
    if found is None or not FIRST_YEAR <= found[0] <= LAST_YEAR:
        return None
    try:
        when = datetime(*found)
    except ValueError:
        return None
    return when.replace(tzinfo=zone, fold=0).timestamp()


def _canvas(text: str, path: Path) -> dict[str, tuple[float, str]]:
    from grader.intake.times import plausible

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CourseError(f"the timestamps file {path} is not readable JSON "
                          f"({inert(str(error), 200)}): give {FORMS}") from None
    pages = data if isinstance(data, list) else [data]
    submissions = [s for page in pages for s in (page if isinstance(page, list) else [page])]
    if not submissions or not all(isinstance(s, dict) and ("user_id" in s or "anonymous_id" in s)
                                  for s in submissions):
        raise CourseError(f"the timestamps file {path} is JSON, but not Canvas's list of "
                          "submissions (each with user_id and submitted_at)")
    found = {}
    for submission in submissions:
        written = submission.get("submitted_at")
        if not isinstance(written, str) or not written:
            continue  # nothing submitted
        user = submission.get("user_id")
        student = (str(user) if isinstance(user, int) and not isinstance(user, bool)
                   else f"anon_{submission['anonymous_id']}"
                   if isinstance(submission.get("anonymous_id"), str) else "")
        try:
            when = datetime.fromisoformat(written.strip().replace("Z", "+00:00"))
        except ValueError:
            when = None
        if not student or when is None or when.tzinfo is None \
                or not plausible(when.timestamp()):
            raise CourseError(f"the timestamps file {path}: a submission of user "
                              f"{inert(str(user), 40)} has submitted_at "
                              f"{inert(written, 60)!r}, not a time as Canvas writes it "
                              "(2025-03-10T22:59:00Z)")
        found[student] = (when.timestamp(), CANVAS)
    return found


# ------------------------------------------------------------------ stamps and naive times

def naive_time(value: tuple | str, zone: ZoneInfo | None, what: str) -> float | None:
    """A time with no zone of its own (a zip member's, Blackboard's attempt date) read in
    ``zone``; None where there is no zone to read it in or it is no real time."""
    from grader.intake.times import parse_time

    if zone is None:
        return None
    try:
        when = datetime(*value[:6]) if isinstance(value, tuple) else datetime.strptime(
            value, "%Y-%m-%d-%H-%M-%S")
        return parse_time(when.isoformat(), zone, what).timestamp()
    except (CourseError, ValueError, TypeError):
        return None


# What nbgrader's submit writes: a whole date and time in UTC. nbgrader's own parser
# (dateutil) fills a missing year, month or day from today's date, so that "2026-11 03:03"
# reads as another time on another day, and reads "+02:00" as a POSIX zone (UTC-2): we read
# only this form.
NBGRADER_STAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})"
                            r"(?::(\d{2})(?:\.(\d{1,9}))?)?(?: ?(?:UTC|GMT|Z))?")


def nbgrader_timestamp(text: str) -> float | None:
    """nbgrader's ``timestamp.txt`` (``2025-03-10 22:59:00.123456 UTC``) as seconds since the
    epoch; None for anything else (a date without its day, an offset, a 61st second)."""
    found = NBGRADER_STAMP.fullmatch(text.strip()[:100])
    if found is None:
        return None
    *fields, fraction = found.groups()
    try:
        when = datetime(*(int(f or 0) for f in fields), tzinfo=UTC)
    except ValueError:
        return None
    return when.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


# ------------------------------------------------------------------ the table


# ------------------------------------------------------------------ times as text

# A date outside these years, or a span longer than MAX_DAYS, is a typo (and past year 9999
# Python's datetime cannot count at all).
FIRST_YEAR, LAST_YEAR = 1971, 2199


def plausible(seconds: float) -> bool:
    """Whether a submission time lies in the years a deadline may (else it is garbage: a
    forged or broken file's)."""
    try:
        return FIRST_YEAR <= datetime.fromtimestamp(seconds, UTC).year <= LAST_YEAR
    except (OverflowError, OSError, ValueError):
        return False


def parse_time(text: object, zone: ZoneInfo | None, what: str) -> datetime:
    """An ISO 8601 time as an aware datetime; without an offset, in ``zone`` (an error without
    one, or where the wall time does not exist or exists twice there, or outside the years
    FIRST_YEAR to LAST_YEAR)."""
    if isinstance(text, datetime):  # TOML's own date-times
        when = text
    else:
        shown = inert(str(text), 80)
        try:
            when = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
        except ValueError:
            raise CourseError(f"{what}: {shown!r} is not a time (write 2025-03-10 23:59, or "
                              "2025-03-10T23:59+01:00)") from None
    if not FIRST_YEAR <= when.year <= LAST_YEAR:
        raise CourseError(f"{what}: {inert(str(text), 80)} is out of range: give a date in the "
                          f"years {FIRST_YEAR} to {LAST_YEAR}")
    if when.tzinfo is not None:
        return when
    if zone is None:
        raise CourseError(f"{what}: {inert(str(text), 80)} has no time zone; give an offset "
                          "(+01:00) or set timezone = \"Area/City\" in the deadlines file")
    first, second = when.replace(tzinfo=zone, fold=0), when.replace(tzinfo=zone, fold=1)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != when:
        raise CourseError(f"{what}: {when} does not exist in {zone.key} (clocks go "
                          "forward); give another time or its offset")
    if first.utcoffset() != second.utcoffset():
        raise CourseError(f"{what}: {when} happens twice in {zone.key} (clocks go back); "
                          "give the offset, e.g. +01:00 or +02:00")
    return first
