"""What a deadlines file means for this gradebook: each extension given to the student it names,
the file's warnings, and ``python -m grader deadlines [--check]``.

An extension may name its student by gradebook id, by the LMS's own id (a Gradescope SID where
the gradebook has the e-mail), by e-mail or by name, as instructors have them at hand. One that
names no student graded for its lesson, or several, is a warning and applies to no one: a typo
must never pass in silence, nor give one student another's extension.
"""

from __future__ import annotations

from pathlib import Path

from grader.common.text import inert
from grader.gradebook.deadlines import Deadlines, Policy, load


def people(db_url: str) -> dict[str, dict[str, dict]]:
    """lesson -> gradebook id -> name, email, lms_id, course_id: every student graded, as their
    hand-in's
    download named them (for ``Deadlines.resolve``); nothing where no gradebook is readable."""
    from grader.gradebook import ledger

    try:
        statuses = ledger.read(db_url, None)
    except Exception:  # no gradebook yet, or none readable: extensions stay as written
        return {}
    return {lesson: {student: {k: str((record.get("handin") or {}).get(k) or "")
                               for k in ("name", "email", "lms_id", "course_id")}
                     for student, record in students.items()}
            for lesson, students in statuses.items()}


def show(course, check: bool = False) -> int:
    """``python -m grader deadlines [--check]``: the file as every command reads it (the
    warnings are said by ``course.deadlines``). Exit status 1 with ``check`` and a warning."""
    found = course.deadlines()
    if found is None:
        course.log(f"no deadlines file {course.deadlines_file}: no late penalty for anyone")
        return 0
    lines = [f"{found.source}: read",
             f"  timezone: {found.zone.key if found.zone else '(none: every time has its offset)'}",
             f"  policy: {_described(found.policy)}"]
    for lesson, due in sorted(found.due.items()):
        own = found.policies.get(lesson)
        lines.append(f"  {inert(lesson, 80)}: due {due.isoformat(timespec='minutes')}"
                     + (f"; its policy: {_described(own)}" if own else ""))
    for number, student, lesson, when in found.requested:
        target = found.given.get(number)
        lines.append(f"  extension {number}: {inert(student, 80)!r}, {inert(lesson, 80)}: due "
                     f"{when.isoformat(timespec='minutes')} -> "
                     + ("applies to no one" if target is None else inert(target, 80))
                     + (f" (not checked: no one is graded for {inert(lesson, 80)} yet)"
                        if number in found.unchecked else ""))
    lines.append(f"  warnings: {len(found.warnings)}")
    course.log("\n".join(lines))
    return 1 if check and found.warnings else 0


def _described(policy: Policy) -> str:
    grace = policy.grace.total_seconds() / 60
    return policy.describe() + (f"; {grace:g} minutes' grace" if grace else "")


def for_gradebook(path: Path | None, db_url: str, required: bool = False) -> Deadlines | None:
    """``load``, with each extension given to the student of the gradebook it names."""
    found = load(path, required)
    if found is not None:
        found.resolve(people(db_url))
    return found


def not_yet_due(deadlines: Deadlines | None, lesson: str, now: float) -> list[str]:
    """Whose ``lesson`` is not yet due at ``now`` (seconds since the epoch): everyone before the
    due date, then each student with an extension still running (as the file names them,
    handed in or not). A feedback page gives its student's answers, and a classmate who drew
    the same numbers could still use them. Nothing where the lesson has no due date."""
    from datetime import UTC, datetime

    if deadlines is None or lesson not in deadlines.due:
        return []
    at = datetime.fromtimestamp(now, UTC)
    found = []
    if at < deadlines.due[lesson]:
        found.append(f"everyone (due {deadlines.due[lesson].isoformat(timespec='minutes')})")
    for _, student, ext_lesson, when in deadlines.requested:
        if ext_lesson == lesson and at < when:
            found.append(f"{inert(student, 80)} (extended to {when.isoformat(timespec='minutes')})")
    return found
