"""Hand-ins as an LMS delivers them: which layout a download has, and who handed in what.

Each layout is recognised from the files themselves (``autograde --from`` overrides):

- ``folders``: ``<student_id>/<notebook>.ipynb``, the grader's own layout.
- ``nbgrader``: nbgrader's ``collect`` layout, ``submitted/<student_id>/<lesson>/<notebook>``.
- ``canvas``: "Download Submissions", one flat file per attachment named
  ``<sortablename>_[LATE_]<user_id>_<attachment id>_<file name>`` (a file handed in again
  carries ``-1``, ``-2`` before its extension). The student id is Canvas's user id; the latest
  hand-in is the highest attachment id.
- ``moodle``: "Download all submissions", a folder per submission
  ``<Full Name>_<participant id>_assignsubmission_file[_]/`` (or, without the folder option,
  flat files ``<Full Name>_<participant id>_assignsubmission_file_<file name>``). The student
  id is the participant id (the assignment's own number for a student, not the user id).
- ``blackboard``: Blackboard Learn's "Download Assignment", flat files
  ``<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file name>`` beside one
  ``<assignment>_<username>_attempt_<date>.txt`` of metadata per attempt. The student id is
  the username.
- ``gradescope``: "Export Submissions", folders ``submission_<id>/`` and a
  ``submission_metadata.yml`` that names each submission's students (``:sid:``, else
  ``:email:``: the student id).

Every student is graded once: the latest of several attempts (the report says which), the
name kept for display only. Files beside the notebook are ignored with a remark; a hand-in with
no notebook of the lesson's name but one other is graded, with a reason that asks for a look.
Names are file names, and so untrusted: they are matched as text, kept as the escaped
``display_name``, and never used as a path.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.text import display_name, valid_student_id
from grader.intake.lms_names import (
    BLACKBOARD,
    CANVAS,
    CANVAS_TEXT,
    COPY_SUFFIX,
    GRADESCOPE_METADATA,
    MOODLE_FILE,
    MOODLE_FOLDER,
    Entry,
    MetadataLoader,
    blackboard_metadata,
    blackboard_students,
    entry_of,
    gradescope,
    is_dir,
    owner_of,
    resolve_canvas,
    size_ok,
    visible,
)
from grader.intake.zips import MAX_NOTEBOOK_BYTES, find_notebook

NBGRADER_FILES = ("timestamp.txt", "submission_secret.txt")  # nbgrader's submit writes them
LAYOUTS = ("folders", "nbgrader", "canvas", "moodle", "blackboard", "gradescope")
LABELS = {"folders": "student folders", "nbgrader": "nbgrader's collect layout",
          "canvas": "a Canvas download", "moodle": "a Moodle download",
          "blackboard": "a Blackboard Learn download", "gradescope": "a Gradescope export"}

MAX_WRAPPERS = 3  # folders around a download that are stepped into


@dataclass
class Handin:
    """What one student handed in, as far as the download says."""

    student_id: str
    notebook: Path | None = None
    reasons: list[str] = field(default_factory=list)  # ask for a look (needs_review, invalid)
    remarks: list[str] = field(default_factory=list)  # information: the attempt, files beside
    name: str = ""  # for display, escaped
    late: bool = False  # the LMS marked it late
    download_name: str = ""  # how the download named this student's files (feedback folders)
    email: str = ""
    lms_id: str = ""  # the LMS's own id where it cannot be the gradebook's (escaped)
    submitted_at: float | None = None  # seconds since the epoch, where the layout says
    time_source: str = ""  # where submitted_at came from
    local_time: str = ""  # a time with no zone (Blackboard's attempt date), for the course's
    lms_file_id: str = ""  # Canvas: the attachment id of the file graded (its feedback's name)
    course_id: str = ""  # the id the student works under (grader/gradebook/identity.py)
    group: list[str] = field(default_factory=list)  # a group hand-in: its members' course ids
    identity: list[str] = field(default_factory=list)  # flags on its id: asked of each grading

    def record(self, layout: str) -> dict[str, object]:
        """What the ledger keeps of it (JSON)."""
        return {"from": layout, "name": self.name, "late": self.late, "email": self.email,
                "download_name": self.download_name, "remarks": self.remarks,
                "lms_id": self.lms_id, "file_id": self.lms_file_id,
                "course_id": self.course_id or self.student_id, "group": list(self.group),
                "reasons": list(self.reasons)}  # the hand-in's own flags: a regrade keeps them


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def _votes(entries: list[os.DirEntry]) -> dict[str, int]:
    """How many entries each LMS's naming pattern explains."""
    votes = {"blackboard": 0, "moodle": 0, "canvas": 0}
    for entry in entries:
        if is_dir(entry):
            votes["moodle"] += bool(MOODLE_FOLDER.fullmatch(entry.name))
        elif BLACKBOARD.fullmatch(entry.name):
            votes["blackboard"] += 1
        elif MOODLE_FILE.fullmatch(entry.name):
            votes["moodle"] += 1
        elif CANVAS.fullmatch(entry.name) or CANVAS_TEXT.fullmatch(entry.name):
            votes["canvas"] += 1
    return votes


def _real_folder(path: Path) -> bool:
    """A folder, and not a link to one."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def detect(root: Path, lesson_name: str, shown: str = "") -> tuple[str, Path]:
    """The layout of a download and the folder its hand-ins lie in (a zip often wraps them
    in one folder; a zip of one student's folder is that student's). ``shown``: the download's
    name, for messages."""
    entries = visible(root)
    if not entries:
        return "folders", root  # nothing to grade: the caller says so, with what was refused
    if any(e.name == GRADESCOPE_METADATA and _is_file(e) for e in entries):
        return "gradescope", root
    folders = [e for e in entries if is_dir(e)]
    if len(entries) == 1 and folders:
        inner = Path(folders[0].path)
        if folders[0].name == "submitted":
            return "nbgrader", inner
        within = visible(inner)
        lms = max(_votes(within).values(), default=0) * 2 > len(within) > 0
        gradescope = any(e.name == GRADESCOPE_METADATA for e in within)
        # One folder of several folders and no notebook of its own is a class (a student's
        # work zipped with its folder around it holds its notebook at the top).
        several = not any(e.name.endswith(".ipynb") for e in within) and sum(
            is_dir(e) for e in within) > 1
        if lms or gradescope or several:
            return detect(inner, lesson_name, shown)
    votes = _votes(entries)
    best = max(votes, key=lambda k: votes[k])
    if votes[best] * 2 > len(entries):
        return best, root
    if folders:
        nested = any(_real_folder(Path(f.path) / lesson_name) for f in folders[:200])
        return ("nbgrader" if nested else "folders"), root
    raise CourseError(
        f"cannot tell how {shown or display_name(str(root))} is laid out: its files are named "
        "as no LMS names them. Expected <student_id>/<notebook>.ipynb folders, or an LMS's "
        "download as it came (Canvas, Moodle, Blackboard, Gradescope); name the layout with "
        "--from")


def _unwrap(root: Path, layout: str) -> Path:
    """Where a download of a named layout lies: inside the folders that wrap it alone (a zip
    of one folder, nbgrader's submitted/), so long as their names are not hand-ins."""
    for _ in range(MAX_WRAPPERS):
        entries = visible(root, layout)
        if len(entries) != 1 or not is_dir(entries[0]):
            return root
        only = entries[0]
        if layout == "nbgrader" and only.name != "submitted" and not _real_folder(
                Path(only.path) / "submitted"):
            return root  # one student's folder
        if layout == "folders" or (layout in ("canvas", "moodle", "blackboard")
                                   and entry_of(layout, only) is not None):
            return root
        root = Path(only.path)
    return root


def recognise(root: Path, lesson_name: str, notebook_name: str, layout: str | None = None,
              refused: list[tuple[list[str], str]] = (), shown: str = "",
              ) -> tuple[str, list[Handin], list[str]]:
    """The layout (detected unless given), each student's hand-in, and notes on the batch.

    ``refused``: (path relative to ``root``, why) of zip members that were not unpacked: each
    is charged to the student the path belongs to, or noted for the batch."""
    base = root
    if layout is None:
        layout, root = detect(root, lesson_name, shown)
    elif layout not in LAYOUTS:
        raise CourseError(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    else:
        root = _unwrap(root, layout)
    notes: list[str] = []
    if layout == "gradescope":
        entries, notes = gradescope(root)
    else:
        entries, strangers = [], []
        for entry in visible(root, layout):
            found = entry_of(layout, entry)
            if found is None:
                strangers.append(entry.name)
            else:
                entries.append(found)
        if strangers:
            notes.append(f"ignored {len(strangers)} file(s) or folder(s) not named as a hand-in "
                         f"in {LABELS[layout]}: {_names(strangers, 10)}")
    if layout == "canvas":
        entries = resolve_canvas(entries)
    by_student: dict[str, list[Entry]] = {}
    for entry in entries:
        by_student.setdefault(entry.student, []).append(entry)
    users: dict[str, str] = {}  # Blackboard: file-name prefix -> username
    if layout == "blackboard":
        by_student, users = blackboard_students(by_student)
    blame: dict[str, list[str]] = {}
    within = root.relative_to(base).parts
    for parts, why in refused:
        inside = list(parts[:len(within)]) == list(within)
        owner = owner_of(layout, list(parts[len(within):])) if inside else None
        if owner is not None and layout == "blackboard":
            owner = users.get(owner) or owner.rsplit("_", 1)[-1]
        if owner is None:
            notes.append(why)
        else:
            blame.setdefault(owner, []).append(why)
            by_student.setdefault(owner, [])
    handins = []
    taken = set(by_student)
    if layout == "nbgrader":  # a student's folder of other lessons only: not handed in
        others = sorted(s for s, own in by_student.items() if s not in blame
                        and own and all(_other_lessons_only(e.path, lesson_name) for e in own))
        for student in others:
            del by_student[student]
        if others:
            notes.append(f"{len(others)} student folder(s) hold no {lesson_name} folder, only "
                         f"other lessons' (not graded for this lesson): {_names(others, 10)}")
    for student, own in sorted(by_student.items()):
        handin = _handin(layout, student, own, lesson_name, notebook_name)
        handin.reasons += blame.get(student, [])
        if layout not in ("folders", "nbgrader") and not valid_student_id(student):
            _give_gradebook_id(handin, layout, taken)
        handins.append(handin)
    return layout, handins, notes


def _other_lessons_only(folder: Path, lesson_name: str) -> bool:
    """nbgrader's layout: a student's folder with no ``lesson_name`` folder and no notebook of
    its own, only folders (the other lessons they handed in)."""
    if _real_folder(folder / lesson_name):
        return False
    try:
        entries = [e for e in os.scandir(folder) if not e.name.startswith(".")]
    except OSError:
        return False
    return bool(entries) and all(e.is_dir(follow_symlinks=False) for e in entries)


def _give_gradebook_id(handin: Handin, layout: str, taken: set[str]) -> None:
    """An LMS id that cannot be a gradebook id (a Gradescope SID with a space, say) stays the
    student's LMS id, for display and export; the gradebook gets the student's e-mail where it
    can be one, else ``<layout>-<hash of the LMS id>``: the same student gets the same id in
    every batch."""
    original = handin.student_id
    digest = hashlib.sha256(os.fsencode(original)).hexdigest()[:12]
    for candidate in (handin.email, f"{layout}-{digest}"):
        if candidate and valid_student_id(candidate) and candidate not in taken:
            break
    taken.add(candidate)
    handin.lms_id, handin.student_id = display_name(original), candidate
    handin.remarks.append(f"the LMS's id {handin.lms_id!r} cannot be a gradebook id (letters, "
                          f"digits and ._@+-, at most 100): graded as {candidate}")


def _handin(layout: str, student: str, entries: list[Entry], lesson_name: str,
            notebook_name: str) -> Handin:
    handin = Handin(student)
    if not entries:
        return handin
    latest = max(entries, key=lambda e: e.order)
    handin.name = next((e.name for e in sorted(entries, key=lambda e: e.order, reverse=True)
                        if e.name), "")
    handin.download_name, handin.email = latest.download_name, latest.email
    if layout == "blackboard":
        handin.name = blackboard_metadata(entries)[0] or handin.name
        handin.local_time = str(latest.order[0])  # the attempt's date, the server's time
    elif layout == "gradescope" and math.isfinite(latest.order[0]):
        handin.submitted_at, handin.time_source = latest.order[0], "Gradescope's created_at"
    if all(e.problem for e in entries):
        handin.reasons += sorted({e.problem for e in entries})
        return handin
    entries = [e for e in entries if not e.problem]
    folders = [e for e in entries if e.path.is_dir() and not e.path.is_symlink()]
    files = [e for e in entries if e not in folders]
    if folders and not files:
        _from_folders(handin, sorted(folders, key=lambda e: e.order, reverse=True),
                      lesson_name, notebook_name, layout)
        handin.reasons += sorted({e.doubt for e in folders if e.doubt})
    else:
        _from_files(handin, files, notebook_name, layout)
        if folders:
            handin.remarks.append(f"ignored {len(folders)} folder(s) beside the files")
    return handin


def _from_folders(handin: Handin, folders: list[Entry], lesson_name: str, notebook_name: str,
                  layout: str) -> None:
    """The notebook in the student's folder(s), the preferred one first (Moodle's file
    submission before its online text)."""
    for entry in folders:
        where = entry.path
        if layout == "nbgrader" and _real_folder(where / lesson_name):
            where = where / lesson_name
        notebook, note = find_notebook(where, notebook_name)
        if notebook is not None:
            handin.notebook = notebook
            if layout == "nbgrader":
                _nbgrader_time(handin, where)
            if note:
                handin.reasons.append(note)
            beside = _others(where, notebook)
            if beside:
                handin.remarks.append(f"ignored {len(beside)} other file(s) handed in beside the"
                                      f" notebook: {_names(beside)}")
            if len(folders) > 1:
                handin.remarks.append(f"graded {display_name(entry.path.name)}; ignored "
                                      f"{len(folders) - 1} other folder(s) of this student")
            return
        last_note = note
    handin.reasons.append(last_note)


def _nbgrader_time(handin: Handin, folder: Path) -> None:
    """The time in nbgrader's ``timestamp.txt`` beside the notebook, where there is one."""
    from grader.intake.times import nbgrader_timestamp

    stamp = folder / "timestamp.txt"
    if size_ok(stamp) and stamp.is_file():
        try:
            found = nbgrader_timestamp(stamp.read_bytes()[:200].decode("utf-8", "replace"))
        except OSError:
            found = None
        if found is not None:
            handin.submitted_at, handin.time_source = found, "nbgrader's timestamp.txt"


def _others(folder: Path, notebook: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if e.path != str(notebook)
                      and not e.name.startswith(".") and e.name not in NBGRADER_FILES)[:1000]
    except OSError:
        return []


def _names(names: list[str], shown: int = 5) -> str:
    text = ", ".join(display_name(n) for n in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _from_files(handin: Handin, files: list[Entry], notebook_name: str, layout: str) -> None:
    """The notebook among a student's flat files: the lesson's (the latest hand-in of it), or
    the one other notebook (asking for a look)."""
    candidates = [e for e in files if e.original.endswith(".ipynb")]
    if any(not e.doubt for e in candidates):  # a file that is surely theirs wins
        doubtful = [e for e in candidates if e.doubt]
        if doubtful:
            handin.remarks.append(f"ignored {len(doubtful)} file(s) whose name reads as "
                                  "another user too")
        candidates = [e for e in candidates if not e.doubt]
    notebooks = [e for e in candidates if size_ok(e.path)]
    named = [e for e in notebooks if COPY_SUFFIX.sub("", e.original) == notebook_name]
    others = {COPY_SUFFIX.sub("", e.original) for e in notebooks}
    if named or len(others) == 1:
        pool = named or notebooks
        chosen = max(pool, key=lambda e: (e.order, e.path.name))
        if not named:
            handin.reasons.append(f"graded {display_name(chosen.original)} in place of "
                                  f"{notebook_name}")
    else:
        too_big = len(candidates) - len(notebooks)
        what = (f"{len(others)} other notebooks: cannot tell which" if others
                else f"{too_big} notebook(s) larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB or "
                     "not plain files" if too_big
                else f"{len(files)} other file(s)" if files else "nothing else readable")
        handin.reasons.append(f"no notebook {notebook_name} in the submission ({what})")
        return
    handin.notebook, handin.late = chosen.path, chosen.late
    if layout == "canvas" and chosen.order and chosen.order[0] > 0:
        handin.lms_file_id = str(chosen.order[0])
    if chosen.doubt:
        handin.reasons.append(chosen.doubt)
    if len(pool) > 1:
        which = (f"the attempt of {chosen.order[0]}" if layout == "blackboard"
                 else display_name(chosen.path.name))
        handin.remarks.append(f"graded {which}, the latest of {len(pool)} hand-ins of the "
                              "notebook")
    beside = [e.original for e in files if e not in pool and not (
        layout == "blackboard" and not e.original)]
    if beside:
        handin.remarks.append(f"ignored {len(beside)} other file(s) handed in beside the "
                              f"notebook: {_names(beside)}")


# ------------------------------------------------------------------ Gradescope


MetadataLoader.add_multi_constructor(
    "!", lambda loader, suffix, node: loader.construct_mapping(node)
    if node.id == "mapping" else loader.construct_sequence(node)
    if node.id == "sequence" else loader.construct_scalar(node))


