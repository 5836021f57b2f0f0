"""Due dates, extensions and a late policy: what a submission's time costs.

The instructor writes ``deadlines.toml`` in the course directory (or passes ``--deadlines
FILE``)::

    timezone = "Europe/Berlin"      # the zone of every time below written without an offset

    [policy]                        # for every lesson, unless a lesson gives its own
    per = "day"                     # "none", "day" or "hour"
    rate = 0.10                     # fraction of the score lost per started day (hour) late
    cap = 0.50                      # at most this fraction lost (default 1)
    zero_after_days = 7             # later than this after the due time: score 0 (optional;
                                    # or zero_after_hours)
    grace_minutes = 5               # this late counts as on time (default 0)

    [lessons.01_float_formats]
    due = "2025-03-10 23:59"
    # policy = { per = "hour", rate = 0.02 }   a lesson's own policy, field by field

    [[extensions]]
    student = "s017"
    lesson = "01_float_formats"
    due = "2025-03-12 23:59"        # or: days = 2 (added to the lesson's due time)

Times are ISO 8601 (``2025-03-10 23:59``, ``2025-03-10T23:59:00+01:00``); one without an offset
is read in ``timezone``, and without a ``timezone`` it is an error. A wall time that does not
exist (spring forward) or exists twice (fall back) in that zone is refused: give the offset.

How lateness is counted: a "day" late is a calendar day in the zone of the due time, so a
day ends at the due time's wall-clock time on the next date, whatever daylight saving does
(a day across a change is 23 or 25 hours); an "hour" is an hour of elapsed time. Started
periods count: one second late is one period late. The penalty is a fraction of the score the
submission earned (after review), ``min(cap, rate * periods)``, or all of it past the cut-off.

The submission time (grader/handins.py, course.autograde) is the fact stored beside the
grade, in the table ``ctc_submission_time``; the penalty is computed from it and the file as
it stands whenever grades are read (export, report, feedback, review), so that an extension
granted after grading counts without grading again. A submission with no known time pays no
penalty, and the report says so. A Canvas ``LATE_`` mark with no time counts as one period
late (the least a late hand-in can be), unless a timestamps file gives the time.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Boolean, Column, Float, String, Table, select

from grader.lessons import CourseError

POLICY_FIELDS = ("per", "rate", "cap", "zero_after_days", "zero_after_hours", "grace_minutes")


@dataclass(frozen=True)
class Policy:
    per: str = "none"  # "none", "day", "hour"
    rate: float = 0.0
    cap: float = 1.0
    zero_after: timedelta | None = None  # whole days: calendar days, like ``per = "day"``
    grace: timedelta = timedelta(0)  # elapsed time

    def describe(self) -> str:
        if self.per == "none" and self.zero_after is None:
            return "no late penalty"
        parts = [] if self.per == "none" else [
            f"{self.rate:.0%} per started {self.per} late, at most {self.cap:.0%}"]
        if self.zero_after is not None:
            parts.append(f"0 after {_span(self.zero_after)} late")
        return "; ".join(parts)


@dataclass(frozen=True)
class Late:
    """What a submission's time costs."""

    due: datetime | None  # after any extension
    submitted: datetime | None
    source: str  # where the time came from, or why there is none
    fraction: float = 0.0  # of the earned score lost
    periods: int = 0
    extended: bool = False
    note: str = ""  # a line for the report and the feedback page

    @property
    def late(self) -> bool:
        return self.periods > 0 or self.fraction > 0


@dataclass
class Deadlines:
    zone: ZoneInfo | None = None
    policy: Policy = field(default_factory=Policy)
    due: dict[str, datetime] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    extensions: dict[tuple[str, str], datetime] = field(default_factory=dict)
    source: str = ""

    def judge(self, lesson: str, student: str, submitted: float | None, source: str,
              late_mark: bool = False) -> Late:
        """The penalty of one submission of ``lesson`` handed in at ``submitted`` (seconds
        since the epoch; None: unknown)."""
        due = self.extensions.get((student, lesson), self.due.get(lesson))
        extended = (student, lesson) in self.extensions
        if due is None:
            return Late(None, _utc(submitted), source, note="no due date for this lesson")
        policy = self.policies.get(lesson, self.policy)
        if submitted is None:
            if late_mark:
                fraction = penalty_fraction(policy, due, due + timedelta(seconds=1))[0]
                return Late(due, None, source, fraction, 1, extended,
                            "marked late by the LMS, time unknown: charged as one period late")
            return Late(due, None, source, 0.0, 0, extended,
                        "no submission time: no penalty")
        when = datetime.fromtimestamp(submitted, timezone.utc)
        fraction, periods = penalty_fraction(policy, due, when)
        note = "on time" if not periods and not fraction else (
            f"{_span(when - due)} late: " + (f"-{fraction:.0%}" if fraction else "no penalty"))
        return Late(due, when, source, fraction, periods, extended, note)


def penalty_fraction(policy: Policy, due: datetime, submitted: datetime) -> tuple[float, int]:
    """(fraction of the earned score lost, periods late) for a submission at ``submitted``;
    both aware datetimes. Days are calendar days in the due time's zone. Within the grace a
    submission is on time; past it, lateness counts from the due time."""
    submitted = submitted.astimezone(timezone.utc)  # compared as instants (see late_periods)
    if submitted <= _elapsed(due, policy.grace).astimezone(timezone.utc):
        return 0.0, 0
    if policy.zero_after is not None and submitted > _cut_off(
            due, policy.zero_after).astimezone(timezone.utc):
        return 1.0, late_periods(policy.per, due, submitted)
    if policy.per == "none":
        return 0.0, 0
    periods = late_periods(policy.per, due, submitted)
    return min(policy.cap, policy.rate * periods), periods


def late_periods(per: str, due: datetime, submitted: datetime) -> int:
    """Started hours (elapsed time) or calendar days (wall clock in ``due``'s zone) late.

    Every comparison and difference is of UTC instants: Python compares and subtracts two
    datetimes of the same tzinfo by their wall-clock fields, which is wrong by an hour across
    a daylight-saving change."""
    utc_due, submitted = due.astimezone(timezone.utc), submitted.astimezone(timezone.utc)
    if submitted <= utc_due:
        return 0
    if per == "hour":
        return math.ceil((submitted - utc_due).total_seconds() / 3600)
    local = submitted.astimezone(due.tzinfo)
    # The k-th day late ends at the due time's wall-clock time k dates later: 23 or 25 hours
    # for a day across a daylight-saving change.
    days = max(0, (local.date() - due.date()).days - 1)
    while _wall(due, days).astimezone(timezone.utc) < submitted:
        days += 1
    return max(days, 1)


def _elapsed(due: datetime, delta: timedelta) -> datetime:
    """``due`` plus elapsed time (Python's aware + timedelta is wall-clock arithmetic)."""
    return (due.astimezone(timezone.utc) + delta).astimezone(due.tzinfo)


def _cut_off(due: datetime, delta: timedelta) -> datetime:
    """A cut-off of whole days is calendar days in the due time's zone; else elapsed time."""
    if delta.seconds == 0 and delta.microseconds == 0:
        return _wall(due, delta.days)
    return _elapsed(due, delta)


def _wall(due: datetime, days: int) -> datetime:
    """The due time's wall-clock time ``days`` dates later, as an instant."""
    moved = (due.replace(tzinfo=None) + timedelta(days=days)).replace(tzinfo=due.tzinfo)
    if due.tzinfo is timezone.utc or not isinstance(due.tzinfo, ZoneInfo):
        return moved
    return moved.astimezone(timezone.utc).astimezone(due.tzinfo)


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    return (f"{days} d " if days else "") + f"{hours} h {rest // 60} min"


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


# ------------------------------------------------------------------ reading the file

def parse_time(text: object, zone: ZoneInfo | None, what: str) -> datetime:
    """An ISO 8601 time as an aware datetime; without an offset, in ``zone`` (an error without
    one, or where the wall time does not exist or exists twice there)."""
    if isinstance(text, datetime):  # TOML's own date-times
        when = text
    else:
        try:
            when = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
        except ValueError:
            raise CourseError(f"{what}: {text!r} is not a time (write 2025-03-10 23:59, or "
                              "2025-03-10T23:59+01:00)") from None
    if when.tzinfo is not None:
        return when
    if zone is None:
        raise CourseError(f"{what}: {text!s} has no time zone; give an offset "
                          "(+01:00) or set timezone = \"Area/City\" in the deadlines file")
    first, second = when.replace(tzinfo=zone, fold=0), when.replace(tzinfo=zone, fold=1)
    if first.astimezone(timezone.utc).astimezone(zone).replace(tzinfo=None) != when:
        raise CourseError(f"{what}: {text!s} does not exist in {zone.key} (clocks go "
                          "forward); give another time or its offset")
    if first.utcoffset() != second.utcoffset():
        raise CourseError(f"{what}: {text!s} happens twice in {zone.key} (clocks go back); "
                          "give the offset, e.g. +01:00 or +02:00")
    return first


def _policy(table: object, base: Policy, what: str) -> Policy:
    if not isinstance(table, dict):
        raise CourseError(f"{what} must be a table of {', '.join(POLICY_FIELDS)}")
    unknown = set(table) - set(POLICY_FIELDS)
    if unknown:
        raise CourseError(f"{what}: unknown field(s) {', '.join(sorted(unknown))}; known: "
                          f"{', '.join(POLICY_FIELDS)}")
    per = table.get("per", base.per)
    if per not in ("none", "day", "hour"):
        raise CourseError(f"{what}: per = {per!r}: one of \"none\", \"day\", \"hour\"")
    numbers = {}
    for name in ("rate", "cap", "zero_after_days", "zero_after_hours", "grace_minutes"):
        value = table.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise CourseError(f"{what}: {name} = {value!r} must be a number, 0 or more")
        numbers[name] = value
    for name in ("rate", "cap"):
        if numbers[name] is not None and numbers[name] > 1:
            raise CourseError(f"{what}: {name} is a fraction of the score, at most 1")
    zero = base.zero_after
    if numbers["zero_after_days"] is not None:
        zero = timedelta(days=numbers["zero_after_days"])
    if numbers["zero_after_hours"] is not None:
        zero = timedelta(hours=numbers["zero_after_hours"])
    return replace(base, per=per,
                   rate=float(numbers["rate"] if numbers["rate"] is not None else base.rate),
                   cap=float(numbers["cap"] if numbers["cap"] is not None else base.cap),
                   zero_after=zero,
                   grace=timedelta(minutes=numbers["grace_minutes"])
                   if numbers["grace_minutes"] is not None else base.grace)


def parse(text: str, source: str = "deadlines.toml") -> Deadlines:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise CourseError("reading a deadlines file needs Python 3.11 or the package "
                              "tomli") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CourseError(f"{source} is not valid TOML: {error}") from None
    unknown = set(data) - {"timezone", "policy", "lessons", "extensions"}
    if unknown:
        raise CourseError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                          "timezone, policy, lessons, extensions")
    zone = None
    if "timezone" in data:
        try:
            zone = ZoneInfo(str(data["timezone"]))
        except (ZoneInfoNotFoundError, ValueError):
            raise CourseError(f"{source}: timezone = {data['timezone']!r} is no IANA time "
                              "zone (e.g. \"Europe/Berlin\", \"America/New_York\", "
                              "\"UTC\")") from None
    found = Deadlines(zone, _policy(data.get("policy", {}), Policy(), f"{source} [policy]"),
                      source=source)
    lessons = data.get("lessons", {})
    if not isinstance(lessons, dict):
        raise CourseError(f"{source}: [lessons.NAME] tables with due = \"...\"")
    for lesson, entry in lessons.items():
        if not isinstance(entry, dict) or "due" not in entry:
            raise CourseError(f"{source} [lessons.{lesson}] needs due = \"...\"")
        found.due[lesson] = parse_time(entry["due"], zone, f"{source} [lessons.{lesson}] due")
        if "policy" in entry:
            found.policies[lesson] = _policy(entry["policy"], found.policy,
                                             f"{source} [lessons.{lesson}] policy")
    extensions = data.get("extensions", [])
    if not isinstance(extensions, list):
        raise CourseError(f"{source}: extensions are [[extensions]] tables")
    for number, entry in enumerate(extensions, 1):
        what = f"{source} extension {number}"
        if not isinstance(entry, dict) or not entry.get("student") or not entry.get("lesson"):
            raise CourseError(f"{what} needs student = \"...\" and lesson = \"...\"")
        lesson, student = str(entry["lesson"]), str(entry["student"])
        if lesson not in found.due:
            raise CourseError(f"{what}: lesson {lesson!r} has no due date in the file")
        if ("due" in entry) == ("days" in entry):
            raise CourseError(f"{what}: give due = \"...\" or days = N, one of them")
        if "due" in entry:
            when = parse_time(entry["due"], zone, what)
        else:
            days = entry["days"]
            if isinstance(days, bool) or not isinstance(days, (int, float)) or days < 0:
                raise CourseError(f"{what}: days = {days!r} must be a number, 0 or more")
            when = _wall(found.due[lesson], 0) + timedelta(days=days) \
                if float(days) != int(days) else _wall(found.due[lesson], int(days))
        found.extensions[(student, lesson)] = when
    return found


def load(path: Path | None, required: bool = False) -> Deadlines | None:
    """The deadlines file, or None where there is none (no penalties)."""
    if path is None or not path.exists():
        if required and path is not None:
            raise CourseError(f"no deadlines file {path}")
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CourseError(f"cannot read the deadlines file {path}: {error}") from None
    return parse(text, str(path))


# ------------------------------------------------------------------ submission times

def times_file(path: Path, zone: ZoneInfo | None) -> dict[str, float]:
    """The instructor's timestamps file: a CSV with columns ``student_id,submitted_at``."""
    from grader.export import read_csv

    rows = read_csv(path, "timestamps file")
    if rows and not {"student_id", "submitted_at"} <= set(rows[0]):
        raise CourseError(f"the timestamps file {path} needs the columns student_id and "
                          "submitted_at")
    return {row["student_id"]: parse_time(row["submitted_at"], zone,
                                          f"{path}, {row['student_id']}").timestamp()
            for row in rows if row.get("student_id") and row.get("submitted_at")}


def naive_time(value: tuple | str, zone: ZoneInfo | None, what: str) -> float | None:
    """A time with no zone of its own (a zip member's, Blackboard's attempt date) read in
    ``zone``; None where there is no zone to read it in or it is no real time."""
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
        when = datetime(*(int(f or 0) for f in fields), tzinfo=timezone.utc)
    except ValueError:
        return None
    return when.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


# ------------------------------------------------------------------ the table

def _table():
    from grader.ledger import METADATA

    if "ctc_submission_time" in METADATA.tables:
        return METADATA.tables["ctc_submission_time"]
    return Table(
        "ctc_submission_time", METADATA,
        Column("lesson", String(64), primary_key=True),
        Column("student_id", String(128), primary_key=True),
        Column("submitted_at", Float, nullable=True),  # seconds since the epoch; None: unknown
        Column("source", String(200), nullable=False, default=""),
        Column("late_mark", Boolean, nullable=False, default=False),
        Column("recorded_at", Float, nullable=False),
    )


TIMES = _table()


def write_times(db_url: str, lesson: str, rows: dict[str, dict]) -> None:
    """Store (replace) each student's submission time for ``lesson``."""
    from grader.ledger import engine

    TIMES.create(engine(db_url), checkfirst=True)
    with engine(db_url).begin() as connection:
        for student, row in rows.items():
            connection.execute(TIMES.delete().where(
                (TIMES.c.lesson == lesson) & (TIMES.c.student_id == student)))
            connection.execute(TIMES.insert().values(
                lesson=lesson, student_id=student, submitted_at=row.get("submitted_at"),
                source=str(row.get("source", ""))[:200], late_mark=bool(row.get("late_mark")),
                recorded_at=time.time()))


def read_times(db_url: str) -> dict[tuple[str, str], dict]:
    from grader.ledger import engine

    TIMES.create(engine(db_url), checkfirst=True)
    with engine(db_url).connect() as connection:
        return {(row.lesson, row.student_id): {"submitted_at": row.submitted_at,
                                               "source": row.source,
                                               "late_mark": row.late_mark}
                for row in connection.execute(select(TIMES))}
