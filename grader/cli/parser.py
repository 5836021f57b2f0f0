"""The command line's options: ``python -m grader``'s parser and usage."""

from __future__ import annotations

import argparse
from pathlib import Path

from grader.common.machine import usable_cores
from grader.grading.limits import Limits
from grader.intake.handins import LAYOUTS


def default_jobs() -> int:
    return usable_cores()

USAGE = """\
python -m grader sync [--check] [LESSON ...]      notebooks <- solutions/, grader/content/cases/,
data/
python -m grader release [LESSON ...]             student versions -> <course-dir>/release/LESSON/
                 [--exchange [DIR]] [--course-id ID]  and to nbgrader's exchange (JupyterHub)
python -m grader collect LESSON                   submissions from the exchange -> collected/
python -m grader autograde LESSON SUBMISSIONS     grade <student_id>/<notebook>.ipynb (folder, zip)
                 [--from LAYOUT] | --collected    or an LMS's download as it came (docs/lms.md)
python -m grader feedback LESSON [--zip] [--all]  HTML feedback per student (--zip: for the LMS,
                 [--exchange [DIR]] [--before-due]  --exchange: the students' Assignment List;
                                                  --all: every page, not just changed grades)
python -m grader export [--format csv|canvas|moodle|moodle-worksheet] [--roster FILE]
                 [--assignments FILE] [--lesson LESSON] [--include-flagged] [--per-exercise]
                 [--per-person] [--csv FILE] [--dry-run]   (--dry-run: what would change in
                                                  the LMS; --per-person: your own records)
python -m grader withdraw LESSON [STUDENT ...] --reason TEXT   remove a batch's grades
python -m grader deadlines [--check]              the deadlines file as read: dates, extensions
python -m grader report LESSON [--out DIR]        pass rates, score histogram, flagged ones
python -m grader similarity LESSON                pairs of alike submissions (a hint, HTML)
                 [--threshold F] [--min-shared N] [--ignore-common N] [--out DIR]
python -m grader review LESSON [STUDENT]          flagged submissions; one student's grading
                 [--accept | --set EXERCISE=POINTS | --total POINTS] [--note TEXT]
                 [--clear EXERCISE] [--clear-total] [--regrade] [--by NAME]
                 [--accept-all --reason TEXT]     accept every open flag for that reason
python -m grader roster [FILE ...]                the course roster: each student's course id and
                 [--lesson LESSON] [--course-id FIELD] [--replace]  the LMS ids standing for them
python -m grader variants [STUDENT ...]           each student's code: their own numbers in
                 [--csv FILE]                     a lab on their own machine (--csv: for mail)
                 [--worksheet FILE --lesson LESSON [--comment-column HEADING] [--out FILE]]
                                                  (Moodle: the codes in its feedback comments)
python -m grader lab [--smoke] [--reset LESSON]   the student workspace in JupyterLab
                 [--student ID [--code CODE]]     your own numbers (set once)
python -m grader progress [LESSON ...]            which of your exercises pass their checks
python -m grader demo LESSON [--fresh]            a lesson's instructor version, for class
python -m grader worker --broker URL --queue-key FILE  run what autograde --broker sends
(every command takes --course-dir DIR (default: .course/ in the repository), --db-url URL
 (default: sqlite:///<course-dir>/gradebook.db; PostgreSQL for several graders) and
 --deadlines FILE (default: <course-dir>/deadlines.toml, if there is one))
"""

# Options every command takes, before or after the command's name.
GLOBAL_OPTIONS = {
    "course_dir": ("--course-dir", "DIR",
                   "where grader state lives (default: .course/ in the repository)"),
    "db_url": ("--db-url", "URL", "the gradebook's database, a SQLAlchemy URL (default: "
               "sqlite:///<course-dir>/gradebook.db); postgresql://... for several graders"),
    "deadlines": ("--deadlines", "FILE", "due dates, extensions and late policy (default: "
                  "<course-dir>/deadlines.toml where it exists; none: no late penalty)"),
}


def build_parser() -> argparse.ArgumentParser:
    """The command line. Each global option may stand before or after the command: the two
    places fill two names, which ``main`` merges (argparse would let a command's default
    overwrite a value given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    parser = argparse.ArgumentParser(prog="python -m grader", usage=USAGE)
    for dest, (flag, metavar, text) in GLOBAL_OPTIONS.items():
        common.add_argument(flag, dest=dest, metavar=metavar, help=text)
        parser.add_argument(flag, dest=f"{dest}_before", metavar=metavar, help=text)
    # prog: a command's --help starts with its own usage, not the whole program's
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", prog="python -m grader")

    sync = commands.add_parser("sync", parents=[common], help="regenerate the lesson notebooks")
    sync.add_argument("lessons", nargs="*", metavar="LESSON")
    sync.add_argument("--check", action="store_true", help="only report what is out of step")

    exchange = argparse.ArgumentParser(add_help=False)
    exchange.add_argument("--exchange", nargs="?", const="", metavar="DIR",
                          help="nbgrader's exchange folder (default: what release --exchange "
                               "was given last, else /srv/nbgrader/exchange)")
    exchange.add_argument("--course-id", metavar="ID",
                          help="the course's id in the exchange, as students' nbgrader_config.py "
                               "names it (default: as last given, else counting-the-cost)")

    release = commands.add_parser("release", parents=[common, exchange],
                                  help="write student versions (and publish them to nbgrader's "
                                       "exchange with --exchange)")
    release.add_argument("lessons", nargs="*", metavar="LESSON")
    keys = release.add_mutually_exclusive_group()
    keys.add_argument("--new-key", action="count", default=0,
                      help="give the course a new key (variants.key; every key it had stays "
                           "as variants.key.FINGERPRINT): students' numbers change from then "
                           "on, and each hand-in is graded on the key its notebook records "
                           "(for a key given out or lost for good, or a course released before "
                           "keys existed)")
    keys.add_argument("--restore-key", metavar="FILE",
                      help="take back a key the course had before (a backup's variants.key, "
                           "or variants.key.FINGERPRINT), the current one kept; with no "
                           "LESSON, releases nothing")

    collect = commands.add_parser(
        "collect", parents=[common, exchange], help="collect submissions from the exchange",
        description="Copy each student's newest submission of LESSON from nbgrader's exchange "
                    "to <course-dir>/collected/ (the notebook, its time and its secret); then "
                    "python -m grader autograde LESSON --collected.")
    collect.add_argument("lesson", metavar="LESSON")
    collect.add_argument("--no-check-owner", action="store_true",
                         help="take submissions whatever user wrote them (default: refuse one "
                              "written by another user than the student it names; a hub whose "
                              "students are all one user, as on Kubernetes, needs this)")

    autograde = commands.add_parser("autograde", parents=[common], help="grade submissions")
    autograde.add_argument("lesson", metavar="LESSON")
    autograde.add_argument("submissions", metavar="SUBMISSIONS", type=Path, nargs="?")
    autograde.add_argument("--collected", action="store_true",
                           help="grade what python -m grader collect took from the exchange "
                                "(<course-dir>/collected/) in place of SUBMISSIONS")
    autograde.add_argument("--jobs", type=int, default=default_jobs(), metavar="N",
                           help="submissions graded at once (default: one per CPU core)")
    autograde.add_argument("--no-sandbox", action="store_true",
                           help="run student code without bubblewrap (only for code you trust)")
    defaults = Limits()
    autograde.add_argument("--cell-timeout", type=int, default=defaults.cell_seconds,
                           metavar="S", help="seconds one cell may run (default: %(default)s)")
    autograde.add_argument("--timeout", type=int, default=defaults.notebook_seconds,
                           metavar="S", help="seconds one notebook may take (default: %(default)s)")
    autograde.add_argument("--memory", type=int, default=defaults.memory_bytes // 2**30,
                           metavar="GIB", help="memory of one kernel (default: %(default)s GiB)")
    autograde.add_argument("--plots", action="store_true",
                           help="draw the notebooks' plots into the graded copies and feedback "
                                "pages (default: a line in place of each; drawing costs one to "
                                "three seconds a hand-in)")
    autograde.add_argument("--partial-credit", action="store_true",
                           help="an exercise scores its points times the fraction of its checks "
                                "passed (default: all or nothing)")
    autograde.add_argument("--resume", action="store_true",
                           help="skip students whose stored grade is of this very notebook")
    autograde.add_argument("--from", dest="layout", choices=LAYOUTS, metavar="LAYOUT",
                           help="how SUBMISSIONS is laid out: " + ", ".join(LAYOUTS)
                                + " (default: recognised from its files)")
    autograde.add_argument("--discard-overrides", action="store_true",
                           help="drop the review decisions of each student graded (default: "
                                "kept, and applied to the new grades)")
    autograde.add_argument("--times", type=Path, metavar="FILE",
                           help="each hand-in's time, for the late policy: a CSV student_id,"
                                "submitted_at, Moodle's grading worksheet as it comes, or "
                                "Canvas's submissions API JSON (default: what the download "
                                "gives, if anything; never a zip's member times)")
    autograde.add_argument("--broker", metavar="URL",
                           help="send submissions to workers on this Celery broker "
                                "(redis://:PASSWORD@HOST:PORT/0) instead of grading here")
    autograde.add_argument("--queue-key", type=Path, metavar="FILE",
                           help="with --broker: the key the coordinator and its workers sign "
                                "with (default: <course-dir>/queue.key, made at first use)")

    feedback = commands.add_parser("feedback", parents=[common, exchange],
                                   help="HTML feedback pages (and to the students' Assignment "
                                        "List with --exchange)")
    feedback.add_argument("lesson", metavar="LESSON")
    feedback.add_argument("--before-due", action="store_true",
                          help="make the pages although the lesson is not yet due for someone "
                               "(default: refused until every due date and extension is past)")
    feedback.add_argument("--zip", action="store_true",
                          help="also what the students' LMS takes back: Moodle's feedback zip, "
                               "Canvas's folders, else one zip per student")
    feedback.add_argument("--all", action="store_true",
                          help="make every page again (default: only the pages of students "
                               "whose grades changed since their page was made)")

    report = commands.add_parser("report", parents=[common],
                                 help="pass rates, score histogram, flagged submissions")
    report.add_argument("lesson", metavar="LESSON")
    report.add_argument("--out", type=Path, metavar="DIR",
                        help="where to write the report's files (default: "
                             "<course-dir>/reports/LESSON/)")

    similar = commands.add_parser(
        "similarity", parents=[common], help="pairs of submissions with alike exercise code",
        description="Compare every pair of graded submissions' exercise code (the released "
                    "starter code left out) and write reports/LESSON/similarity.html, the "
                    "shared fragments side by side: a hint for a human, not a finding.")
    similar.add_argument("lesson", metavar="LESSON")
    similar.add_argument("--threshold", type=float, default=0.8, metavar="F",
                         help="list a pair when this share of either student's code is also "
                              "in the other's (default: %(default)s)")
    similar.add_argument("--min-shared", type=int, default=20, metavar="N",
                         help="and they share at least N fingerprints, a few lines "
                              "(default: %(default)s)")
    similar.add_argument("--ignore-common", type=int, default=10, metavar="N",
                         help="leave out fragments found in more than N submissions, as MOSS "
                              "does; 0 keeps them all (default: %(default)s)")
    similar.add_argument("--out", type=Path, metavar="DIR",
                         help="where to write similarity.html and .csv (default: "
                              "<course-dir>/reports/LESSON/; a read-only course needs one)")

    review = commands.add_parser(
        "review", parents=[common], help="flagged submissions, and the instructor's decisions",
        description="Without STUDENT: the flagged submissions of LESSON with their reasons and "
                    "what was decided. With STUDENT and no option: that student's grading and "
                    "review log. With options: a decision, kept with who made it and when.")
    review.add_argument("lesson", metavar="LESSON")
    review.add_argument("student", nargs="?", metavar="STUDENT")
    review.add_argument("--accept", action="store_true",
                        help="the computed score stands (settles the flag)")
    review.add_argument("--set", action="append", default=[], metavar="EXERCISE=POINTS",
                        help="score EXERCISE at POINTS (repeatable; needs --note)")
    review.add_argument("--total", metavar="POINTS",
                        help="score the whole lesson at POINTS (needs --note)")
    review.add_argument("--clear", action="append", default=[], metavar="EXERCISE",
                        help="back to the computed score of EXERCISE (repeatable)")
    review.add_argument("--clear-total", action="store_true",
                        help="back to the lesson's computed total")
    review.add_argument("--note", metavar="TEXT",
                        help="why: shown to the student on their feedback page")
    review.add_argument("--by", metavar="NAME",
                        help="who decides (default: your user name on this machine)")
    review.add_argument("--regrade", action="store_true",
                        help="grade the student's stored notebook again (decisions are kept)")
    review.add_argument("--discard-overrides", action="store_true",
                        help="with --regrade: drop the student's review decisions")
    review.add_argument("--no-sandbox", action="store_true",
                        help="with --regrade: as autograde --no-sandbox")
    review.add_argument("--partial-credit", action="store_true",
                        help="with --regrade: as autograde --partial-credit")
    review.add_argument("--accept-all", action="store_true",
                        help="without STUDENT: accept the computed score of every open "
                             "needs_review flag whose every reason contains a --reason TEXT")
    review.add_argument("--reason", metavar="TEXT", action="append",
                        help="with --accept-all: the expected reason, e.g. \"in place of\" "
                             "for a notebook the browser renamed (repeatable: every reason of "
                             "a flag it accepts contains one of them)")

    withdraw = commands.add_parser(
        "withdraw", parents=[common], help="remove a batch's grades (graded as the wrong "
                                           "lesson, say), with a reason kept in the review log",
        description="Remove the grades of LESSON (of the STUDENTs named, else of everyone): "
                    "nbgrader's submissions, the grader's statuses, submission times, feedback "
                    "pages and LMS feedback zips, the review decisions in force. The review log "
                    "keeps a row per student with --reason; the hand-ins stored stay.")
    withdraw.add_argument("lesson", metavar="LESSON")
    withdraw.add_argument("students", nargs="*", metavar="STUDENT")
    withdraw.add_argument("--reason", required=True, metavar="TEXT",
                          help="why, kept in the review log")
    withdraw.add_argument("--by", metavar="NAME",
                          help="who withdraws (default: your user name on this machine)")

    deadlines = commands.add_parser(
        "deadlines", parents=[common], help="the deadlines file as read, and its mistakes",
        description="Read the deadlines file (--deadlines FILE, else <course-dir>/"
                    "deadlines.toml) as every command does: print each lesson's due date and "
                    "policy and each extension with the student it was given to, and every "
                    "warning. A bad value is an error (exit 2).")
    deadlines.add_argument("--check", action="store_true",
                           help="exit 1 when there is a warning (a lesson the course does not "
                                "have, an extension that names no student)")

    export = commands.add_parser("export", parents=[common], help="grades as CSV")
    export.add_argument("--csv", type=Path, metavar="FILE",
                        help="where to write (default: <course-dir>/grades[-FORMAT].csv)")
    export.add_argument("--format", choices=("csv", "canvas", "moodle", "moodle-worksheet"),
                        default="csv",
                        help="csv: one row per student and lesson; canvas, moodle: the LMS's "
                             "grade import file, a file per lesson, a row per student with a "
                             "score; moodle-worksheet: the lesson's Moodle grading worksheet "
                             "(--roster) filled in, for the assignment's own upload")
    export.add_argument("--roster", type=Path, metavar="FILE", action="append",
                        help="the LMS's identifiers of each student: a CSV with a student_id "
                             "column, Canvas's gradebook export or Moodle's grading worksheet "
                             "(docs/lms.md); give it once per file (Moodle: one per lesson)")
    export.add_argument("--assignments", type=Path, metavar="FILE",
                        help="CSV lesson,title,id,points: the LMS assignment of each lesson "
                             "(needed for canvas; points scale the scores)")
    export.add_argument("--include-flagged", action="store_true",
                        help="write the computed scores of needs_review submissions "
                             "(default: left out and listed)")
    export.add_argument("--lesson", metavar="LESSON",
                        help="this lesson only (moodle-worksheet: the worksheet's lesson)")
    export.add_argument("--dry-run", action="store_true",
                        help="write nothing: show what each student's grade in the file "
                             "would become against the file written last time")
    export.add_argument("--per-exercise", action="store_true",
                        help="one row per student, lesson and exercise (csv format only; "
                             "default file: <course-dir>/grades-per-exercise.csv)")
    export.add_argument("--per-person", action="store_true",
                        help="one row per person across lessons, joined by course id: name, "
                             "e-mail, each lesson's score, total (csv only; default file: "
                             "<course-dir>/grades-per-person.csv)")

    worker = commands.add_parser("worker", parents=[common],
                                 help="run submissions that autograde --broker sends")
    worker.add_argument("--broker", required=True, metavar="URL",
                        help="the Celery broker, e.g. redis://:PASSWORD@HOST:6379/0")
    worker.add_argument("--queue-key", type=Path, required=True, metavar="FILE",
                        help="a copy of the coordinator's queue.key (in its course directory): "
                             "the worker runs only what it signs, and signs what it sends back")
    worker.add_argument("--concurrency", type=int, default=default_jobs(), metavar="N",
                        help="submissions run at once (default: one per CPU core)")
    worker.add_argument("--visibility-timeout", type=int, default=900, metavar="S",
                        help="seconds before a task taken by a worker that vanished is handed "
                             "out again (default: %(default)s; above the longest --timeout)")

    demo = commands.add_parser("demo", parents=[common],
                               help="open a lesson's instructor version in JupyterLab")
    demo.add_argument("lesson", metavar="LESSON")
    demo.add_argument("--fresh", action="store_true", help="start from a new copy")
    demo.add_argument("--port", type=int, default=0, help="port (default: any free one)")

    lab = commands.add_parser("lab", parents=[common], help="open the course in JupyterLab")
    lab.add_argument("--workspace", type=Path, metavar="DIR",
                     help="where your copies of the lessons live (default: workspace/)")
    lab.add_argument("--smoke", action="store_true",
                     help="headless check: start the server, list the lessons, validate one, stop")
    lab.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    lab.add_argument("--reset", nargs="+", default=[], metavar="LESSON",
                     help="set your copy of LESSON aside (renamed, not deleted) and start again")
    lab.add_argument("--student", metavar="ID",
                     help="your student id, as your course knows it: the graded predictions "
                          "ask about your own numbers (remembered: set it once)")
    lab.add_argument("--code", metavar="CODE",
                     help="on a machine of your own: the code your instructor gave you "
                          "(python -m grader variants), which carries your numbers")
    roster = commands.add_parser(
        "roster", parents=[common], help="the course roster: each student's course id",
        description="Read each FILE (our CSV with a student_id column, Canvas's gradebook "
                    "export, or a Moodle grading worksheet) into the course roster: each "
                    "student's course id (the id they work under in the lab) and the LMS ids "
                    "that stand for them. Without FILE: list the roster.")
    roster.add_argument("files", nargs="*", type=Path, metavar="FILE")
    roster.add_argument("--lesson", metavar="LESSON",
                        help="a Moodle worksheet's lesson (its participant ids are that "
                             "assignment's)")
    roster.add_argument("--course-id", dest="roster_course_id", metavar="FIELD",
                        help="the column that is each student's course id: student_id, email, "
                             "username, sis_login_id, sis_user_id, id_number or lms_id "
                             "(default: student_id; Canvas: sis_login_id; Moodle: email)")
    roster.add_argument("--replace", action="store_true",
                        help="put these files in place of the whole roster")
    variants = commands.add_parser("variants", parents=[common],
                                   help="each student's code for a lab on their own machine")
    variants.add_argument("students", nargs="*", metavar="STUDENT",
                          help="(default: every student of the course roster, else of the "
                               "gradebook)")
    variants.add_argument("--csv", type=Path, metavar="FILE",
                          help="also write course_id, name, email, code (the roster's names "
                               "and e-mails) to FILE, for a mail merge")
    variants.add_argument("--worksheet", type=Path, metavar="FILE",
                          help="a Moodle assignment's grading worksheet, as downloaded: write "
                               "it back with each participant's code in the feedback comment, "
                               "for its Upload grading worksheet (with --lesson)")
    variants.add_argument("--lesson", metavar="LESSON",
                          help="the lesson whose Moodle assignment the worksheet is")
    variants.add_argument("--comment-column", metavar="HEADING",
                          help="the worksheet's feedback comment column, where it is not "
                               "'Feedback comments' (a worksheet in another language)")
    variants.add_argument("--out", type=Path, metavar="FILE",
                          help="where --worksheet writes (default: <course-dir>/"
                               "codes-worksheet-LESSON.csv)")

    progress = commands.add_parser("progress", parents=[common],
                                   help="which exercises of your workspace pass their checks")
    progress.add_argument("lessons", nargs="*", metavar="LESSON")
    progress.add_argument("--workspace", type=Path, metavar="DIR",
                          help="where your copies of the lessons live (default: workspace/)")
    return parser
