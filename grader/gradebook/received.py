"""A batch's hand-ins as it receives them: a zip unpacked for the batch, each notebook copied
in and hashed, and the bytes that were hashed kept in the batch's own folder, which is what is
graded (so that nothing written to ``submitted/`` meanwhile can be graded under another
notebook's hash). Folders left by a batch that was killed go at the next one. And a batch of
hand-ins of another lesson is refused before anything is graded or stored."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.faults import Unavailable, describe, is_disk_error, process_alive
from grader.common.files import remove_tree
from grader.common.text import display_name, valid_student_id
from grader.content.lessons import Lesson, all_lessons
from grader.content.variants import Draw, lesson_draw
from grader.gradebook.coursestate import handin_key
from grader.gradebook.identity import draw_student
from grader.grading.autograde import Graded
from grader.intake.handins import Handin
from grader.intake.lms_names import named_by_lms
from grader.intake.zips import Received, copy_notebook, unpack_zip

UNZIP = "unzip-"  # a zip's members, unpacked in the course directory for one batch
BATCH = "batch-"  # a batch's own copies of the notebooks it grades
LEFTOVER_SECONDS = 6 * 3600  # a batch's folder of no known process, untouched this long


@contextmanager
def unpacked(submissions: Path, course_root: Path) -> Iterator[Received]:
    """The submissions as a folder of student folders; a zip is unpacked safely first."""
    try:
        is_folder = submissions.is_dir()
    except OSError as error:
        raise CourseError(f"cannot read {display_name(str(submissions))}: "
                          f"{error.strerror}") from None
    if is_folder:
        yield Received(submissions)
        return
    if not zipfile.is_zipfile(submissions):
        raise CourseError(f"{display_name(str(submissions))} is neither a folder nor a zip file")
    with batch_folder(course_root, UNZIP) as tmp:
        yield unpack_zip(submissions, tmp, named_by_lms)


@contextmanager
def batch_folder(course_root: Path, prefix: str = BATCH) -> Iterator[Path]:
    """A folder of this batch's own in the course directory (readable by the grader alone, as
    the course directory is), removed when the batch ends; one a killed batch left is removed
    by the next (``remove_leftovers``)."""
    remove_leftovers(course_root)
    try:
        tmp = Path(tempfile.mkdtemp(dir=course_root, prefix=f"{prefix}{socket.gethostname()}-"
                                                            f"{os.getpid()}-"))
    except OSError as error:
        if is_disk_error(error):
            raise Unavailable(f"the disk holding {course_root} cannot be written",
                              describe(error)) from error
        raise
    try:
        yield tmp
    finally:
        remove_tree(tmp)


def remove_leftovers(course_root: Path) -> list[str]:
    """Remove the folders of batches that were killed (SIGKILL leaves them, holding students'
    files): those of this machine whose process is gone, and any of no known process left
    untouched for hours. Another grader's live batch keeps its folder."""
    removed = []
    host = socket.gethostname()
    for prefix in (UNZIP, BATCH):
        for folder in course_root.glob(f"{prefix}*"):
            name = folder.name.removeprefix(prefix)
            owner, _, rest = name.rpartition("-")[0].rpartition("-")
            try:
                pid = int(rest) if owner == host else None
            except ValueError:
                pid = None
            try:
                stale = (not process_alive(pid) if pid is not None else owner != host
                         and time.time() - folder.stat().st_mtime > LEFTOVER_SECONDS)
                if stale and folder.is_dir() and not folder.is_symlink():
                    remove_tree(folder)
                    removed.append(folder.name)
            except OSError:
                continue
    return removed


def receive(course, lesson: Lesson, handin: Handin, private: Path, key: bytes | None = None,
            ring: dict[str, bytes] | None = None, stored: dict | None = None,
            ) -> Graded | tuple[str, Path, list[str], str, Draw]:
    """Copy a student's notebook (and nothing else) into submitted/STUDENT/LESSON/, hash it,
    and keep the very bytes hashed in ``private``, the batch's own folder: the notebook to
    grade, its path returned with the hash and the draw it is graded on (its course id's, or
    a group member's: grader/gradebook/identity.py; with the course's key, or the key of
    ``ring`` that the notebook records, or that ``stored``, the ledger's grade of this very
    notebook, was graded on). What cannot be graded, say why."""
    name, reasons = handin.student_id, [*handin.reasons, *handin.identity]
    if not valid_student_id(name):
        what = "the folder's name" if course.handins.get(lesson.name, {}).get(
            name, {}).get("from") in ("folders", "nbgrader", None) else "the LMS's id"
        return Graded(display_name(name), "invalid", [
            f"{what} is not a student id (letters, digits and ._@+-, at most 100;"
            " rename it)", *reasons])
    try:
        target = course.root / "submitted" / name / lesson.name
        if target.exists():  # re-grading replaces the earlier submission entirely
            remove_tree(target)
        if handin.notebook is None:
            return Graded(name, "invalid", reasons or [
                f"no notebook {lesson.notebook.name} in the submission"])
        copy = target / lesson.notebook.name
        copy_notebook(handin.notebook, copy)
        if course.handins.get(lesson.name, {}).get(name, {}).get("from") == "nbgrader":
            from grader.intake.exchange import copy_exchange_files

            copy_exchange_files(handin.notebook.parent, target)  # feedback's secret
        data = copy.read_bytes()
        own = private / name / lesson.notebook.name
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_bytes(data)
        record = course.handins.get(lesson.name, {}).get(name, {})
        same = (stored or {}).get("notebook_sha256") == hashlib.sha256(data).hexdigest()
        key = handin_key(own, key, ring or {},
                         (stored or {}).get("drawn_with") if same else None)
        whose, why = draw_student(record, name, own, key, lesson)
        drawn = lesson_draw(key, lesson, whose)
        if len(record.get("group") or []) > 1:
            drawn = replace(drawn, group=tuple(record["group"]))
            reasons += [why] if why else []
    except OSError as error:
        if is_disk_error(error):  # our disk, not the student's file
            raise Unavailable(f"the disk holding {course.root} cannot be written",
                              describe(error)) from error
        return Graded(name, "invalid", [f"the submission could not be read "
                                        f"({error.strerror or type(error).__name__})",
                                        *reasons])
    return name, own, list(reasons), hashlib.sha256(data).hexdigest(), drawn


# A notebook name as a browser, Jupyter or an LMS changes it when a file is saved or handed
# in again: "float_formats (1).ipynb", "float_formats-Copy1.ipynb", Canvas's "float_formats-1".
COPY_MARK = re.compile(r"(?: \(\d+\)|-Copy\d*|-\d+)(?=\.ipynb$)")


def other_lesson(handins: list[Handin], lesson: Lesson) -> str:
    """Why the batch is refused when no hand-in holds ``lesson``'s notebook and most hold
    another lesson's (``autograde 05_adamw_memory`` given lesson 01's download), else ''."""
    ours = lesson.notebook.name
    placed = re.compile(r"graded (.+) in place of " + re.escape(ours))
    theirs: Counter = Counter()
    with_notebook = 0
    for handin in handins:
        if handin.notebook is None:
            continue
        with_notebook += 1
        found = next((placed.fullmatch(r) for r in handin.reasons if placed.fullmatch(r)), None)
        if found is None:
            return ""  # a hand-in of this lesson's notebook: grade the batch
        theirs[COPY_MARK.sub("", found[1].rsplit("/", 1)[-1])] += 1
    lessons = {other.notebook.name: other.name for other in all_lessons()
               if other.name != lesson.name}
    known = Counter({name: n for name, n in theirs.items() if name in lessons})
    if not known or 2 * sum(known.values()) < with_notebook:
        return ""
    name, count = known.most_common(1)[0]
    share = "every hand-in is" if count == with_notebook else \
        f"{count} of {with_notebook} hand-ins are"
    return (f"{share} {name}, the notebook of {lessons[name]}, and none is {ours}: did you mean "
            f"python -m grader autograde {lessons[name]} ...? Nothing was graded (--from does "
            "not change this: grade each lesson's download under its own name)")
