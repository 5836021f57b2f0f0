"""``python -m grader``: the course's command line for instructors (and the student lab): each
command's call into the layer that does the work (its options: grader/cli/parser.py)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from grader.cli.parser import GLOBAL_OPTIONS, USAGE, build_parser
from grader.common.errors import CourseError
from grader.common.faults import Unavailable
from grader.common.text import inert
from grader.content.lessons import lesson_names, load_lesson
from grader.grading.limits import Limits


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        print(USAGE, end="")
        return 2
    for dest, (flag, _, _) in GLOBAL_OPTIONS.items():
        before, after = getattr(args, f"{dest}_before"), getattr(args, dest, None)
        if before is not None and after is not None and before != after:
            parser.error(f"{flag} is given twice, as {before!r} and {after!r}: give it once")
        setattr(args, dest, after if after is not None else before)
    import signal
    import warnings

    # nbgrader 0.9.6's add_submission builds its rows in a way SQLAlchemy 2 warns about on
    # every new submission ("Object of type <SubmittedAssignment> not in session"): harmless
    # (the rows are added through the assignment), and noise in every autograde's output.
    warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session",
                            module=r"nbgrader\.")

    def stopped(number, frame):  # a SIGTERM (a scheduler, the OOM killer's parent, `kill`)
        raise KeyboardInterrupt  # unwinds like Ctrl-C: temporary folders go, copies are written

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stopped)
    try:
        return run(args)
    except CourseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Unavailable as fault:
        print(f"stopped: {inert(str(fault), 400)}. Nothing is charged to a student, and every "
              "submission stored so far is stored whole; when it is back, run the same command "
              "with --resume to finish.", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted." + (" Every submission stored so far is stored whole; run the "
                                "same command with --resume to finish."
                                if args.command == "autograde" else ""), file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    if args.command == "sync":
        from grader.content.sync import sync

        return sync(lesson_names(args.lessons), check_only=args.check)

    if args.command == "worker":
        from grader.grading.distributed import worker

        return worker(args.broker, args.concurrency, args.visibility_timeout, args.queue_key)

    from grader.course import open_course

    exchange_dir = getattr(args, "exchange", None)
    if args.command in ("release", "feedback") and args.course_id is not None \
            and exchange_dir is None:
        raise CourseError("--course-id names the course in nbgrader's exchange: give "
                          "--exchange [DIR] too")
    if exchange_dir and not Path(exchange_dir).exists() and exchange_dir in {
            lesson.name for lesson in lesson_names([])}:
        raise CourseError(f"--exchange took the lesson {exchange_dir} for its folder: name the "
                          "lessons first (release LESSON --exchange), or write --exchange=DIR")
    course = open_course(args.course_dir, db_url=args.db_url, deadlines=args.deadlines)
    if args.command in ("autograde", "feedback", "export", "report", "review"):
        course.deadlines()  # a bad value stops the command here, its warnings said once
    if args.command == "deadlines":
        from grader.gradebook.deadlines_check import show

        return show(course, check=args.check)
    if args.command == "release":
        to_exchange = args.exchange is not None
        if to_exchange:
            from grader.intake import exchange
            from grader.outputs import publish

            where = exchange.settings(course, args.exchange, args.course_id, remember=True)
        for lesson in lesson_names(args.lessons):
            course.release(lesson, new_key=args.new_key)
            args.new_key = False  # one new key, then the lessons after it use it
            if to_exchange:
                publish.publish(course, lesson, where)
        return 0
    if args.command == "collect":
        from grader.intake import exchange

        exchange.collect(course, load_lesson(args.lesson),
                         exchange.settings(course, args.exchange, args.course_id),
                         check_owner=not args.no_check_owner)
        return 0
    if args.command == "autograde":
        if args.jobs < 1:
            raise CourseError("--jobs must be at least 1")
        if args.collected == (args.submissions is not None):
            raise CourseError("give SUBMISSIONS (a folder or zip) or --collected (what "
                              "python -m grader collect took from the exchange), not both"
                              if args.collected else "give SUBMISSIONS: a folder or zip of "
                              "hand-ins, or --collected for what python -m grader collect took")
        if args.collected:
            from grader.intake.exchange import COLLECTED

            if not (course.root / COLLECTED).is_dir():
                raise CourseError(f"nothing collected yet in {course.root / COLLECTED}: run "
                                  f"python -m grader collect {args.lesson} first")
            args.submissions, args.layout = course.root / COLLECTED, args.layout or "nbgrader"
        if args.queue_key is not None and args.broker is None:
            raise CourseError("--queue-key goes with --broker (the workers' queue)")
        course.queue_key = args.queue_key
        limits = Limits(cell_seconds=args.cell_timeout, notebook_seconds=args.timeout,
                        memory_bytes=args.memory * 2**30)
        statuses = course.autograde(load_lesson(args.lesson), args.submissions, jobs=args.jobs,
                                    use_sandbox=not args.no_sandbox, limits=limits,
                                    partial=args.partial_credit, resume=args.resume,
                                    broker=args.broker, layout=args.layout,
                                    discard_overrides=args.discard_overrides,
                                    times=args.times)
        counts = {s: sum(v["status"] == s for v in statuses.values())
                  for s in ("graded", "needs_review", "invalid")}
        skipped = len(getattr(course, "skipped", []))
        print(", ".join(f"{n} {s}" for s, n in counts.items())
              + f" of {len(statuses) + skipped}"
              + (f"; {skipped} skipped, graded already (--resume)" if skipped else ""))
        return 0
    if args.command == "feedback":
        lesson = load_lesson(args.lesson)
        from grader.gradebook.deadlines_check import not_yet_due

        pending = not_yet_due(course.deadlines(), lesson.name, time.time())
        if pending and not args.before_due:
            raise CourseError(f"{lesson.name} is not yet due for " + "; ".join(pending[:20])
                              + (f" and {len(pending) - 20} more" if len(pending) > 20 else "")
                              + ": a feedback page gives its student's answers, which a "
                              "classmate who drew the same numbers could still use. Wait, or "
                              "give --before-due to make the pages now")
        if pending:
            course.log(f"note: --before-due: {lesson.name} is not yet due for "
                       + "; ".join(pending[:20]))
        course.feedback(lesson, zips=args.zip)
        if args.exchange is not None:
            from grader.intake import exchange
            from grader.outputs import publish

            publish.release_feedback(course, lesson,
                                     exchange.settings(course, args.exchange, args.course_id))
        return 0
    if args.command == "report":
        from grader.outputs.report import report

        report(course, load_lesson(args.lesson))
        return 0
    if args.command == "review":
        from grader.gradebook.review import command

        return command(course, load_lesson(args.lesson), args)
    if args.command == "similarity":
        from grader.outputs.similarity import similarity

        similarity(course, load_lesson(args.lesson), args.threshold, args.min_shared,
                   args.ignore_common)
        return 0
    if args.command == "export":
        from grader.outputs.export import export, export_per_exercise

        if args.per_exercise:
            if args.format != "csv":
                raise CourseError("--per-exercise writes the csv format (an LMS's import takes "
                                  "one score per lesson): leave out --format, or drop "
                                  "--per-exercise")
            export_per_exercise(course, args.csv or course.root / "grades-per-exercise.csv")
            return 0
        suffix = "" if args.format == "csv" else f"-{args.format}"
        export(course, args.csv or course.root / f"grades{suffix}.csv", args.format,
               args.roster, args.assignments, args.include_flagged,
               lesson=load_lesson(args.lesson).name if args.lesson else None)
        return 0
    if args.command == "demo":
        from grader.lab.server import demo

        return demo(course, load_lesson(args.lesson), fresh=args.fresh, port=args.port)
    if args.command == "lab":
        from grader.lab.server import lab

        return lab(course, args.workspace, smoke=args.smoke, port=args.port,
                   reset=lesson_names(args.reset) if args.reset else [], student=args.student,
                   code=args.code)
    if args.command == "roster":
        from grader.gradebook.identity import roster_command

        roster_command(course, args.files, load_lesson(args.lesson).name if args.lesson else None,
                       args.roster_course_id, args.replace)
        return 0
    if args.command == "variants":
        from grader.gradebook.coursedir import student_codes

        for student, code in student_codes(course, args.students):
            print(f"{student}\t{code}")
        return 0
    if args.command == "progress":
        from grader.lab.progress import progress
        from grader.lab.server import DEFAULT_WORKSPACE, workspace_variants

        workspace = (args.workspace or DEFAULT_WORKSPACE).resolve()
        return progress(workspace, lesson_names(args.lessons),
                        env=workspace_variants(course, workspace))
    raise AssertionError(args.command)
