"""The grades as read: one row per student and lesson from nbgrader's gradebook, with the
ledger's status, the review decisions in force and the late penalty applied."""

from __future__ import annotations

import nbformat

from grader.common.errors import CourseError
from grader.gradebook import times as stored_times


def grades(course) -> list[dict[str, object]]:
    """One row per student and lesson: scores from the gradebook, status from our ledger,
    the review decisions in force applied (grader/gradebook/review.py). A submission refused before
    it reached the gradebook (a folder whose name is no student id) has a row too, with
    score 0.

    ``score`` is the final score (an exercise's score set in review is in the gradebook;
    a lesson's score set in review replaces the sum), ``computed_score`` the grader's own,
    ``status`` ``graded`` once a decision settled a flag (``computed_status``: the
    grader's), ``exercises``: name -> score, computed, max_score."""
    from grader.gradebook.decisions import states

    statuses = course.statuses()
    if not course.has_gradebook():
        return []
    decisions = states(course.db_url)
    rows = []
    with course.gradebook() as gb:
        # a query for the grades and one for the submissions, whatever the class's size (not
        # nbgrader's per-submission score and student, a query each: minutes at 10,000)
        exercises, totals = _exercise_grades(gb)
        max_scores = {a.name: float(a.max_score) for a in gb.assignments}
        for lesson, student in sorted(_submissions(gb)):
            status = statuses.get(lesson, {}).get(student, {})
            max_score = max_scores[lesson]
            per = exercises.get((lesson, student), {})
            score = min(max(totals.get((lesson, student), 0.0), 0.0), max_score)
            computed = min(max(sum(e["computed"] for e in per.values()), 0.0),
                           max_score) if per else score
            rows.append({
                "student_id": student,
                "lesson": lesson,
                "notebook_sha256": status.get("notebook_sha256", ""),
                "score": score,
                "max_score": max_score,
                "status": status.get("status", "graded"),
                "reason": status.get("reason", ""),
                **_handin_fields(status),
                "computed_score": computed,
                "exercises": per,
            })
    known = {(row["student_id"], row["lesson"]) for row in rows}
    for lesson, students in sorted(statuses.items()):
        for student, status in sorted(students.items()):
            if (student, lesson) not in known and lesson in max_scores:
                rows.append({"student_id": student, "lesson": lesson, "score": 0.0,
                             "notebook_sha256": status.get("notebook_sha256", ""),
                             "max_score": max_scores[lesson],
                             "status": status.get("status", "invalid"),
                             "reason": status.get("reason", ""), **_handin_fields(status),
                             "computed_score": 0.0, "exercises": {}})
    for row in rows:
        row["computed_status"] = row["status"]
        state = decisions.get((str(row["lesson"]), str(row["student_id"])))
        in_force = state.in_force if state else []
        row["review"] = state.summary() if state else ""
        row["review_note"] = "; ".join(d.note for d in in_force if d.note)
        row["reviewed_by"] = f"{in_force[-1].by} {in_force[-1].when}" if in_force else ""
        if state is not None:
            if state.total is not None:
                row["score"] = min(max(float(state.total.points or 0.0), 0.0),
                                   float(row["max_score"]))
            current = str(row.get("notebook_sha256", ""))
            if state.made_elsewhere(current):  # a later hand-in: looked at again
                row["status"] = "needs_review" if row["status"] == "graded" else row["status"]
                row["reason"] = "; ".join(x for x in (
                    str(row["reason"]), "the review decision was made on an earlier notebook "
                    "than this one: look at this one") if x)
            elif state.resolved_for(current) and row["status"] != "graded":
                row["status"] = "graded"
    apply_deadlines(course, rows)
    return rows


def apply_deadlines(course, rows: list[dict]) -> None:
    """The late penalty, after review: ``raw_score`` is the score review left,
    ``late_penalty`` the points lost, ``score`` what remains (grader/gradebook/deadlines.py)."""
    deadlines = course.deadlines()
    times = stored_times.read_times(course.db_url) if deadlines else {}
    for row in rows:
        raw = float(row["score"])
        row.update(raw_score=raw, late_penalty=0.0, submitted_at="", time_source="",
                   due="", late_note="")
        if deadlines is None:
            continue
        known = times.get((str(row["lesson"]), str(row["student_id"])),
                          {"submitted_at": None, "source": "none", "late_mark": False})
        late = deadlines.judge(str(row["lesson"]), str(row["student_id"]),
                               known["submitted_at"], known["source"],
                               bool(known["late_mark"]))
        penalty = round(raw * late.fraction, 6)
        row.update(late_penalty=penalty, score=raw - penalty,
                   submitted_at=_iso(late.submitted), time_source=late.source,
                   due=_iso(late.due) + (" (extended)" if late.extended else ""),
                   late_note=late.note)


def _submissions(gb) -> list[tuple[str, str]]:
    """(lesson, student) of every submission in nbgrader's gradebook, in one query."""
    from nbgrader.api import Assignment, SubmittedAssignment

    return [(str(lesson), str(student)) for lesson, student in
            gb.db.query(Assignment.name, SubmittedAssignment.student_id)
            .join(SubmittedAssignment, SubmittedAssignment.assignment_id == Assignment.id)]


def _exercise_grades(gb) -> tuple[dict[tuple[str, str], dict[str, dict[str, float]]],
                                  dict[tuple[str, str], float]]:
    """(lesson, student) -> exercise -> score (the gradebook's: a score set in review counts),
    computed (the grader's) and max_score, in the lesson's order; and (lesson, student) ->
    the submission's score as nbgrader sums it (``SubmittedAssignment.score``: each grade's
    manual score, else its auto score, plus its extra credit); one query for the course."""
    from nbgrader.api import (
        Assignment,
        Grade,
        GradeCell,
        SubmittedAssignment,
        SubmittedNotebook,
    )

    found: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    totals: dict[tuple[str, str], float] = {}
    query = (gb.db.query(Assignment.name, SubmittedAssignment.student_id, GradeCell.name,
                         Grade.auto_score, Grade.manual_score, Grade.extra_credit,
                         GradeCell.max_score)
             .select_from(Grade)
             .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
             .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
             .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
             .join(GradeCell, Grade.cell_id == GradeCell.id))
    for lesson, student, cell, auto, manual, extra, maximum in query:
        computed = float(auto or 0.0)
        score = (float(manual) if manual is not None else computed) + float(extra or 0.0)
        given = manual if manual is not None else auto
        totals[(lesson, student)] = totals.get((lesson, student), 0.0) + (
            0.0 if given is None else float(given) + float(extra or 0.0))
        found.setdefault((lesson, student), {})[cell.removeprefix("test-")] = {
            "score": min(max(score, 0.0), float(maximum)), "computed": computed,
            "max_score": float(maximum)}
    order = _cell_order({lesson for lesson, _ in found})
    return {key: dict(sorted(value.items(), key=lambda item: (order.get((key[0], item[0]), 0),
                                                              item[0])))
            for key, value in found.items()}, totals


def _cell_order(lessons: set[str]) -> dict[tuple[str, str], int]:
    """(lesson, exercise) -> its place in the lesson's notebook."""
    from grader.content.lessons import load_lesson

    order = {}
    for name in lessons:
        try:
            cells = nbformat.read(load_lesson(name).notebook, as_version=4).cells
        except (CourseError, OSError):
            continue
        ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in cells]
        for place, grade_id in enumerate(i for i in ids if i.startswith("test-")):
            order[(name, grade_id.removeprefix("test-"))] = place
    return order


def _handin_fields(status: dict) -> dict[str, object]:
    """What a grade row shows of the hand-in: the name, the LMS's late mark, its layout."""
    handin = status.get("handin") or {}
    return {"name": handin.get("name", ""), "late": bool(handin.get("late")),
            "from": handin.get("from", ""), "email": handin.get("email", ""),
            "remarks": handin.get("remarks", []), "lms_id": handin.get("lms_id", ""),
            "course_id": handin.get("course_id", "")}


def _iso(when) -> str:
    return when.isoformat(timespec="seconds") if when is not None else ""
