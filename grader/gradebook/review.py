"""``python -m grader review``: the instructor's decisions on what the grader computed.

Every decision is a row of the review log (``ctc_review_log``, beside nbgrader's tables: see
grader/gradebook/ledger.py), with who made it and when, never changed afterwards. What is in force
for a
student is what replaying their rows in order gives:

- ``accept``: the computed score stands; the flag is resolved. ``accept_all`` accepts every
  open flag of a lesson whose every reason is the one expected (a notebook the browser renamed).
- ``set`` EXERCISE: that exercise scores the points given. Written into nbgrader's gradebook as
  the grade's ``manual_score`` (nbgrader's own field for a human's score, which its totals,
  formgrader and ``nbgrader export`` read); the grader's ``auto_score`` is kept beside it.
- ``total``: the lesson scores the points given, whatever its exercises add up to.
- ``clear`` EXERCISE, ``clear-total``: back to the computed score.
- ``note``: a comment for the student, with no change of score.
- ``discard``: ``autograde --discard-overrides`` (or ``review --regrade --discard-overrides``)
  dropped every decision before it.
- ``regrade``: a record that the student was graded again from the stored notebook.

A decision that sets or accepts a score resolves a ``needs_review`` or ``invalid`` flag: the
export then says ``graded`` and names the decision. Grading a student again keeps the decisions
in force (and re-applies them to the gradebook) unless told to discard them.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.text import exercise_width, inert, valid_student_id
from grader.content.lessons import Lesson
from grader.gradebook import ledger
from grader.gradebook.checks import describe as describe_checks
from grader.gradebook.checks import version_of
from grader.gradebook.decisions import State, _num, replay, state_of, states, who
from grader.intake.handins import NBGRADER_FILES

MAX_NOTE_CHARS = 2000
MIN_REASON_CHARS = 6  # --accept-all --reason: "s" or "the" would accept any flag


# ------------------------------------------------------------------ the gradebook

def exercise_points(course, lesson: Lesson) -> dict[str, float]:
    """Exercise -> its points, from the lesson's grade cells in nbgrader's gradebook."""
    from nbgrader.api import MissingEntry

    with course.gradebook() as gb:
        try:
            assignment = gb.find_assignment(lesson.name)
        except MissingEntry:
            raise CourseError(f"{lesson.name} is not in the gradebook: run `python -m grader "
                              f"release {lesson.name}` and grade it first") from None
        return {cell.name.removeprefix("test-"): float(cell.max_score)
                for notebook in assignment.notebooks for cell in notebook.grade_cells}


def apply(course, lesson: str, student_id: str, state: State) -> None:
    """Write the exercise scores in force into nbgrader's gradebook (``manual_score``); an
    exercise with none goes back to the grader's ``auto_score``."""
    from nbgrader.api import MissingEntry

    with course.gradebook() as gb:
        try:
            submission = gb.find_submission(lesson, student_id)
        except MissingEntry:
            return
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                decision = state.overrides.get(grade.name.removeprefix("test-"))
                grade.manual_score = None if decision is None else min(
                    float(decision.points), float(grade.max_score))
        gb.db.commit()


def log_and_apply(course, lesson: str, student_id: str, decisions: list[dict]) -> State:
    """Log ``decisions`` and write the scores they leave in force into the gradebook, in one
    transaction (a kill between the two would leave a logged decision the grades do not
    show); the feedback page made before them is withdrawn. The state in force, returned."""
    from nbgrader.api import MissingEntry

    from grader.content.lessons import load_lesson
    from grader.gradebook.store import withdraw

    now = time.time()
    rows = [{**d, "at": d.get("at", now), "exercise": d.get("exercise", ""),
             "points": d.get("points"), "computed": d.get("computed"),
             "note": d.get("note", ""), "notebook_sha256": d.get("notebook_sha256", "")}
            for d in decisions]
    state = replay(ledger.read_decisions(course.db_url, lesson, student_id) + rows).get(
        (lesson, student_id), State())
    ledger.engine(course.db_url)
    with course.gradebook() as gb:
        ledger.log_in(gb.db, rows)
        try:
            submission = gb.find_submission(lesson, student_id)
        except MissingEntry:
            submission = None
        for notebook in submission.notebooks if submission is not None else []:
            for grade in notebook.grades:
                decision = state.overrides.get(grade.name.removeprefix("test-"))
                grade.manual_score = None if decision is None else min(
                    float(decision.points), float(grade.max_score))
        gb.db.commit()
    withdraw(course, load_lesson(lesson), {student_id})
    return state


# ------------------------------------------------------------------ the command

def parse_set(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise CourseError(f"--set {text!r}: write EXERCISE=POINTS, e.g. --set decode=2")
    return name.strip(), value.strip()


def check_points(what: str, value: str, maximum: float) -> float:
    try:
        points = float(value)
    except ValueError:
        points = math.nan
    if not math.isfinite(points) or not 0 <= points <= maximum:
        raise CourseError(f"{what}: {value!r} is not a number of points from 0 to "
                          f"{maximum:g}")
    return points


def known_student(course, lesson: Lesson, student_id: str) -> dict:
    """The grader's record of the student's submission, or a clear error."""
    graded = course.statuses(lesson.name).get(lesson.name, {})
    if student_id in graded and valid_student_id(student_id):
        return graded[student_id]
    some = sorted(s for s in graded if valid_student_id(s))
    listed = ", ".join(some[:10]) + (f" and {len(some) - 10} more" if len(some) > 10 else "")
    raise CourseError(f"no graded submission of {lesson.name} by {inert(student_id, 120)!r}"
                      + (f"; graded: {listed}" if some else "; nobody is graded yet")
                      + f" (list the flagged ones with `python -m grader review {lesson.name}`)")


def decide(course, lesson: Lesson, student_id: str, sets: list[str], total: str | None,
           clear: list[str], clear_total: bool, accept: bool, note: str | None,
           by: str | None) -> None:
    """Check a review decision, log it, write it into the gradebook, say what was done."""
    record = known_student(course, lesson, student_id)
    if accept and (sets or total is not None):
        raise CourseError("--accept keeps the computed score, --set and --total change it: "
                          "give one or the other")
    note = inert((note or "").strip(), MAX_NOTE_CHARS * 2)  # control characters escaped
    if len(note) > MAX_NOTE_CHARS:
        raise CourseError(f"--note is {len(note)} characters long: at most {MAX_NOTE_CHARS}")
    if (sets or total is not None) and not note:
        raise CourseError('--set and --total need --note "why": the student sees it on their '
                          "feedback page, and the review log keeps it")
    points = exercise_points(course, lesson)
    names = ", ".join(points)
    row = next((r for r in course.grades()
                if r["lesson"] == lesson.name and r["student_id"] == student_id), None)
    if row is None:
        raise CourseError(f"{student_id} has no grades of {lesson.name} in the gradebook")
    computed = row.get("exercises", {})
    base = {"lesson": lesson.name, "student_id": student_id, "by": who(by),
            "notebook_sha256": record.get("notebook_sha256", "")}
    decisions = []
    for text in sets:
        name, value = parse_set(text)
        if name not in points:
            raise CourseError(f"--set {text!r}: {lesson.name} has no exercise {name!r}; its "
                              f"exercises are: {names}")
        decisions.append({**base, "action": "set", "exercise": name, "note": note,
                          "points": check_points(f"--set {name}", value, points[name]),
                          "computed": computed.get(name, {}).get("computed")})
    for name in clear:
        if name not in points:
            raise CourseError(f"--clear {name!r}: {lesson.name} has no exercise {name!r}; its "
                              f"exercises are: {names}")
        decisions.append({**base, "action": "clear", "exercise": name, "note": ""})
    if total is not None:
        decisions.append({**base, "action": "total", "note": note,
                          "points": check_points("--total", total, float(row["max_score"])),
                          "computed": row.get("computed_score")})
    if clear_total:
        decisions.append({**base, "action": "clear-total", "note": ""})
    if accept:
        decisions.append({**base, "action": "accept", "note": note})
    if not decisions:
        if not note:
            raise CourseError("nothing to decide: give --accept, --set EXERCISE=POINTS, "
                              "--total POINTS, --clear EXERCISE, --clear-total, --note TEXT "
                              "or --regrade (or no option, to see the student's grading)")
        decisions.append({**base, "action": "note", "note": note})
    elif note and not any(d["note"] for d in decisions):
        decisions.append({**base, "action": "note", "note": note})
    state = log_and_apply(course, lesson.name, student_id, decisions)
    for decision in state.history[-len(decisions):]:
        course.log(f"{inert(student_id, 120)}: {decision.line()}")
    show(course, lesson, student_id, history=False)


def show(course, lesson: Lesson, student_id: str, history: bool = True) -> None:
    """One student's grading: status, reasons, each exercise's score, the decisions."""
    record = known_student(course, lesson, student_id)
    row = next((r for r in course.grades()
                if r["lesson"] == lesson.name and r["student_id"] == student_id), None)
    state = state_of(course.db_url, lesson.name, student_id)
    name = (row or {}).get("name") or (record.get("handin") or {}).get("name", "")
    lines = [f"{inert(student_id, 120)}" + (f" ({inert(name, 120)})" if name else "")
             + f", {lesson.name}: "
             + (f"{row['status']} (the grader said {row['computed_status']})"
                if row and row["status"] != row["computed_status"]
                else str(record.get("status")))]
    if record.get("reason"):
        lines.append(f"  why flagged: {inert(record['reason'], 1000)}")
    if row is not None:
        lines.append(f"  score: {_num(row['score'])} of {_num(row['max_score'])}"
                     + (f" (computed {_num(row['computed_score'])})"
                        if row["score"] != row["computed_score"] else ""))
        checks = record.get("exercises", {})
        width = exercise_width(row.get("exercises", {}))
        lines.append(f"  {'exercise':<{width}} {'score':>6} {'of':>4} {'computed':>9}  checks")
        for name, result in row.get("exercises", {}).items():
            ran = checks.get(name, {})
            passed = f"{ran['passed']}/{ran['total']}" if "total" in ran else "-"
            mark = "  (set)" if name in state.overrides else ""
            lines.append(f"  {name:<{width}} {_num(result['score']):>6} "
                         f"{_num(result['max_score']):>4} {_num(result['computed']):>9}  "
                         f"{passed}{mark}")
            if ran.get("note"):  # as the feedback page says it ("passes with a correct ...")
                lines.append(f"    {inert(ran['note'], 300)}")
            if ran.get("told"):  # a graded prediction: the student's numbers and answer
                lines.append(f"    {inert(ran['told'], 500)}")
            if ran.get("worked"):  # worked on other numbers: theirs, and the number's band
                lines.append(f"    {inert(ran['worked'], 500)}")
            lines += _failed_checks(ran)
        lines += late_lines(row, "  ")
    lines.append("  graded with " + describe_checks(version_of(record),
                                                    course.checks_version(lesson)))
    shown = state.history if history else state.in_force
    if shown:
        lines.append("  review log:" if history else "  decisions in force:")
        lines += [f"    {d.line()}" for d in shown]
    course.log("\n".join(lines))


def _failed_checks(ran: dict, most: int = 3) -> list[str]:
    """What the failed checks of an exercise said, hidden ones too (the instructor sees what
    the student's feedback only counts), a few of each."""
    shown = [f"    failed: {inert(m, 300)}" for m in ran.get("failures", [])[:most]]
    shown += [f"    failed (hidden): {inert(m, 300)}"
              for m in ran.get("hidden_failures", [])[:most]]
    more = len(ran.get("failures", [])) + int(ran.get("hidden_failed", 0) or 0) - len(shown)
    shown += [f"    and {more} more"] if more > 0 else []
    return shown + [f"    failed on the first run, passed on the second: {inert(m, 300)}"
                    for m in ran.get("first_run", [])[:most]]


def flagged(course, lesson: Lesson) -> None:
    """Every submission the grader flagged, with its reasons and what was decided."""
    rows = [r for r in course.grades() if r["lesson"] == lesson.name]
    if not rows:
        raise CourseError(f"no grades for {lesson.name} yet: run `python -m grader autograde "
                          f"{lesson.name} SUBMISSIONS` first")
    found = states(course.db_url, lesson.name)
    records = course.statuses(lesson.name).get(lesson.name, {})
    listed = [r for r in rows if r["computed_status"] != "graded"
              or (lesson.name, r["student_id"]) in found]
    open_ = [r for r in listed if r["computed_status"] != "graded" and r["status"] != "graded"]
    lines = [f"{lesson.name}: {sum(r['computed_status'] != 'graded' for r in rows)} flagged "
             f"of {len(rows)}, {len(open_)} still open"]
    for row in sorted(listed, key=lambda r: (r["status"] == "graded", str(r["student_id"]))):
        state = found.get((lesson.name, str(row["student_id"])), State())
        decided = state.summary() or "open"
        who = inert(row["student_id"], 120) + (f" ({inert(row['name'], 60)})"
                                               if row.get("name") else "")
        lines.append(f"  {who:<20} {row['computed_status']:<13} "
                     f"{_num(row['score']):>5} of {_num(row['max_score'])}  [{decided}]")
        if row.get("reason"):
            lines.append(f"      why: {inert(row['reason'], 1000)}")
        lines += [f"      {name}: {inert(ran['worked'], 500)}" for name, ran in records.get(
            str(row["student_id"]), {}).get("exercises", {}).items() if ran.get("worked")]
        lines += late_lines(row, "      ")
        lines += [f"      {d.line()}" for d in state.in_force]
    lines += ["", f"decide: python -m grader review {lesson.name} STUDENT --accept "
              "[--note TEXT]", f"        python -m grader review {lesson.name} STUDENT "
              '--set EXERCISE=POINTS --note "why"',
              f"        python -m grader review {lesson.name} STUDENT --regrade",
              f'        python -m grader review {lesson.name} --accept-all --reason "TEXT"'
              "   (every open flag whose every reason contains TEXT)"]
    course.log("\n".join(lines))


def late_lines(row: dict | None, indent: str) -> list[str]:
    """What the late policy did to a grade row (grader/gradebook/deadlines.py), in a line; none
    where
    it did nothing worth a look."""
    if not row or not row.get("late_note"):
        return []
    note = inert(row["late_note"], 300)
    if row.get("late_penalty"):
        return [f"{indent}late: {note}; {_num(float(row['raw_score']))} - "
                f"{_num(float(row['late_penalty']))} = {_num(float(row['score']))} "
                f"({inert(row.get('time_source', ''), 200)})"]
    if row.get("late") or "late" in str(row["late_note"]):
        return [f"{indent}late: {note} ({inert(row.get('time_source', ''), 200)})"]
    return []


def accept_all(course, lesson: Lesson, reasons: list[str] | str, note: str | None,
               by: str | None) -> int:
    """Accept the computed score of every open ``needs_review`` flag of ``lesson`` whose every
    reason contains one of ``reasons`` (case aside): the expected flags of a batch, such as a
    notebook the browser saved as ``float_formats (1).ipynb``, or predictions worked on the
    default numbers (a student with several such reasons is accepted when each is one of
    them). A flag with another reason besides stays open, and so does an ``invalid`` one (it
    has no score to accept). Returns how many."""
    if isinstance(reasons, str):
        reasons = [reasons]
    wanted = [" ".join(r.split()).casefold() for r in reasons]
    short = [r for r in wanted if len(r) < MIN_REASON_CHARS]
    if short:
        raise CourseError(f"--reason {short[0]!r} would match almost any reason: give at least "
                          f"{MIN_REASON_CHARS} characters of the reason you expect, e.g. "
                          "\"in place of\" or \"default numbers\"")
    reason = " | ".join(reasons)
    note = inert((note or "").strip(), MAX_NOTE_CHARS * 2)
    if len(note) > MAX_NOTE_CHARS:
        raise CourseError(f"--note is {len(note)} characters long: at most {MAX_NOTE_CHARS}")
    rows = [r for r in course.grades() if r["lesson"] == lesson.name
            and r["computed_status"] != "graded" and r["status"] != "graded"]
    records = course.statuses(lesson.name).get(lesson.name, {})
    accepted, mixed = [], []
    for row in sorted(rows, key=lambda r: str(r["student_id"])):
        parts = [p for p in str(row.get("reason", "")).split("; ") if p.strip()]
        matching = [p for p in parts if any(w in " ".join(p.split()).casefold()
                                            for w in wanted)]
        if not matching:
            continue
        if len(matching) < len(parts) or row["computed_status"] != "needs_review":
            mixed.append(row)
        else:
            accepted.append(row)
    if not accepted:
        shown = sorted({p for r in rows for p in str(r.get("reason", "")).split("; ") if p})
        raise CourseError(f"no open needs_review flag of {lesson.name} has only reasons that "
                          f"contain {inert(reason, 100)!r}"
                          + (f"; {len(mixed)} have it beside another reason, or are invalid"
                             if mixed else "")
                          + (": the open reasons are: " + inert("; ".join(shown[:10]), 1000)
                             if shown else ": nothing is open"))
    name = who(by)
    ledger.log_decisions(course.db_url, [{
        "lesson": lesson.name, "student_id": str(row["student_id"]), "action": "accept",
        "by": name, "note": note,
        "notebook_sha256": records.get(str(row["student_id"]), {}).get("notebook_sha256", "")}
        for row in accepted])

    def listed(found: list[dict]) -> str:
        return inert(", ".join(str(r["student_id"]) + (f" ({r['name']})" if r.get("name") else "")
                               for r in found), 2000)

    course.log(f"{lesson.name}: accepted the computed score of {len(accepted)} flagged "
               f"submission(s) whose every reason contains {inert(reason, 100)!r}, as {name}: "
               + listed(accepted)
               + (f"\nleft open, another reason besides (or invalid): {listed(mixed)}"
                  if mixed else ""))
    return len(accepted)


def regrade(course, lesson: Lesson, student_id: str, by: str | None, discard: bool,
            **options) -> dict:
    """Grade the student's stored notebook again (submitted/STUDENT/LESSON/), keeping what the
    download said of the hand-in; the decisions in force stay unless ``discard``."""
    known_student(course, lesson, student_id)
    stored = course.root / "submitted" / student_id / lesson.name / lesson.notebook.name
    if not stored.is_file():
        raise CourseError(f"no stored notebook of {student_id} for {lesson.name} ({stored}): "
                          "the submission was invalid; grade a new one with `python -m grader "
                          f"autograde {lesson.name} SUBMISSIONS`")
    name = who(by)
    folder = Path(tempfile.mkdtemp(dir=course.root, prefix="regrade-"))
    try:
        (folder / student_id).mkdir()
        shutil.copyfile(stored, folder / student_id / lesson.notebook.name)
        for kept in NBGRADER_FILES:  # an exchange hand-in's time and feedback secret
            if (stored.parent / kept).is_file():
                shutil.copyfile(stored.parent / kept, folder / student_id / kept)
        statuses = course.autograde(lesson, folder, layout="folders", keep_handins=True,
                                    discard_overrides=discard, by=name, **options)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ledger.log_decisions(course.db_url, [{
        "lesson": lesson.name, "student_id": student_id, "action": "regrade", "by": name,
        "note": "", "notebook_sha256": statuses.get(student_id, {}).get("notebook_sha256", "")}])
    show(course, lesson, student_id, history=False)
    return statuses


def command(course, lesson: Lesson, args) -> int:
    """``python -m grader review``: list the flagged, show a student, or record a decision, as
    the command line's ``args`` ask."""
    decision = bool(args.accept or args.set or args.total is not None or args.clear
                    or args.clear_total or args.note is not None)
    regrade_only = (args.discard_overrides, args.no_sandbox, args.partial_credit)
    if args.accept_all or args.reason:
        if args.student is not None or not args.accept_all \
                or not all(r.strip() for r in args.reason or [""]) \
                or args.accept or args.set or args.total is not None or args.clear \
                or args.clear_total or args.regrade or any(regrade_only):
            raise CourseError("--accept-all goes with --reason TEXT (the reason every flag it "
                              "accepts is for; repeat it for several) and at most --note and "
                              "--by, for the whole "
                              f"lesson: python -m grader review {lesson.name} --accept-all "
                              "--reason \"in place of\"")
        accept_all(course, lesson, [r.strip() for r in args.reason], args.note, args.by)
        return 0
    if args.student is None:
        if decision or args.regrade or any(regrade_only):
            raise CourseError("name the STUDENT a decision is for: python -m grader review "
                              f"{lesson.name} STUDENT ...")
        flagged(course, lesson)
        return 0
    if args.regrade:
        if decision:
            raise CourseError("--regrade grades the stored notebook again and decides nothing: "
                              "run it on its own, then decide")
        regrade(course, lesson, args.student, args.by, args.discard_overrides,
                       use_sandbox=not args.no_sandbox, partial=args.partial_credit)
        return 0
    if any(regrade_only):
        raise CourseError("--discard-overrides, --no-sandbox and --partial-credit go with "
                          "--regrade")
    if decision:
        decide(course, lesson, args.student, args.set, args.total, args.clear,
                      args.clear_total, args.accept, args.note, args.by)
    else:
        show(course, lesson, args.student)
    return 0
