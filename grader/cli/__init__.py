"""``python -m grader``: the course's command line for instructors (and the student lab): each
command's call into the layer that does the work (its options: grader/cli/parser.py)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from grader.cli.parser import GLOBAL_OPTIONS, USAGE, build_parser
from grader.common.errors import CourseError
from grader.common.faults import Unavailable, damaged_database_line
from grader.common.text import inert
from grader.content.lessons import lesson_names, load_lesson

# The packages of pyproject.toml's `grade` group (and what they import): `make lab` leaves
# them out, so a command that needs one says how to install them.
GRADING_PACKAGES = {"nh3", "latex2mathml", "celery", "kombu", "redis", "psycopg", "copydetect"}


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
        code = run(args)
        sys.stdout.flush()  # here, where a reader gone away is caught (review ... | head)
        return code
    except BrokenPipeError:
        # The reader took what it wanted and went: nothing more to say, and no traceback at
        # exit either (Python flushes standard output again then).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command stopped by SIGPIPE
    except CourseError as error:
        print(f"error: {damaged(error, args) or error}", file=sys.stderr)
        return 2
    except Unavailable as fault:
        print(f"stopped: {inert(str(fault), 400)}. " + (
            "Nothing is charged to a student, and every submission stored so far is stored "
            "whole; when it is back, run the same command with --resume to finish."
            if args.command == "autograde" else "Every file is written whole or not at all; "
            "when it is back, run the same command again."), file=sys.stderr)
        return 3
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] not in GRADING_PACKAGES:
            raise
        print(f"error: {args.command} needs {error.name}, which a student's environment "
              "(make lab) leaves out: install the grading tools with  make setup  (or pip "
              "install -e '.[grade]')", file=sys.stderr)
        return 2
    except Exception as error:
        said = damaged(error, args)
        if not said:
            raise
        print(f"error: {said}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted." + (" Every submission stored so far is stored whole; run the "
                                "same command with --resume to finish."
                                if args.command == "autograde" else ""), file=sys.stderr)
        return 130


def damaged(error: BaseException, args: argparse.Namespace) -> str:
    """One line for a gradebook's database file that is damaged, or ''."""
    from grader.content.lessons import REPO

    return damaged_database_line(error, args.db_url,
                                 args.course_dir or str(REPO / ".course"))


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
    if args.command in ("release", "collect", "demo", "roster"):
        course.writable(args.command)
    if args.command == "release":
        to_exchange = args.exchange is not None
        if to_exchange:
            from grader.intake import exchange
            from grader.outputs import publish

            where = exchange.settings(course, args.exchange, args.course_id, remember=True)
        if args.restore_key:
            from grader.content.variants import fingerprint
            from grader.gradebook.coursestate import restore_key

            key = restore_key(course, Path(args.restore_key))
            course.log(f"the course's key is {fingerprint(key)}, from {args.restore_key}")
            if not args.lessons:
                return 0
        for lesson in lesson_names(args.lessons):
            course.release(lesson, new_key=args.new_key)
            args.new_key = 0  # one new key, then the lessons after it use it
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
        from grader.gradebook.batch import command as autograde

        if args.queue_key is not None and args.broker is None:
            raise CourseError("--queue-key goes with --broker (the workers' queue)")
        course.queue_key = args.queue_key
        return autograde(course, load_lesson(args.lesson), args)
    if args.command == "withdraw":
        from grader.gradebook.withdraw import withdraw

        withdraw(course, load_lesson(args.lesson), args.students, args.reason, args.by)
        return 0
    if args.command == "feedback":
        course.writable("feedback")
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
        course.feedback(lesson, zips=args.zip, remake=args.all)
        if args.exchange is not None:
            from grader.intake import exchange
            from grader.outputs import publish

            publish.release_feedback(course, lesson,
                                     exchange.settings(course, args.exchange, args.course_id))
        return 0
    if args.command == "report":
        from grader.outputs.report import report

        if args.out is None:
            course.writable("report", "give --out DIR to write its files elsewhere")
        report(course, load_lesson(args.lesson), args.out)
        return 0
    if args.command == "review":
        from grader.gradebook.review import command

        if args.accept or args.set or args.total is not None or args.clear \
                or args.clear_total or args.note is not None or args.regrade or args.accept_all:
            course.writable("review with a decision")
        return command(course, load_lesson(args.lesson), args)
    if args.command == "similarity":
        from grader.outputs.similarity import similarity

        if args.out is None:
            course.writable("similarity", "give --out DIR to write its files elsewhere")
        similarity(course, load_lesson(args.lesson), args.threshold, args.min_shared,
                   args.ignore_common, args.out)
        return 0
    if args.command == "export":
        from grader.outputs.export import command as export

        return export(course, args, load_lesson(args.lesson).name if args.lesson else None)
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

        codes = student_codes(course, args.students)
        if args.worksheet is not None:  # refused before anything is printed or written
            from grader.outputs.lms_export import write_worksheet_codes

            if not args.lesson:
                raise CourseError("--worksheet needs the lesson whose Moodle assignment it is: "
                                  "--lesson LESSON")
            lesson = load_lesson(args.lesson).name
            write_worksheet_codes(course, args.worksheet,
                                  args.out or course.root / f"codes-worksheet-{lesson}.csv",
                                  lesson, dict(codes), args.comment_column)
        for student, code in codes:
            print(f"{student}\t{code}")
        if args.csv is not None:
            from grader.gradebook.coursedir import write_codes

            write_codes(course, codes, args.csv)
        return 0
    if args.command == "progress":
        from grader.lab.progress import progress
        from grader.lab.server import DEFAULT_WORKSPACE, workspace_variants

        workspace = (args.workspace or DEFAULT_WORKSPACE).resolve()
        return progress(workspace, lesson_names(args.lessons),
                        env=workspace_variants(course, workspace))
    raise AssertionError(args.command)
