"""What a deadlines file means for this gradebook: each extension given to the student it names,
the file's warnings, and ``python -m grader deadlines [--check]``.

An extension may name its student by gradebook id, by the LMS's own id (a Gradescope SID where
the gradebook has the e-mail), by e-mail or by name, as instructors have them at hand. One that
names no student graded for its lesson, or several, is a warning and applies to no one: a typo
must never pass in silence, nor give one student another's extension.
"""

from __future__ import annotations

import difflib

from grader.deadlines import Deadlines, Policy
from grader.intake import inert


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
    """The gradebook ids ``text`` names among ``known`` (id -> name, email, lms_id), and how:
    the first of id, LMS id, e-mail, id in another case, name that names anyone."""
    text = text.strip()
    folded = " ".join(text.split()).casefold()
    stages = (
        ("id", lambda sid, person: sid == text),
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


def people(db_url: str) -> dict[str, dict[str, dict]]:
    """lesson -> gradebook id -> name, email, lms_id: every student graded, as their hand-in's
    download named them (for ``Deadlines.resolve``); nothing where no gradebook is readable."""
    from grader import ledger

    try:
        statuses = ledger.read(db_url, None)
    except Exception:  # no gradebook yet, or none readable: extensions stay as written
        return {}
    return {lesson: {student: {k: str((record.get("handin") or {}).get(k) or "")
                               for k in ("name", "email", "lms_id")}
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
