"""``python -m grader report LESSON``: how a class did, and which submissions need a look."""

from __future__ import annotations

import csv
from pathlib import Path

from grader.course import Course
from grader.intake import inert
from grader.lessons import CourseError, Lesson


def report(course: Course, lesson: Lesson) -> Path:
    """Write pass rates, a score histogram and the flagged submissions to reports/LESSON/."""
    graded = course.statuses(lesson.name).get(lesson.name, {})
    rows = [r for r in course.grades() if r["lesson"] == lesson.name]
    if not rows:
        raise CourseError(f"no grades for {lesson.name} yet: run `python -m grader autograde "
                          f"{lesson.name} SUBMISSIONS` first")
    folder = course.root / "reports" / lesson.name
    folder.mkdir(parents=True, exist_ok=True)

    exercises: dict[str, list[bool]] = {}
    for record in graded.values():
        for name, result in record.get("exercises", {}).items():
            exercises.setdefault(name, []).append(result["points"] == result["max_points"])
    lines = [f"{lesson.name}: {len(rows)} submission(s)", "",
             f"{'exercise':<28} {'passed':>8} {'of':>4} {'rate':>7}"]
    with (folder / "pass_rates.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["exercise", "passed", "graded", "pass_rate"])
        for name, passes in exercises.items():
            rate = sum(passes) / len(passes)
            writer.writerow([name, sum(passes), len(passes), f"{rate:.3f}"])
            lines.append(f"{name:<28} {sum(passes):>8} {len(passes):>4} {rate:>7.0%}")

    flagged = [(r["student_id"], r["status"], r["reason"]) for r in rows if r["status"] != "graded"]
    with (folder / "flagged.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "status", "reason"])
        for student, status, reason in flagged:
            writer.writerow([_safe(student), status, _safe(reason)])
    lines += ["", f"flagged: {len(flagged)}"]
    lines += [f"  {student}: {status}: {reason}" for student, status, reason in flagged]

    # What the download said of each hand-in: who, from where, the LMS's late mark, and which
    # attempt was graded or what was ignored beside the notebook.
    with (folder / "handins.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "name", "from", "late", "status", "score", "remarks"])
        for row in sorted(rows, key=lambda r: str(r["student_id"])):
            writer.writerow([_safe(str(row["student_id"])), _safe(str(row.get("name", ""))),
                             row.get("from", ""), "late" if row.get("late") else "",
                             row["status"], float(row["score"]),
                             _safe("; ".join(row.get("remarks", [])))])
    late = [r for r in rows if r.get("late")]
    lines += ["", f"marked late by the LMS: {len(late)}"]
    lines += [f"  {r['student_id']}" + (f" ({r['name']})" if r.get("name") else "")
              for r in late]

    _histogram([float(r["score"]) for r in rows], float(rows[0]["max_score"]), lesson,
               folder / "scores.png")
    lines += ["", f"written: {folder}/pass_rates.csv, scores.png, flagged.csv, handins.csv"]
    course.log("\n".join(lines))
    return folder


def _safe(text: str) -> str:
    text = inert(text, 1000)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _histogram(scores: list[float], max_score: float, lesson: Lesson, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    bins = [b - 0.5 for b in range(int(max_score) + 2)]
    ax.hist(scores, bins=bins, color="#56B4E9", edgecolor="black")
    ax.set_xlabel(f"score (points, out of {max_score:g})", fontsize=14)
    ax.set_ylabel("submissions", fontsize=14)
    ax.set_title(f"{lesson.name}: scores of {len(scores)} submission(s)", fontsize=16)
    ax.tick_params(labelsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
