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

The submission time (grader/intake/handins.py, course.autograde) is the fact stored beside the
grade, in the table ``ctc_submission_time``; the penalty is computed from it and the file as
it stands whenever grades are read (export, report, feedback, review), so that an extension
granted after grading counts without grading again. A submission with no known time pays no
penalty, and the report says so. A Canvas ``LATE_`` mark with no time costs what one second
late costs (one period, or nothing within a grace or an extension: the least a late hand-in can
be), unless a timestamps file gives the time.

Every value is checked when the file is read, by every command (``python -m grader deadlines
--check`` shows it all): a bad value is an error that says what to write, and what reads as a
mistake (a lesson the course does not have, an extension for a student no one graded) is a
warning. An extension names its student by gradebook id, the LMS's id, e-mail or name
(``resolve``, with the students of the gradebook).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from grader.common.errors import CourseError
from grader.common.text import inert
from grader.content.lessons import LESSON_NAME, NOTEBOOKS
from grader.intake.times import LAST_YEAR, parse_time, plausible

POLICY_FIELDS = ("per", "rate", "cap", "zero_after_days", "zero_after_hours", "grace_minutes")
LESSON_FIELDS = ("due", "policy")
EXTENSION_FIELDS = ("student", "lesson", "due", "days")
MAX_DAYS = 3660
ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+){0,2}")  # IANA: Area/City


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
    extensions: dict[tuple[str, str], datetime] = field(default_factory=dict)  # (id, lesson)
    source: str = ""
    requested: list[tuple[int, str, str, datetime]] = field(default_factory=list)  # as written
    file_warnings: list[str] = field(default_factory=list)  # what reads as a mistake
    warnings: list[str] = field(default_factory=list)  # file_warnings and resolve's
    given: dict[int, str] = field(default_factory=dict)  # extension number -> gradebook id
    unchecked: set[int] = field(default_factory=set)  # extensions of lessons no one is graded for

    def judge(self, lesson: str, student: str, submitted: float | None, source: str,
              late_mark: bool = False) -> Late:
        """The penalty of one submission of ``lesson`` handed in at ``submitted`` (seconds
        since the epoch; None: unknown). ``late_mark``: the LMS marked it late, against the
        LMS's own due date, with no time: it costs what one second late costs, which is
        nothing within a grace or an extension."""
        due = self.extensions.get((student, lesson), self.due.get(lesson))
        extended = (student, lesson) in self.extensions
        if submitted is not None and not plausible(submitted):
            submitted, source = None, f"{source} (a time out of range: ignored)"
        if due is None:
            return Late(None, _utc(submitted), source, note="no due date for this lesson")
        policy = self.policies.get(lesson, self.policy)
        if submitted is None:
            if not late_mark:
                return Late(due, None, source, 0.0, 0, extended,
                            "no submission time: no penalty")
            if extended:
                return Late(due, None, source, 0.0, 0, extended,
                            "marked late by the LMS (against its own due date), time unknown; "
                            "an extension applies here: no penalty")
            fraction = penalty_fraction(policy, due, _elapsed(due, timedelta(seconds=1)))[0]
            if fraction:
                return Late(due, None, source, fraction, 1, extended,
                            "marked late by the LMS, time unknown: charged as one period late"
                            f" (-{fraction:.0%})")
            why = (f"it may lie within the {policy.grace.total_seconds() / 60:g}-minute grace"
                   if policy.grace else "one period late costs nothing under this policy")
            return Late(due, None, source, 0.0, 0, extended,
                        f"marked late by the LMS, time unknown: no penalty ({why})")
        when = datetime.fromtimestamp(submitted, UTC)
        fraction, periods = penalty_fraction(policy, due, when)
        note = "on time" if not periods and not fraction else (
            f"{_span(when - due)} late: " + (f"-{fraction:.0%}" if fraction else "no penalty"))
        return Late(due, when, source, fraction, periods, extended, note)

    def resolve(self, people: dict[str, dict[str, dict]]) -> None:
        """Give each extension to the student it names, among ``people`` (lesson -> gradebook
        id -> ``name``, ``email``, ``lms_id``): grader/gradebook/deadlines_check.py."""
        resolve(self, people)


def penalty_fraction(policy: Policy, due: datetime, submitted: datetime) -> tuple[float, int]:
    """(fraction of the earned score lost, periods late) for a submission at ``submitted``;
    both aware datetimes. Days are calendar days in the due time's zone. Within the grace a
    submission is on time; past it, lateness counts from the due time."""
    submitted = submitted.astimezone(UTC)  # compared as instants (see late_periods)
    if submitted <= _elapsed(due, policy.grace).astimezone(UTC):
        return 0.0, 0
    if policy.zero_after is not None and submitted > _cut_off(
            due, policy.zero_after).astimezone(UTC):
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
    utc_due, submitted = due.astimezone(UTC), submitted.astimezone(UTC)
    if submitted <= utc_due:
        return 0
    if per == "hour":
        return math.ceil((submitted - utc_due).total_seconds() / 3600)
    local = submitted.astimezone(due.tzinfo)
    # The k-th day late ends at the due time's wall-clock time k dates later: 23 or 25 hours
    # for a day across a daylight-saving change.
    days = max(0, (local.date() - due.date()).days - 1)
    while _wall(due, days).astimezone(UTC) < submitted:
        days += 1
    return max(days, 1)


def _elapsed(due: datetime, delta: timedelta) -> datetime:
    """``due`` plus elapsed time (Python's aware + timedelta is wall-clock arithmetic)."""
    return (due.astimezone(UTC) + delta).astimezone(due.tzinfo)


def _cut_off(due: datetime, delta: timedelta) -> datetime:
    """A cut-off of whole days is calendar days in the due time's zone; else elapsed time."""
    if delta.seconds == 0 and delta.microseconds == 0:
        return _wall(due, delta.days)
    return _elapsed(due, delta)


def _wall(due: datetime, days: int) -> datetime:
    """The due time's wall-clock time ``days`` dates later, as an instant."""
    moved = (due.replace(tzinfo=None) + timedelta(days=days)).replace(tzinfo=due.tzinfo)
    if due.tzinfo is UTC or not isinstance(due.tzinfo, ZoneInfo):
        return moved
    return moved.astimezone(UTC).astimezone(due.tzinfo)


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    return (f"{days} d " if days else "") + f"{hours} h {rest // 60} min"


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


# ------------------------------------------------------------------ reading the file


def _number(value: object, what: str, most: int) -> float:
    """A number of the file, 0 to ``most``, or an error that says what to write."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or not 0 <= value <= most:
        raise CourseError(f"{what} = {inert(repr(value), 60)} must be a number from 0 to "
                          f"{most:,}")
    return float(value)


def _policy(table: object, base: Policy, what: str) -> Policy:
    if not isinstance(table, dict):
        raise CourseError(f"{what} must be a table of {', '.join(POLICY_FIELDS)}")
    unknown = set(table) - set(POLICY_FIELDS)
    if unknown:
        raise CourseError(f"{what}: unknown field(s) {inert(', '.join(sorted(unknown)), 200)}; "
                          f"known: {', '.join(POLICY_FIELDS)}")
    per = table.get("per", base.per)
    if per not in ("none", "day", "hour"):
        raise CourseError(f"{what}: per = {inert(repr(per), 60)}: one of \"none\", \"day\", "
                          "\"hour\"")
    most = {"rate": 1, "cap": 1, "zero_after_days": MAX_DAYS, "zero_after_hours": MAX_DAYS * 24,
            "grace_minutes": MAX_DAYS * 1440}
    numbers = {name: None if table.get(name) is None else _number(
        table[name], f"{what}: {name}", most[name]) for name in most}
    zero = base.zero_after
    if numbers["zero_after_days"] is not None:
        zero = timedelta(days=numbers["zero_after_days"])
    if numbers["zero_after_hours"] is not None:
        zero = timedelta(hours=numbers["zero_after_hours"])
    return replace(base, per=per,
                   rate=numbers["rate"] if numbers["rate"] is not None else base.rate,
                   cap=numbers["cap"] if numbers["cap"] is not None else base.cap,
                   zero_after=zero,
                   grace=timedelta(minutes=numbers["grace_minutes"])
                   if numbers["grace_minutes"] is not None else base.grace)


def _zone(value: object, source: str) -> ZoneInfo:
    example = "(e.g. \"Europe/Berlin\", \"America/New_York\", \"UTC\")"
    if not isinstance(value, str) or len(value) > 64 or not ZONE_NAME.fullmatch(value):
        raise CourseError(f"{source}: timezone = {inert(repr(value), 80)} is no IANA time zone "
                          f"name {example}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # "Europe" is a folder of zones
        raise CourseError(f"{source}: timezone = {value!r} is no IANA time zone {example}"
                          ) from None


def parse(text: str, source: str = "deadlines.toml") -> Deadlines:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CourseError(f"{source} is not valid TOML: {inert(str(error), 300)}") from None
    unknown = set(data) - {"timezone", "policy", "lessons", "extensions"}
    if unknown:
        raise CourseError(f"{source}: unknown key(s) {inert(', '.join(sorted(unknown)), 200)}; "
                          "known: timezone, policy, lessons, extensions")
    zone = _zone(data["timezone"], source) if "timezone" in data else None
    found = Deadlines(zone, _policy(data.get("policy", {}), Policy(), f"{source} [policy]"),
                      source=source)
    lessons = data.get("lessons", {})
    if not isinstance(lessons, dict):
        raise CourseError(f"{source}: [lessons.NAME] tables with due = \"...\"")
    for lesson, entry in lessons.items():
        where = f"{source} [lessons.{inert(lesson, 80)}]"
        if not isinstance(entry, dict) or "due" not in entry:
            raise CourseError(f"{where} needs due = \"...\"")
        extra = set(entry) - set(LESSON_FIELDS)
        if extra:
            raise CourseError(f"{where}: unknown key(s) {inert(', '.join(sorted(extra)), 200)};"
                              " known: due, policy")
        found.due[lesson] = parse_time(entry["due"], zone, f"{where} due")
        if "policy" in entry:
            found.policies[lesson] = _policy(entry["policy"], found.policy, f"{where} policy")
        if not (LESSON_NAME.match(lesson) and (NOTEBOOKS / lesson).is_dir()):
            known = sorted(p.name for p in NOTEBOOKS.iterdir() if LESSON_NAME.match(p.name))
            near = difflib.get_close_matches(lesson, known, n=1, cutoff=0.6)
            found.file_warnings.append(
                f"{where}: the course has no lesson {inert(lesson, 80)!r}, so this due date "
                "applies to nothing" + (f" (did you mean {near[0]}?)" if near else
                                        f"; the lessons are {', '.join(known)}"))
    extensions = data.get("extensions", [])
    if not isinstance(extensions, list):
        raise CourseError(f"{source}: extensions are [[extensions]] tables")
    for number, entry in enumerate(extensions, 1):
        what = f"{source} extension {number}"
        if not isinstance(entry, dict) or not isinstance(entry.get("student"), (str, int)) \
                or isinstance(entry.get("student"), bool) or not str(entry["student"]).strip() \
                or not isinstance(entry.get("lesson"), str) or not entry["lesson"]:
            raise CourseError(f"{what} needs student = \"...\" (the student's id, LMS id, "
                              "e-mail or name) and lesson = \"...\"")
        extra = set(entry) - set(EXTENSION_FIELDS)
        if extra:
            raise CourseError(f"{what}: unknown key(s) {inert(', '.join(sorted(extra)), 200)}; "
                              f"known: {', '.join(EXTENSION_FIELDS)}")
        lesson, student = entry["lesson"], str(entry["student"]).strip()
        if lesson not in found.due:
            raise CourseError(f"{what}: lesson {inert(lesson, 80)!r} has no due date in the "
                              "file")
        if ("due" in entry) == ("days" in entry):
            raise CourseError(f"{what}: give due = \"...\" or days = N, one of them")
        if "due" in entry:
            when = parse_time(entry["due"], zone, what)
        else:
            days = _number(entry["days"], f"{what}: days", MAX_DAYS)
            try:
                when = _wall(found.due[lesson], int(days)) if days == int(days) else \
                    _elapsed(found.due[lesson], timedelta(days=days))
            except OverflowError:
                when = None
            if when is None or when.year > LAST_YEAR:
                raise CourseError(f"{what}: days = {days:g} goes past the year {LAST_YEAR}")
        found.requested.append((number, student, lesson, when))
    found.resolve({})
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


def times_file(path: Path, zone: ZoneInfo | None) -> dict[str, tuple[float, str]]:
    """The instructor's timestamps file: student id -> (seconds since the epoch, source). Our
    CSV ``student_id,submitted_at``, Moodle's grading worksheet or Canvas's submissions JSON
    (grader/intake/times.py)."""
    from grader.intake import times as handin_times

    return handin_times.read(path, zone)


# ------------------------------------------------------------------ extensions

def resolve(deadlines: Deadlines, people: dict[str, dict[str, dict]]) -> None:
    """Give each extension to the student it names, among ``people`` (lesson -> gradebook
    id -> ``name``, ``email``, ``lms_id``: the students graded): by gradebook id, the LMS's
    id (a Gradescope SID where the gradebook has the e-mail), e-mail, the id in another
    case, or name. What names no one, or several, is a warning and applies to no one. A
    lesson no one is graded for yet keeps the extension as written (an id)."""
    deadlines.extensions, deadlines.given, deadlines.unchecked = {}, {}, set()
    said: list[str] = []
    for number, student, lesson, when in deadlines.requested:
        what = f"{deadlines.source} extension {number} (student = {inert(student, 80)!r})"
        known = people.get(lesson)
        if not known:
            target = student
            deadlines.unchecked.add(number)
        else:
            matches, how = match_student(student, known)
            if len(matches) > 1:
                said.append(f"{what}: names {len(matches)} students of {lesson} ("
                             + inert(", ".join(sorted(matches)[:5]), 200) + "); write the "
                             "student's id: it applies to none of them")
                continue
            if not matches:
                near = difflib.get_close_matches(student, [
                    v for sid, person in known.items()
                    for v in (sid, person.get("email", ""), person.get("name", "")) if v],
                    n=3, cutoff=0.6)
                said.append(f"{what}: no student graded for {lesson} has this id, LMS id, "
                             "e-mail or name, so it applies to no one"
                             + (" (did you mean " + inert(", ".join(near), 200) + "?)"
                                if near else ""))
                continue
            (target,) = matches
            if how == "case":
                said.append(f"{what}: no student {inert(student, 80)!r} in {lesson}; read "
                             f"as {inert(target, 80)!r} (ids are case-sensitive: write it so)")
        if (target, lesson) in deadlines.extensions:
            said.append(f"{what}: {inert(target, 80)} has an earlier extension for {lesson};"
                         " this later one counts")
        deadlines.extensions[(target, lesson)] = when
        deadlines.given[number] = target
    deadlines.warnings = [*deadlines.file_warnings, *said]


def match_student(text: str, known: dict[str, dict]) -> tuple[list[str], str]:
    """The gradebook ids ``text`` names among ``known`` (id -> name, email, lms_id, course_id),
    and how: the first of id, course id (the roster's), LMS id, e-mail, id in another case,
    name that names anyone."""
    text = text.strip()
    folded = " ".join(text.split()).casefold()
    stages = (
        ("id", lambda sid, person: sid == text),
        ("course id", lambda sid, person: bool(text) and (
            str(person.get("course_id", "")) == text or ("@" in text
            and str(person.get("course_id", "")).casefold() == folded))),
        ("lms_id", lambda sid, person: bool(text) and person.get("lms_id") == text),
        ("email", lambda sid, person: "@" in text
         and str(person.get("email", "")).strip().casefold() == folded),
        ("case", lambda sid, person: sid.casefold() == folded),
        ("name", lambda sid, person: bool(folded)
         and " ".join(str(person.get("name", "")).split()).casefold() == folded),
    )
    for how, test in stages:
        matches = [sid for sid, person in known.items() if test(sid, person)]
        if matches:
            return matches, how
    return [], ""
