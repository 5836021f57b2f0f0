"""One identity per student: the course roster, and the course id each hand-in stands for.

A student works under one id, their *course id*: the id they give the lab (their hub user name,
institutional login or e-mail, as the instructor chose), for which their numbers are drawn
(grader/content/variants.py). An LMS names the same student otherwise: Canvas by a user id,
Moodle by a participant id that each assignment makes anew, Gradescope by a SID or an e-mail,
Blackboard by a username. The roster (``python -m grader roster FILE``: our CSV, Canvas's
gradebook export, Moodle's grading worksheet, read by grader/intake/rosters.py) maps each of
those ids to the course id, in the gradebook's database (``ctc_roster``), beside the grades:
every coordinator sharing the database reads the same one.

A hand-in's course id is the roster's, whatever layout it came in. Without a roster row, the
id a student could know stands: a folder's name, a Blackboard username, a Gradescope SID or
e-mail. Canvas's user ids and Moodle's participant ids are no id a student knows: for a lesson
whose graded predictions vary, a Canvas or Moodle download with no hand-in on the roster is
refused, saying which file to give; a hand-in missing from it is graded on its LMS id's numbers
and flagged. An id the roster gives two students is never guessed between: flagged. The
gradebook keeps the LMS's ids (so that exports find each student as the LMS knows them); the
course id is kept with each hand-in (``course_id`` in its record).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select

from grader.common.errors import CourseError
from grader.common.text import inert, valid_student_id
from grader.content.variants import canonical
from grader.gradebook import ledger
from grader.intake.rosters import GENERIC, Person

# The kinds of id a folder's name, a Blackboard username or a Gradescope SID may be.
ANY_ID = ("course", *GENERIC)


@dataclass
class Roster:
    """The course's roster as stored: (kind, value) -> course id, and each course id's name
    and e-mail."""

    ids: dict[tuple[str, str], str] = field(default_factory=dict)
    people: dict[str, dict[str, str]] = field(default_factory=dict)
    sources: dict[tuple[str, str], str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.people)

    def _any(self, value: str) -> set[str]:
        return {owner for kind in ANY_ID
                if (owner := self.ids.get((kind, _norm(kind, value)))) is not None}

    def find(self, layout: str, lms_id: str, email: str, lesson: str) -> tuple[set[str], str]:
        """The course ids a hand-in's LMS id (and e-mail) may stand for, and how it was
        looked up ("Moodle participant 5001 of 01_float_formats")."""
        if layout == "canvas":
            owner = self.ids.get(("canvas", lms_id))
            return ({owner} if owner else set()), f"Canvas user {lms_id}"
        if layout == "moodle":
            owner = self.ids.get((f"moodle:{lesson}", lms_id))
            return ({owner} if owner else set()), f"Moodle participant {lms_id} of {lesson}"
        found = self._any(lms_id)
        if not found and email:
            found = self._any(email)
        return found, {"gradescope": "Gradescope SID", "blackboard": "Blackboard username"}.get(
            layout, "folder") + f" {lms_id}"


def _norm(kind: str, value: str) -> str:
    return value.strip().casefold() if kind == "email" else value.strip()


def read_roster(db_url: str) -> Roster:
    """The stored roster (empty where none was given)."""
    roster = Roster()
    table = ledger.ROSTER
    with ledger.engine(db_url).connect() as connection:
        for row in connection.execute(select(table)):
            roster.ids[(row.kind, row.value)] = row.course_id
            roster.sources[(row.kind, row.value)] = row.source
            roster.people.setdefault(row.course_id, {"name": row.name, "email": row.email})
    return roster


def store_roster(db_url: str, people: list[Person], replace: bool = False) -> tuple[int, int]:
    """Add ``people`` to the stored roster in one transaction, or with ``replace`` put them in
    its place. A Moodle worksheet lists every participant of its assignment: the lesson's
    participant ids it gives replace the ones stored (a worksheet given for the wrong lesson
    is mended by giving the right one). Refused, with the rows named, where an id would stand
    for two students, or a student would get a second id of one kind: nothing is stored then.
    Returns (students new or with new ids, ids added)."""
    table = ledger.ROSTER
    current = Roster() if replace else read_roster(db_url)
    renewed = {kind for person in people for kind, _ in person.ids if kind.startswith("moodle:")}
    current.ids = {k: v for k, v in current.ids.items() if k[0] not in renewed}
    owner = dict(current.ids)
    sources = dict(current.sources)
    held: dict[tuple[str, str], set[str]] = {}  # (course id, kind) -> values
    for (kind, value), course_id in owner.items():
        held.setdefault((course_id, kind), set()).add(value)
    rows, changed = [], set()
    for person in people:
        pairs = [("course", person.course_id), *person.ids]
        for kind, raw in pairs:
            value = _norm(kind, raw)
            other = owner.get((kind, value))
            if other is not None and other != person.course_id:
                raise CourseError(
                    f"the roster would give {_said(kind, value)} to two students: "
                    f"{inert(other, 60)!r} ({sources.get((kind, value), 'stored earlier')}) and "
                    f"{inert(person.course_id, 60)!r} ({person.where}): correct the file (or "
                    "give the whole roster again with --replace)")
            values = held.setdefault((person.course_id, kind), set())
            if kind != "course" and values and value not in values:
                raise CourseError(
                    f"{inert(person.course_id, 60)!r} would have two ids of one kind: "
                    f"{_said(kind, sorted(values)[0])} and {inert(value, 60)!r} "
                    f"({person.where}): correct the file (or give the whole roster again with "
                    "--replace)")
            if other is None:
                owner[(kind, value)] = person.course_id
                sources[(kind, value)] = person.where
                values.add(value)
                rows.append({"kind": kind, "value": value, "course_id": person.course_id,
                             "name": person.name, "email": person.email,
                             "source": person.where[:500], "added_at": time.time()})
                changed.add(person.course_id)
    with ledger.engine(db_url).begin() as connection:
        if replace:
            connection.execute(table.delete())
        for kind in renewed:
            connection.execute(table.delete().where(table.c.kind == kind))
        for row in rows:
            connection.execute(table.insert().values(**row))
    return len(changed), len(rows)


def _said(kind: str, value: str) -> str:
    name = {"canvas": "the Canvas user id", "course": "the course id", "email": "the e-mail",
            "username": "the username", "sis_user_id": "the SIS user id",
            "sis_login_id": "the SIS login id", "id_number": "the ID number"}.get(
                kind, f"the Moodle participant id of {kind.partition(':')[2]}"
                if kind.startswith("moodle:") else kind)
    return f"{name} {inert(value, 60)!r}" if value else name


# ------------------------------------------------------------------ hand-ins

MAPPED_ONLY = ("canvas", "moodle")  # layouts whose ids no student knows


def unmappable_fix(layout: str, lesson: str, anonymous: bool) -> str:
    """What to do about a Canvas or Moodle download whose ids the roster does not map."""
    if anonymous:
        return ("Canvas's anonymous grading names each hand-in by an anonymous id, which no "
                "roster maps to a student: post the assignment's grades (or turn anonymous "
                "grading off), download the submissions again, and give Canvas's gradebook "
                "export with  python -m grader roster GRADEBOOK.csv")
    if layout == "moodle":
        return ("a Moodle download names each student by a participant id of the assignment, "
                "which no student knows: give the assignment's grading worksheet first "
                "(View all submissions > Grading action > Download grading worksheet), with  "
                f"python -m grader roster WORKSHEET.csv --lesson {lesson}")
    return ("a Canvas download names each student by Canvas's user id, which no student knows: "
            "give Canvas's gradebook export first (Grades > Export), with  python -m grader "
            "roster GRADEBOOK.csv  (the course id: its SIS Login ID, or --course-id)")


def identify(course, lesson: str, layout: str, handins: list, varies: bool) -> None:
    """Give each hand-in its course id (``handin.course_id``) and, for a group, its members'
    (``handin.group``). ``varies``: the lesson's predictions are drawn per student, so a
    student's numbers depend on it: a Canvas or Moodle download that the roster does not map
    is refused, and a hand-in it cannot map, or maps two ways, is flagged (``handin.identity``:
    asked again at each grading, never kept as the hand-in's own flag)."""
    roster = read_roster(course.db_url) if course.has_gradebook() else Roster()
    missing, found_any = [], False
    for handin in handins:
        handin.identity = []
        lms_id = handin.lms_id or handin.student_id
        owners, how = roster.find(layout, lms_id, handin.email, lesson)
        if len(owners) == 1:
            owner = next(iter(owners))
            handin.course_id, found_any = canonical(owner), True
            person = roster.people.get(owner) or {}
            # the roster's name ("Lovelace, Ada"), where a download has a squashed one
            # ("lovelaceada", Canvas's) or none; its e-mail where the download gives none
            if person.get("name"):
                handin.name = inert(str(person["name"]), 200)
            if person.get("email") and not handin.email:
                handin.email = str(person["email"])
            continue
        handin.course_id = canonical(handin.student_id)
        if len(owners) > 1:
            if varies:
                handin.identity.append(
                    f"the roster gives {inert(how, 80)} to {len(owners)} students ("
                    + inert(", ".join(sorted(owners)), 200) + "): graded on the numbers of "
                    f"{inert(handin.student_id, 60)}; correct the roster and regrade")
            continue
        if layout in MAPPED_ONLY and valid_student_id(handin.student_id):
            missing.append(handin)
        elif roster and layout not in MAPPED_ONLY:
            handin.remarks.append("not on the course roster: its numbers are drawn for "
                                  f"{inert(handin.student_id, 60)}")
    if varies and missing:
        anonymous = any(h.student_id.startswith("anon_") for h in missing)
        if not found_any:
            raise CourseError(f"{lesson}'s graded predictions ask each student about numbers "
                              "of their own, drawn for the id they work under. "
                              + unmappable_fix(layout, lesson, anonymous))
        for handin in missing:
            handin.identity.append(
                f"not on the course roster ({inert(layout.capitalize(), 20)} id "
                f"{inert(handin.student_id, 60)}): graded on numbers no student knows; add the "
                "student (python -m grader roster FILE) and regrade")
    members: dict[str, list] = {}
    for handin in handins:
        if layout == "gradescope" and handin.download_name:
            members.setdefault(handin.download_name, []).append(handin)
    for group in members.values():
        if len(group) > 1:
            ids = sorted({h.course_id for h in group})
            for handin in group:
                handin.group = ids
    _one_hand_in_per_id(handins, varies)


def _one_hand_in_per_id(handins: list, varies: bool) -> None:
    """Two hand-ins of one download that stand for one course id (outside one group): two
    people under one id (a SID a student typed as a classmate's), never merged: both are
    flagged, each graded on that id's numbers."""
    if not varies:
        return
    by_id: dict[str, list] = {}
    for handin in handins:
        by_id.setdefault(handin.course_id, []).append(handin)
    for course_id, own in by_id.items():
        if len({h.download_name or h.student_id for h in own}) > 1 and not all(
                h.group and course_id in h.group for h in own):
            others = sorted(h.student_id for h in own)
            for handin in own:
                handin.identity.append(
                    f"{len(own)} hand-ins of this download stand for the course id "
                    f"{inert(course_id, 60)!r} ({inert(', '.join(others), 200)}): two people "
                    "under one id? each is graded on that id's numbers; look at both")


def identify_handins(course, lesson, layout: str, handins: list, stored: dict[str, dict],
                     varies: bool, regrade: bool) -> None:
    """Each hand-in's course id and group; a regrade's (``regrade``) as its first download came
    (``stored``: the stored record of each hand-in), with the roster as it is now. A new
    hand-in under an id whose stored grade came from another download for someone else (a
    Gradescope SID typed as a classmate's folder name) is flagged: never merged."""
    by_layout: dict[str, list] = {}
    kept = stored if regrade else {}
    for handin in handins:
        record = kept.get(handin.student_id) or {}
        if record:
            handin.lms_id = str(record.get("lms_id") or handin.lms_id)
            handin.email = str(record.get("email") or handin.email)
            handin.download_name = str(record.get("download_name") or handin.download_name)
        by_layout.setdefault(str(record.get("from") or layout), []).append(handin)
    for where, own in by_layout.items():
        identify(course, lesson.name, where, own, varies)
    for handin in handins:
        group = (kept.get(handin.student_id) or {}).get("group")
        if not handin.group and isinstance(group, list) and len(group) > 1:
            handin.group = [str(g) for g in group if isinstance(g, str)]
        earlier = stored.get(handin.student_id) or {}
        if regrade or not varies or earlier.get("from") in (None, layout):
            continue
        was = str(earlier.get("email") or earlier.get("name") or "").casefold()
        now = str(handin.email or handin.name).casefold()
        if was and now and was != now:
            handin.identity.append(
                f"its id {inert(handin.student_id, 60)!r} was graded before from another "
                f"download ({inert(earlier.get('from'), 20)}, for "
                f"{inert(earlier.get('name') or earlier.get('email'), 60)}): two people under "
                "one id? this grade replaces that one; look at both")


def draw_student(handin_record: dict, student_id: str, notebook, key: bytes | None,
                 lesson) -> tuple[str, str]:
    """Whose numbers a hand-in is graded on: its student's course id; for a group's hand-in,
    the member whose numbers the notebook records it was worked on (the one most of its
    variant cells name), else its own, with a reason to look where that can cost a member: a
    group's notebook whose outputs were cleared and that answers a graded prediction drawn
    apart for its members under the course's ``key`` (a blank notebook, or members who drew
    alike, lose nothing to the draw)."""
    own = str(handin_record.get("course_id") or canonical(student_id))
    group = handin_record.get("group") or []
    if len(group) < 2:
        return own, ""
    from collections import Counter

    import nbformat

    from grader.grading.autograde import recorded_variants

    try:
        nb = nbformat.read(notebook, as_version=4)
        recorded = [canonical(student) for _, student, _, _ in recorded_variants(nb)
                    if student]
    except Exception:  # an unreadable notebook: grading says so
        return own, ""
    named = Counter(student for student in recorded if student in group)
    if named:
        return named.most_common(1)[0][0], ""
    if recorded:  # worked for someone outside the group: grading says so, naming them
        return own, ""
    if key is None or not _drawn_apart(key, lesson, group, nb):
        return own, ""
    return own, ("a group's hand-in (" + inert(", ".join(group), 200) + ") whose notebook "
                 "records no member's numbers (its outputs cleared?): each member is graded on "
                 "their own numbers; look at the prediction")


def _drawn_apart(key: bytes, lesson, group: list[str], nb) -> bool:
    """Whether ``nb`` answers a graded prediction of ``lesson`` drawn differently for the
    members of ``group``."""
    from grader.content.variants import lesson_draw
    from grader.grading.probe import exercises, unattempted

    draws = [lesson_draw(key, lesson, member).variants for member in group]
    apart = {name for name in draws[0] if len({d.get(name) for d in draws}) > 1}
    return any(e.prediction and e.name in apart and not unattempted(nb, e)
               for e in exercises(lesson))


def course_ids(course) -> list[str]:
    """Every course id of the stored roster, in order."""
    if not course.has_gradebook():
        return []
    return sorted(read_roster(course.db_url).people)


def roster_command(course, files: list, lesson: str | None, course_id: str | None,
                   replace: bool) -> None:
    """``python -m grader roster``: add each file's students to the course roster (or, with
    ``replace``, put them in its place), then say what it holds; without files, list it."""
    from grader.intake.rosters import read_people

    if files:
        people, left_out = [], []
        for path in files:
            found, skipped = read_people(path, course_id, lesson)
            people += found
            left_out += [f"{path.name} {line}" for line in skipped]
        students, ids = store_roster(course.db_url, people, replace)
        course.log(f"roster: {len(people)} student(s) read from {len(files)} file(s); "
                   f"{students} new or with new ids, {ids} id(s) added"
                   + (" (the roster replaced)" if replace else ""))
        if left_out:
            course.log(f"left out, with no course id ({len(left_out)}: a test student, or "
                       "choose another column with --course-id): "
                       + inert("; ".join(left_out[:20]), 2000))
    elif replace or lesson or course_id:
        raise CourseError("--replace, --lesson and --course-id go with the roster FILE(s) they "
                          "read: python -m grader roster FILE ...")
    roster = read_roster(course.db_url) if course.has_gradebook() else Roster()
    if not roster:
        course.log("the course roster is empty: give one with  python -m grader roster FILE  "
                   "(our CSV student_id,..., Canvas's gradebook export, or a Moodle grading "
                   "worksheet with --lesson LESSON; docs/lms.md)")
        return
    by_person: dict[str, list[str]] = {}
    for (kind, value), owner in sorted(roster.ids.items()):
        if kind != "course":
            by_person.setdefault(owner, []).append(f"{kind}={value}")
    lines = [f"{len(roster.people)} student(s) on the course roster (course id, name: the "
             "LMS ids that stand for them):"]
    for person, info in sorted(roster.people.items()):
        name = f" ({inert(info.get('name', ''), 60)})" if info.get("name") else ""
        lines.append(f"  {inert(person, 100)}{name}: "
                     + inert(", ".join(by_person.get(person, [])) or "-", 500))
    course.log("\n".join(lines))

