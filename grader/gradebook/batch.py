"""Grading a class: the hand-ins received, each graded (here, on ``jobs`` threads, or on
workers) and stored as one unit as soon as it is graded; a fault of the infrastructure stops
the batch early, and --resume finishes it."""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from datetime import UTC
from pathlib import Path
from typing import NamedTuple

from grader.common.errors import CourseError
from grader.common.faults import (
    Unavailable,
    check_space,
    database_name,
    is_database_error,
    retrying,
)
from grader.common.text import display_name, inert, valid_student_id
from grader.content.lessons import Lesson
from grader.content.variants import Draw, variants_of
from grader.gradebook import deadlines as deadlines_mod
from grader.gradebook import ledger
from grader.gradebook import store as storage
from grader.gradebook import times as stored_times
from grader.gradebook.checks import version_of
from grader.gradebook.coursestate import key_ring, refuse_keyless_grading
from grader.gradebook.grades import _iso
from grader.gradebook.identity import identify_handins
from grader.gradebook.lock import lesson_lock
from grader.gradebook.progress import Progress
from grader.gradebook.received import batch_folder, other_lesson, receive, unpacked
from grader.grading.autograde import Graded, grade_submission
from grader.grading.limits import Limits
from grader.grading.probe import exercises
from grader.grading.processes import Cgroup
from grader.grading.sandbox import bwrap_path
from grader.intake import times as handin_times
from grader.intake.handins import LABELS, Handin, recognise
from grader.intake.zips import Received


class How(NamedTuple):
    """How a batch grades: the sandbox's limits and the rest of autograde's options."""

    limits: Limits
    partial: bool
    use_sandbox: bool
    broker: str | None
    jobs: int
    key: bytes | None = None  # the course's key (each student's own numbers); None: defaults
    ring: dict[str, bytes] | None = None  # every key the course keeps, by fingerprint


def command(course, lesson: Lesson, args) -> int:
    """``python -m grader autograde``, as the command line's ``args`` ask; its summary."""
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
                              f"python -m grader collect {lesson.name} first")
        args.submissions, args.layout = course.root / COLLECTED, args.layout or "nbgrader"
    limits = Limits(cell_seconds=args.cell_timeout, notebook_seconds=args.timeout,
                    memory_bytes=args.memory * 2**30, plots=args.plots)
    statuses = course.autograde(lesson, args.submissions, jobs=args.jobs,
                                use_sandbox=not args.no_sandbox, limits=limits,
                                partial=args.partial_credit, resume=args.resume,
                                broker=args.broker, layout=args.layout,
                                discard_overrides=args.discard_overrides, times=args.times)
    print(summary(course, lesson, statuses))
    return 0


def autograde(course, lesson: Lesson, submissions: Path, jobs: int = 1,
              use_sandbox: bool = True, limits: Limits | None = None,
              partial: bool = False, resume: bool = False, broker: str | None = None,
              layout: str | None = None, keep_handins: bool = False,
              discard_overrides: bool = False, by: str | None = None,
              times: Path | None = None) -> dict[str, dict[str, str]]:
    """Grade every student's notebook in ``submissions``: a folder or a zip, in the
    grader's own layout or as an LMS delivers it (``layout``: see grader/intake/handins.py;
    recognised from the files when None). ``keep_handins``: what an earlier download said
    of each hand-in (name, late mark, layout) stands (a regrade of stored notebooks).
    The review decisions in force for a student are kept and applied to the new grades,
    unless ``discard_overrides`` (logged as ``by``'s decision). Each hand-in's submission
    time is stored (grader/gradebook/deadlines.py): from ``times`` (the instructor's timestamps
    file) where it names the student, else what the layout gives. One batch of a lesson at
    a time (grader/gradebook/lock.py): another one is refused in one line."""
    if not submissions.exists():
        raise CourseError(f"no such submissions folder or zip: {submissions}")
    if use_sandbox and bwrap_path() is None:
        raise CourseError(
            "bubblewrap (bwrap) is not installed, so student code cannot be sandboxed. "
            "Install it (Debian/Ubuntu: apt-get install bubblewrap; it needs Linux), or pass "
            "--no-sandbox to run student code with your own rights (only for code you trust)")
    course.writable("autograde")
    with lesson_lock(course, lesson.name, "regrade" if keep_handins else "autograde"):
        if not use_sandbox:
            print("warning: --no-sandbox: student code runs with your rights and can read, "
                  "change or delete your files", file=sys.stderr)
        deadlines = course.deadlines()
        stamped = deadlines_mod.times_file(times, deadlines.zone if deadlines else None) \
            if times is not None else {}
        with unpacked(submissions, course.root) as received:
            return _autograde(course, lesson, submissions, received, layout, keep_handins,
                              stamped, deadlines, resume, (discard_overrides, by),
                              How(limits or Limits(), partial, use_sandbox, broker, jobs))


def _autograde(course, lesson: Lesson, submissions: Path, received, layout: str | None,
               keep_handins: bool, stamped: dict, deadlines, resume: bool,
               review: tuple[bool, str | None], how: How) -> dict[str, dict[str, str]]:
    """The batch, its hand-ins received: recognised, their times stored, each graded."""
    layout, handins, notes = recognise(received.root, lesson.name, lesson.notebook.name,
                                       layout, received.refused_members,
                                       display_name(str(submissions)))
    received.notes += notes
    if not handins:
        refused = "".join(f"\n  {note}" for note in received.notes[:20])
        raise CourseError(f"{display_name(str(submissions))} holds no hand-ins "
                          f"(read as {LABELS[layout]}; expected SUBMISSIONS/<student_id>/"
                          "<notebook>.ipynb, or an LMS's download as it came)" + refused)
    wrong = "" if keep_handins else other_lesson(handins, lesson)
    if wrong:
        raise CourseError(wrong)
    if not course.is_released(lesson):
        course.release(lesson)
    key = course.key()  # checked against the gradebook's; None: everyone's numbers the defaults
    how = how._replace(key=key, ring=key_ring(course.root) if key is not None else {})
    varies = key is not None and bool(variants_of(lesson))
    trial = Cgroup.create(Limits()) if how.use_sandbox else None
    if trial is not None:
        trial.remove()
    elif how.use_sandbox:
        course.log(f"note: no cgroup for the kernels ({Cgroup.unavailable_reason}): memory "
                   "limits do not count shared memory, and a busy submission can slow the "
                   "one graded beside it (docs/instructor.md, 'How a submission is graded')")
    late = sum(h.late for h in handins)
    course.log(f"recognised {LABELS[layout]}: {len(handins)} student(s)"
               + (f", {late} marked late" if late else "")
               + ("" if layout in ("folders", "nbgrader") else
                  " (override with --from if that is wrong)"))
    for note in received.notes:
        course.log(note)
    if not keep_handins:  # a regrade keeps the time of the original hand-in
        try:
            store_times(course, lesson, layout, handins, received, stamped, deadlines)
        except Exception as error:  # the grades matter more than the times
            course.log(f"note: the submission times could not be stored "
                       f"({type(error).__name__}: {inert(str(error), 200)}); no late "
                       "penalty can be computed for this batch")
    before = course.statuses(lesson.name).get(lesson.name, {})
    kept = {h.student_id: before.get(h.student_id, {}).get("handin") or {} for h in handins}
    identify_handins(course, lesson, layout, handins, kept, varies, keep_handins)
    if key is None and variants_of(lesson):
        refuse_keyless_grading(course, [h.notebook for h in handins if h.notebook])
    course.handins[lesson.name] = {h.student_id: h.record(layout) for h in handins}
    for handin in handins:  # a regrade: what the download said of it, its flags included
        if keep_handins and kept[handin.student_id]:
            course.handins[lesson.name][handin.student_id] = {
                **kept[handin.student_id], "course_id": handin.course_id,
                "group": handin.group}
            handin.reasons[:0] = [r for r in kept[handin.student_id].get("reasons") or []
                                  if isinstance(r, str) and r not in handin.reasons]
    progress = Progress(len(handins), course.log, course.handins[lesson.name])
    statuses: dict[str, dict[str, str]] = {}
    course.skipped = []
    try:
        with batch_folder(course.root) as private:
            grade_batch(course, lesson, handins, (read_stored(course, lesson), resume),
                        review, progress, statuses, private, *how)
    finally:
        progress.finish()
        course.record_statuses(lesson, statuses)
    return statuses


NAMES = ("name", "email", "download_name")  # what a skipped hand-in's row takes from this batch


def _refresh_names(course, lesson: Lesson, student_id: str, record: dict) -> None:
    """A student --resume skips keeps their grade, and takes the names this batch read (a
    roster given since, a download's names read better), as a regrade would."""
    kept = record.get("handin")
    now = course.handins.get(lesson.name, {}).get(student_id)
    if not isinstance(kept, dict) or not now or all(kept.get(f) == now.get(f) for f in NAMES):
        return
    retrying(lambda: ledger.refresh_handin(course.db_url, lesson.name, student_id,
                                           {**kept, **{f: now.get(f) for f in NAMES}}),
             what=f"the gradebook's database ({database_name(course.db_url)})",
             is_transient=is_database_error, log=course.log)


def read_stored(course, lesson: Lesson) -> dict[str, dict]:
    """What the ledger holds for ``lesson``, read once for --resume (waiting a while for a
    database that does not answer)."""
    if not course.has_gradebook():
        return {}
    return retrying(lambda: ledger.read(course.db_url, lesson.name).get(lesson.name, {}),
                    what=f"the gradebook's database ({database_name(course.db_url)})",
                    is_transient=is_database_error, log=course.log)


def summary(course, lesson: Lesson, statuses: dict[str, dict[str, str]]) -> str:
    """The batch in a line: how many graded, flagged and invalid, the flags your review
    decisions (kept) settle already, and those --resume skipped."""
    from grader.gradebook.decisions import states

    counts = {s: sum(v["status"] == s for v in statuses.values())
              for s in ("graded", "needs_review", "invalid")}
    decided = states(course.db_url, lesson.name) if counts["needs_review"] + \
        counts["invalid"] else {}
    settled = {s: sum(v["status"] == s and decided.get((lesson.name, student)) is not None
                      and decided[(lesson.name, student)].resolved
                      for student, v in statuses.items()) for s in counts}
    skipped = len(getattr(course, "skipped", []))
    return (", ".join(f"{n} {s}" + (f" ({settled[s]} settled by review decisions, kept)"
                                    if settled[s] else "") for s, n in counts.items())
            + f" of {len(statuses) + skipped}"
            + (f"; {skipped} skipped, graded already (--resume)" if skipped else ""))


def grade_batch(course, lesson: Lesson, handins: list[Handin],
                stored: tuple[dict[str, dict], bool], review: tuple[bool, str | None],
                progress: Progress, statuses: dict[str, dict[str, str]], private: Path,
                limits: Limits, partial: bool, use_sandbox: bool, broker: str | None,
                jobs: int, key: bytes | None = None,
                ring: dict[str, bytes] | None = None) -> None:
    """Receive, grade and store each hand-in, ``jobs`` at once. Each submission is stored
    as one unit as soon as it is graded. A fault of the grader's own infrastructure (the
    database, the broker, the disk: grader/common/faults.py) stops the batch early: what is
    stored stays, nothing is charged to a student, and --resume finishes the rest.
    ``stored``: the ledger's rows of the lesson, and whether to skip a student whose row is
    of the very notebook handed in, graded with the lesson's checks as they are now, on the
    same student's numbers (a roster given since changes whose they are; a key kept, the key
    the notebook records, which they are)."""
    pending = []
    records, resume = stored
    version = course.checks_version(lesson)
    same, other_checks = [], Counter()
    for handin in handins:
        check_space([course.root, Path(tempfile.gettempdir())])
        early = receive(course, lesson, handin, private, key, ring or {},
                        records.get(handin.student_id))
        if isinstance(early, Graded):
            statuses[early.student_id] = progress.done(
                storage.store_submission(course, lesson, early, review)).outcome()
            continue
        record = records.get(handin.student_id, {})
        if record.get("notebook_sha256") != early[3] \
                or record.get("drawn_for", early[4].student) != early[4].student \
                or record.get("drawn_with", early[4].course) != early[4].course:
            pending.append(early)
        elif version_of(record) == version:
            same.append(handin.student_id)
            if resume:
                progress.skip(handin.student_id)  # the same notebook, the same checks
                course.skipped.append(handin.student_id)
                _refresh_names(course, lesson, handin.student_id, record)
            else:
                pending.append(early)
        else:
            other_checks[version_of(record) or "not recorded"] += 1
            pending.append(early)
    if other_checks:
        course.log(f"{sum(other_checks.values())} of these very notebooks were graded with "
                   f"other checks than the lesson's now ({version}; theirs: "
                   + ", ".join(f"{v}: {n}" for v, n in other_checks.most_common())
                   + "): graded again" + ("" if resume else " (as everyone is without "
                                                            "--resume)"))
    if same and not resume:
        course.log(f"note: {len(same)} of {len(handins)} were graded from these very notebooks "
                   "with these checks already: --resume skips them (grading everyone again "
                   "now)")

    drawn = {item[0]: item[4] for item in pending}

    def store(graded: Graded, digest: str) -> None:
        graded.notebook_sha256 = digest
        if graded.student_id in drawn:
            graded.drawn_for = drawn[graded.student_id].student
            graded.drawn_with = drawn[graded.student_id].course or None
        with course.gradebook_lock:
            storage.store_submission(course, lesson, graded, review)
        statuses[graded.student_id] = progress.done(graded).outcome()

    if broker is not None:
        grade_on_workers(course, lesson, pending, limits, partial, use_sandbox, broker, store,
                         jobs)
        return

    def work(item: tuple[str, Path, list[str], str, Draw]) -> tuple[Graded, str]:
        student_id, notebook, notes, digest, drawn = item
        check_space([course.root, Path(tempfile.gettempdir())])
        try:
            graded = grade_submission(notebook, "; ".join(notes), lesson, student_id,
                                      course.db_url, limits, use_sandbox,
                                      course.gradebook_lock, partial, drawn)
        except Unavailable:
            raise
        except Exception as error:  # a bug of ours must not stop the batch
            graded = Graded(student_id, "needs_review", [
                f"grading error: {type(error).__name__}: {error}"[:500]])
        if graded.status != "graded" and any("grading error" in r for r in graded.reasons):
            check_space([course.root, Path(tempfile.gettempdir())])  # the disk, not the code
        return graded, digest

    if pending:  # the expected values, computed once here rather than by each thread at once
        exercises(lesson)
    stop: Unavailable | None = None
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = [pool.submit(work, item) for item in pending]
    try:
        for future in as_completed(futures):
            try:
                graded, digest = future.result()
                if stop is None:
                    store(graded, digest)
            except Unavailable as fault:
                if stop is None:
                    stop = fault
                    for other in futures:
                        other.cancel()
            except CancelledError:
                continue
    finally:  # interrupted (Ctrl-C, SIGTERM) or stopped: no new submission starts
        pool.shutdown(wait=True, cancel_futures=True)
    if stop is not None:
        raise stop


def grade_on_workers(course, lesson: Lesson, pending: list, limits: Limits, partial: bool,
                      use_sandbox: bool, broker: str,
                      store: Callable[[Graded, str], None], jobs: int) -> None:
    """Prepare each submission here, run it on the queue's workers, judge it here (``jobs``
    at once: judging may run kernels here, for exercises judged again)."""
    from grader.grading.autograde import Prepared, prepare_submission
    from grader.grading.distributed import QUEUE_KEY, grade_on_workers, make_app, queue_key

    key_path = course.queue_key or course.root / QUEUE_KEY
    signing = queue_key(key_path, create=course.queue_key is None)
    app = make_app(broker, visibility_timeout=limits.notebook_seconds + 600)
    digests = {}

    def prepared() -> Iterator[Prepared]:
        """Each submission prepared as the queue has room for it (a class of thousands is not
        held in memory at once); what cannot be graded, stored as it is found."""
        for student_id, notebook, notes, digest, drawn in pending:
            try:
                ready = prepare_submission(notebook, "; ".join(notes), lesson, student_id,
                                           course.db_url, course.gradebook_lock, drawn)
            except Unavailable:
                raise
            except Exception as error:  # one notebook must not stop the class
                ready = Graded(student_id, "needs_review", [
                    f"grading error: {type(error).__name__}: {error}"[:500]])
            if isinstance(ready, Graded):
                store(ready, digest)
            else:
                digests[student_id] = digest
                yield ready

    grade_on_workers(app, lesson, prepared(), limits, partial, use_sandbox,
                     lambda graded: store(graded, digests.get(graded.student_id, "")),
                     course.log, judges=jobs, key=signing,
                     start_worker=worker_command(broker, Path(key_path).resolve()))


def worker_command(broker: str, key: Path) -> str:
    """The command that starts a worker for this batch, as the instructor types it on a
    grading machine (the broker's password left out of what is printed)."""
    import shlex

    from kombu.utils.url import maybe_sanitize_url

    shown = maybe_sanitize_url(broker)
    return (f"python -m grader worker --broker {shlex.quote(shown)} --queue-key "
            f"{shlex.quote(str(key))}" + ("  (with the broker's password in the URL)"
                                         if shown != broker else ""))


def store_times(course, lesson: Lesson, layout: str, handins: list[Handin],
                 received: Received, stamped: dict[str, tuple[float, str]],
                 deadlines) -> None:
    """Each hand-in's submission time, from what can be trusted, best first: the
    instructor's timestamps file (``--times``: our CSV, Moodle's grading worksheet, Canvas's
    submissions JSON), Gradescope's ``created_at``, Blackboard's attempt date, a
    ``timestamp.txt`` our own collect wrote (grader/intake/exchange.py), Canvas's LATE mark.
    Never a zip member's time (an LMS stamps its zip when it is made: Moodle's "Download
    all submissions" gives every file the time of the download) nor a ``timestamp.txt``
    the student wrote (``nbgrader collect`` copies it as the student left it): those
    hand-ins have no time and pay no penalty, and a student's own stamp is flagged for a
    look where the lesson has a due date. Says where the times came from."""
    from collections import Counter
    from datetime import datetime

    from grader.intake.exchange import COLLECTED

    zone = deadlines.zone if deadlines else None
    due = deadlines is not None and lesson.name in deadlines.due
    ours = _same_folder(received.root, course.root / COLLECTED)
    rows, counts = {}, Counter()
    for handin in handins:
        if not valid_student_id(handin.student_id):
            continue
        at, source = handin.submitted_at, handin.time_source
        if handin.student_id in stamped:
            at, source = stamped[handin.student_id]
        elif layout == "nbgrader" and at is not None and ours:
            source = "timestamp.txt (written by python -m grader collect)"
        elif layout == "nbgrader" and at is not None:
            claimed = _iso(datetime.fromtimestamp(at, UTC)) \
                if handin_times.plausible(at) else "a time out of range"
            at, source = None, (f"none: timestamp.txt says {claimed}, but the student wrote"
                                " it (not python -m grader collect)")
            if due:
                handin.reasons.append(
                    f"its timestamp.txt says {claimed}, but the student's side wrote it "
                    "(nbgrader collect copies it as the student left it), so no late penalty"
                    " is charged: give the time with --times FILE, or collect with python "
                    "-m grader collect")
        elif at is None and handin.local_time:
            at = handin_times.naive_time(handin.local_time, zone, "Blackboard's date")
            source = "Blackboard's attempt date" if at is not None else \
                "none: Blackboard's attempt date, with no timezone in the deadlines file " \
                "to read it in"
        if at is None and not source:
            source = "Canvas's LATE mark" if handin.late else (
                "Canvas: not marked late" if layout == "canvas" else
                f"none: no submission time in {LABELS[layout]}")
        rows[handin.student_id] = {"submitted_at": at, "source": source,
                                   "late_mark": handin.late}
        counts[f"from {source}" if at is not None else "" if source.startswith("none")
               else {"Canvas's LATE mark": "marked late by Canvas, time unknown",
                     "Canvas: not marked late": "not marked late by Canvas"}.get(
                         source, source)] += 1
    stored_times.write_times(course.db_url, lesson.name, rows)
    hint = {"moodle": "give Moodle's grading worksheet with --times FILE",
            "canvas": "give Canvas's submissions API JSON with --times FILE",
            "nbgrader": "collect with python -m grader collect, or give --times FILE",
            "blackboard": "set timezone in the deadlines file",
            }.get(layout, "give a CSV student_id,submitted_at with --times FILE")
    unknown = counts.pop("", 0)
    course.log("submission times: " + ", ".join(
        [f"{n} {what}" for what, n in counts.most_common()]
        + ([f"{unknown} unknown, so no late penalty for them ({hint})"] if unknown else [])))


def _same_folder(one: Path, other: Path) -> bool:
    try:
        return Path(one).resolve() == Path(other).resolve()
    except OSError:
        return False
