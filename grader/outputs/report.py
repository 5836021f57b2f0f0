"""``python -m grader report LESSON``: how a class did, and which submissions need a look."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.files import written
from grader.common.text import display as _safe
from grader.common.text import exercise_width, inert
from grader.content.lessons import Lesson
from grader.content.variants import draw, variants_of
from grader.gradebook.checks import version_of
from grader.gradebook.coursedir import CourseDir
from grader.gradebook.coursestate import key_ring


def report(course: CourseDir, lesson: Lesson, out: Path | None = None) -> Path:
    """Write pass rates, a score histogram and the flagged submissions to ``out`` (default
    reports/LESSON/ in the course directory), each file written whole. Pass rates count the
    scores after review, exercise by exercise in the notebook's order, as exercises.csv
    does, of the submissions that ran (an invalid one, never run, is in the histogram and the
    flagged list only)."""
    graded = course.statuses(lesson.name).get(lesson.name, {})
    rows = [r for r in course.grades() if r["lesson"] == lesson.name]
    if not rows:
        raise CourseError(f"no grades for {lesson.name} yet: run `python -m grader autograde "
                          f"{lesson.name} SUBMISSIONS` first")
    folder = out.resolve() if out is not None else course.root / "reports" / lesson.name
    ran = [r for r in rows if r["computed_status"] != "invalid"]  # an invalid one never ran

    exercises: dict[str, list[bool]] = {}
    for row in ran:
        for name, result in (row.get("exercises") or {}).items():
            exercises.setdefault(name, []).append(
                float(result["score"]) >= float(result["max_score"]))
    width = exercise_width(exercises, 28)
    lines = [f"{lesson.name}: {len(rows)} submission(s)", *_versions(course, lesson, graded),
             "", f"{'exercise':<{width}} {'passed':>8} {'of':>4} {'rate':>7}"]
    with written(folder / "pass_rates.csv", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["exercise", "passed", "graded", "pass_rate"])
        for name, passes in exercises.items():
            rate = sum(passes) / len(passes)
            writer.writerow([name, sum(passes), len(passes), f"{rate:.3f}"])
            lines.append(f"{name:<{width}} {sum(passes):>8} {len(passes):>4} {rate:>7.0%}")

    lines += ["", *_per_exercise(ran, graded, folder / "exercises.csv")]
    lines += _per_variant(course, lesson, ran, graded, folder / "variants.csv")

    # Every submission the grader flagged, settled by a review decision or still open.
    flagged = [(r["student_id"], r["computed_status"], r["reason"], r.get("review") or "open")
               for r in rows if r["computed_status"] != "graded"]
    with written(folder / "flagged.csv", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "status", "reason", "review"])
        for student, status, reason, decided in flagged:
            writer.writerow([_safe(student), status, _safe(reason), _safe(decided)])
    still_open = sum(decided == "open" for *_, decided in flagged)
    lines += ["", f"flagged: {len(flagged)} ({still_open} open; decide with `python -m grader "
              f"review {lesson.name}`)"]
    lines += [f"  {inert(student, 120)}: {status}: {inert(reason)} [{inert(decided)}]"
              for student, status, reason, decided in flagged]
    reviewed = [r for r in rows if r.get("review")]
    lines += ["", f"reviewed: {len(reviewed)}"]
    lines += [f"  {inert(r['student_id'], 120)}: {inert(r['review'])}; score {r['score']:g} "
              f"(computed {r['computed_score']:g}) by {inert(r['reviewed_by'])}"
              for r in reviewed]

    # What the download said of each hand-in: who, from where, the LMS's late mark, and which
    # attempt was graded or what was ignored beside the notebook.
    with written(folder / "handins.csv", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "name", "from", "late", "status", "score", "remarks",
                         "checks"])
        for row in sorted(rows, key=lambda r: str(r["student_id"])):
            writer.writerow([_safe(str(row["student_id"])), _safe(str(row.get("name", ""))),
                             row.get("from", ""), "late" if row.get("late") else "",
                             row["status"], float(row["score"]),
                             _safe("; ".join(row.get("remarks", []))),
                             version_of(graded.get(str(row["student_id"]), {}))])
    late = [r for r in rows if r.get("late")]
    lines += ["", f"marked late by the LMS: {len(late)}"]
    lines += [f"  {_who(r)}" for r in late]

    lines += ["", *_late(course, rows, folder / "late.csv")]

    figure = histogram([float(r["score"]) for r in rows], float(rows[0]["max_score"]), lesson)
    with written(folder / "scores.png", "wb") as handle:
        figure.savefig(handle, format="png", dpi=100)
    import matplotlib.pyplot as plt

    plt.close(figure)
    variants = ", variants.csv" if (folder / "variants.csv").exists() else ""
    lines += ["", f"written: {folder}/pass_rates.csv, exercises.csv, scores.png, flagged.csv, "
              f"handins.csv, late.csv{variants}"]
    course.log("\n".join(lines))
    return folder


def _versions(course: CourseDir, lesson: Lesson, graded: dict[str, dict]) -> list[str]:
    """Which checks made the grades (grader/gradebook/checks.py): a line, and one more where
    some were made with other checks than the lesson's now."""
    current = course.checks_version(lesson)
    counts = Counter(version_of(record) for record in graded.values())
    others = {v: n for v, n in counts.items() if v != current}
    line = f"checks: {counts.get(current, 0)} graded with the lesson's checks now ({current})"
    if not others:
        return [line]
    return [line, f"  {sum(others.values())} graded with other checks ("
            + ", ".join(f"{v or 'not recorded'}: {n}" for v, n in sorted(others.items()))
            + f"): python -m grader autograde {lesson.name} SUBMISSIONS --resume grades them "
            "again (docs/instructor.md, 'I fixed a check: now what')"]


def _per_exercise(rows: list[dict], graded: dict[str, dict], path: Path) -> list[str]:
    """Per exercise: the distribution of its final scores (after review), its mean, and the
    check that failed most often with its most common message (hidden checks are counted,
    never named). Written to ``path``; returns the lines to print."""
    names = list(dict.fromkeys(n for r in rows for n in (r.get("exercises") or {})))
    width = exercise_width(names)
    lines = [f"{'exercise':<{width}} {'mean':>6} {'of':>4}  scores (points: submissions)"]
    with written(path, newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["exercise", "max_points", "submissions", "mean", "distribution",
                         "full_marks", "most_failed_check", "failed", "most_common_message",
                         "hidden_failed"])
        for name in names:
            scores = [float(r["exercises"][name]["score"]) for r in rows
                      if name in (r.get("exercises") or {})]
            maximum = next(float(r["exercises"][name]["max_score"]) for r in rows
                           if name in (r.get("exercises") or {}))
            counts = Counter(scores)
            spread = " ".join(f"{points:g}:{counts[points]}" for points in sorted(counts))
            failures = Counter()
            messages: dict[str, Counter] = {}
            hidden = 0
            for record in graded.values():
                result = record.get("exercises", {}).get(name, {})
                hidden += bool(result.get("hidden_failed"))
                for message in result.get("failures", []):
                    check = message.split(": ", 1)[0]
                    failures[check] += 1
                    messages.setdefault(check, Counter())[message] += 1
            check, times = failures.most_common(1)[0] if failures else ("", 0)
            message = messages[check].most_common(1)[0][0] if check else ""
            mean = sum(scores) / len(scores)
            writer.writerow([name, maximum, len(scores), round(mean, 3), spread,
                             sum(s == maximum for s in scores), _safe(check), times,
                             _safe(message), hidden])
            lines.append(f"{name:<{width}} {mean:>6.2f} {maximum:>4g}  {spread}")
            if check:
                lines.append(f"    most failed check ({times}x): {inert(message, 300)}")
            if hidden:
                lines.append(f"    hidden checks failed in {hidden} submission(s)")
    return lines


def _per_variant(course: CourseDir, lesson: Lesson, rows: list[dict], graded: dict[str, dict],
                 path: Path) -> list[str]:
    """Pass rates of each graded prediction by the variant its students drew (for their course
    id), scores after review (as exercises.csv counts them): a variant far harder than the
    others is a bug in the question, not in the students. Left out, since they say nothing of
    the question: predictions that gave no number (never attempted: still the released stub),
    and work drawn for other numbers than the student's own (a copy of another id's, the
    defaults, another key or variant)."""
    variants = variants_of(lesson)
    try:
        key = course.key() if variants else None
    except CourseError as error:  # a copy of the course without its key: the rest stands
        return ["", f"no pass rates by variant: {error}"]
    if key is None or not variants:
        return []
    ring = key_ring(course.root)
    lines = ["", f"{'graded prediction, by variant':<44} {'passed':>8} {'of':>4} {'rate':>7}"]
    left_out = Counter()
    with written(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["exercise", "variant", "numbers", "passed", "graded", "pass_rate"])
        for name, spec in variants.items():
            tally: dict[int, list[bool]] = {i: [] for i in range(len(spec.choices))}
            for row in rows:
                student = str(row["student_id"])
                result = (row.get("exercises") or {}).get(name)
                record = graded.get(student, {})
                if result is None:
                    continue
                why = _not_counted(record, name)
                if why:
                    left_out[why] += 1
                    continue
                drawn_for = str(record.get("drawn_for") or student)  # a course id
                drawn_with = ring.get(str(record.get("drawn_with")), key)  # the key it records
                tally[draw(drawn_with, lesson.name, name, drawn_for,
                           len(spec.choices))].append(
                    float(result["score"]) >= float(result["max_score"]))
            for index, passes in tally.items():
                # a variant nobody drew has no rate: blank, as the terminal's "-" (not 0.000,
                # which a spreadsheet reads as "no one passed")
                rate = f"{sum(passes) / len(passes):.3f}" if passes else ""
                writer.writerow([name, index, spec.said(index), sum(passes), len(passes),
                                 rate])
                label = f"{name} #{index}"
                lines.append(f"{label:<44} {sum(passes):>8} {len(passes):>4} "
                             + (f"{sum(passes) / len(passes):>7.0%}" if passes else f"{'-':>7}"))
    if left_out:
        lines.append("  not counted: " + ", ".join(f"{n} {why}"
                                                    for why, n in left_out.most_common()))
    return lines


def _not_counted(record: dict, exercise: str) -> str:
    """Why a graded prediction says nothing of its variant, or '': never attempted, or worked
    on other numbers than the student's (grader/grading/autograde.py, ``drawn_elsewhere``)."""
    if f"its {exercise} was " in str(record.get("reason", "")):
        return "worked on other numbers than their own (a copy, the defaults)"
    ran = (record.get("exercises") or {}).get(exercise, {})
    if "no number of yours was read" in str(ran.get("told", "")):  # (grading/probe.py)
        return "gave no number (never attempted)"
    return ""


def _late(course: CourseDir, rows: list[dict], path: Path) -> list[str]:
    """The late policy per submission: when it was handed in and how that is known, the due
    time (after any extension), the score before and after the penalty. Returns the lines to
    print; those with no known time are named (they pay no penalty)."""
    with written(path, newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "submitted_at", "time_source", "due", "raw_score",
                         "late_penalty", "final_score", "note"])
        for row in sorted(rows, key=lambda r: str(r["student_id"])):
            writer.writerow([_safe(str(row["student_id"])), row.get("submitted_at", ""),
                             _safe(str(row.get("time_source", ""))), row.get("due", ""),
                             float(row.get("raw_score", row["score"])),
                             float(row.get("late_penalty", 0.0)), float(row["score"]),
                             _safe(str(row.get("late_note", "")))])
    if course.deadlines() is None:
        return [f"late policy: none (no deadlines file {course.deadlines_file})"]
    penalised = [r for r in rows if r.get("late_penalty")]
    unknown = [r for r in rows if r.get("due") and not r.get("submitted_at")
               and not r.get("late_penalty")]
    lines = [f"late policy: {len(penalised)} submission(s) penalised"]
    lines += [f"  {_who(r)}: {inert(r.get('late_note', ''))}; "
              f"{float(r['raw_score']):g} - {float(r['late_penalty']):g} = {float(r['score']):g}"
              f" ({inert(r.get('time_source', ''))})" for r in penalised]
    lines.append(f"no submission time known, so no penalty: {len(unknown)}"
                 + (" (" + inert(", ".join(sorted(str(r["student_id"]) for r in unknown)), 400)
                    + ")" if unknown else ""))
    why = Counter(f"{r.get('time_source', '')}: {r.get('late_note', '')}" for r in unknown)
    lines += [f"  {n}: {inert(text, 300)}" for text, n in why.most_common()]
    return lines


def _who(row: dict) -> str:
    return inert(row["student_id"], 120) + (f" ({inert(row['name'], 120)})"
                                            if row.get("name") else "")


def histogram(scores: list[float], max_score: float, lesson: Lesson):
    """The score histogram (a matplotlib figure, for scores.png): a bar per whole point, and
    whole numbers on both axes (points and submissions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(10, 6))
    bins = [b - 0.5 for b in range(int(max_score) + 2)]
    ax.hist(scores, bins=bins, color="#56B4E9", edgecolor="black")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"score (points, out of {max_score:g})", fontsize=14)
    ax.set_ylabel("submissions", fontsize=14)
    ax.set_title(f"{lesson.name}: scores of {len(scores)} submission(s)", fontsize=16)
    ax.tick_params(labelsize=12)
    fig.tight_layout()
    return fig
