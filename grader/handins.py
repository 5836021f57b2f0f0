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
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from grader.intake import (
    IGNORED,
    MAX_METADATA_BYTES,
    MAX_NOTEBOOK_BYTES,
    display_name,
    find_notebook,
    inert,
    valid_student_id,
)
from grader.lessons import CourseError

NBGRADER_FILES = ("timestamp.txt", "submission_secret.txt")  # nbgrader's submit writes them
LAYOUTS = ("folders", "nbgrader", "canvas", "moodle", "blackboard", "gradescope")
LABELS = {"folders": "student folders", "nbgrader": "nbgrader's collect layout",
          "canvas": "a Canvas download", "moodle": "a Moodle download",
          "blackboard": "a Blackboard Learn download", "gradescope": "a Gradescope export"}
MAX_SUBMITTERS = 50  # students of one Gradescope (group) submission
MAX_ENTRIES = 100_000  # (submission, student) pairs of one Gradescope export

# Each pattern is how the LMS's own code names a download's members (re.DOTALL: a hostile name
# may hold a newline, and must still match or fail as a whole).
# Canvas, lib/content_zipper.rb: "<name>[_LATE]_<user id>_<attachment id>_<file name>", the name
# the sortable name lowercased with every non-word character removed (it may keep "_", never
# "_<digits>_"), or no name and "anon_<id>" for the user id under anonymous grading. A text or
# URL submission is "<name>[_LATE]_<user id>_text.html" or "..._link.html".
CANVAS = re.compile(r"(?:(?P<name>.*?)_)?(?P<late>LATE_)?(?P<user>\d+|anon_[A-Za-z0-9]+)"
                    r"_(?P<item>\d+)_(?P<file>.+)", re.DOTALL)
# The same from the user id on, to try at every "_" of a name (see _canvas_parses).
CANVAS_TAIL = re.compile(r"(?P<late>LATE_)?(?P<user>[1-9]\d{0,19}|anon_[A-Za-z0-9]+)"
                         r"_(?P<item>[1-9]\d{0,19})_(?P<file>.+)", re.DOTALL)
CANVAS_TEXT = re.compile(r"(?:(?P<name>.*?)_)?(?P<late>LATE_)?(?P<user>\d+|anon_[A-Za-z0-9]+)"
                         r"_(?P<file>text\.html|link\.html)", re.DOTALL)
# Moodle, mod/assign/classes/downloader.php: "<full name>_<participant id>" with every "_" of
# the full name made a space, then "_assignsubmission_file" and a folder (a trailing "_" before
# Moodle 4.1), or "_assignsubmission_file_<file name>" without the folder option.
MOODLE_FOLDER = re.compile(r"(?P<name>[^_]*)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_?",
                           re.DOTALL)
MOODLE_FILE = re.compile(r"(?P<name>[^_]*)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_"
                         r"(?P<file>.+)", re.DOTALL)
# Blackboard Learn: "<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file name>", and
# "<assignment>_<username>_attempt_<date>.txt" whose first line is "Name: <name> (<username>)".
# The first "_attempt_<date>": what follows is the student's own file name, which may hold one.
BLACKBOARD = re.compile(r"(?P<prefix>.+?)_attempt_(?P<date>\d{4}(?:-\d\d){5})"
                        r"(?:_(?P<file>.+)|(?P<meta>\.txt))", re.DOTALL)
BLACKBOARD_NAME = re.compile(r"^Name:\s*(?P<name>.*?)\s*\((?P<user>[^()\n]+)\)\s*$", re.MULTILINE)
COPY_SUFFIX = re.compile(r"-\d+(?=\.[^.]*$)")  # Canvas's "-1" for a file handed in again
GRADESCOPE_METADATA = "submission_metadata.yml"
MAX_WRAPPERS = 3  # folders around a download that are stepped into


def _canvas_name_ok(name: str) -> bool:
    """Whether Canvas could have written ``name`` before the ids (lib/content_zipper.rb,
    ``sanitize_user_name`` and ``sanitize_file_name``): it lowercases the sortable name, removes
    every character that is not a letter, mark, digit or "_", and makes "_<digits>_" plain
    digits. So "LATE", Canvas's own mark, is never part of a name."""
    return not re.search(r"_\d+_", name) and name == name.lower() and all(
        char == "_" or unicodedata.category(char)[0] in "LMN" for char in name)


def _canvas_parses(name: str) -> list[tuple[str, re.Match]]:
    """Every (student name, rest) reading of a Canvas member name. A name that ends in
    "_<digits>" reads two ways (``alex_2005_123_77_x.ipynb``: user 2005 or user 123), and so
    can a file name that begins with digits; the caller decides between them."""
    found = []
    for cut in [0, *(i + 1 for i, char in enumerate(name) if char == "_")]:
        student_name = name[: cut - 1] if cut else ""
        if cut and not _canvas_name_ok(student_name):
            break  # every later cut holds this character too
        match = CANVAS_TAIL.fullmatch(name, cut)
        if match is not None:
            found.append((student_name, match))
    return found


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

    def record(self, layout: str) -> dict[str, object]:
        """What the ledger keeps of it (JSON)."""
        return {"from": layout, "name": self.name, "late": self.late, "email": self.email,
                "download_name": self.download_name, "remarks": self.remarks,
                "lms_id": self.lms_id, "file_id": self.lms_file_id}


@dataclass
class Entry:
    """A top-level file or folder of a download, with what its name says."""

    path: Path
    student: str
    order: tuple  # later attempts sort higher
    original: str = ""  # the file name the student handed in (flat layouts)
    late: bool = False
    name: str = ""
    download_name: str = ""
    email: str = ""
    problem: str = ""  # why this entry cannot be graded (Gradescope: its folder is missing)
    doubt: str = ""  # why its owner is uncertain (a Canvas name that reads two ways)
    readings: list = field(default_factory=list)  # Canvas: every (user, name, Entry) reading


def visible(root: Path, layout: str = "folders") -> list[os.DirEntry]:
    """The entries of ``root`` that are not hidden or an archiver's. A name that begins with
    "." is a hand-in all the same where the LMS's pattern explains it (Moodle keeps a full
    name's leading dot)."""
    try:
        with os.scandir(root) as entries:
            return sorted((e for e in entries if e.name not in IGNORED and (
                not e.name.startswith(".") or (layout in ("canvas", "moodle", "blackboard")
                                               and named_by_lms(e.name)))),
                          key=lambda e: e.name)
    except OSError as error:
        raise CourseError(f"cannot read the submissions folder {display_name(str(root))}: "
                          f"{error.strerror}") from None


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def named_by_lms(name: str) -> bool:
    """Whether a file or folder name is one an LMS's download gives a hand-in. Never "._...":
    macOS's AppleDouble files beside a copied file (no LMS name begins so)."""
    return not name.startswith("._") and any(pattern.fullmatch(name) for pattern in (
        CANVAS, CANVAS_TEXT, MOODLE_FOLDER, MOODLE_FILE, BLACKBOARD))


def _votes(entries: list[os.DirEntry]) -> dict[str, int]:
    """How many entries each LMS's naming pattern explains."""
    votes = {"blackboard": 0, "moodle": 0, "canvas": 0}
    for entry in entries:
        if _is_dir(entry):
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
    folders = [e for e in entries if _is_dir(e)]
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
            _is_dir(e) for e in within) > 1
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
        if len(entries) != 1 or not _is_dir(entries[0]):
            return root
        only = entries[0]
        if layout == "nbgrader" and only.name != "submitted" and not _real_folder(
                Path(only.path) / "submitted"):
            return root  # one student's folder
        if layout == "folders" or (layout in ("canvas", "moodle", "blackboard")
                                   and _entry(layout, only) is not None):
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
        entries, notes = _gradescope(root)
    else:
        entries, strangers = [], []
        for entry in visible(root, layout):
            found = _entry(layout, entry)
            if found is None:
                strangers.append(entry.name)
            else:
                entries.append(found)
        if strangers:
            notes.append(f"ignored {len(strangers)} file(s) or folder(s) not named as a hand-in "
                         f"in {LABELS[layout]}: {_names(strangers, 10)}")
    if layout == "canvas":
        entries = _resolve_canvas(entries)
    by_student: dict[str, list[Entry]] = {}
    for entry in entries:
        by_student.setdefault(entry.student, []).append(entry)
    users: dict[str, str] = {}  # Blackboard: file-name prefix -> username
    if layout == "blackboard":
        by_student, users = _blackboard_students(by_student)
    blame: dict[str, list[str]] = {}
    within = root.relative_to(base).parts
    for parts, why in refused:
        inside = list(parts[:len(within)]) == list(within)
        owner = _owner(layout, list(parts[len(within):])) if inside else None
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


def _entry(layout: str, entry: os.DirEntry) -> Entry | None:
    """What a top-level name says in ``layout``, or None where it is not one of its names."""
    path, folder = Path(entry.path), _is_dir(entry)
    if layout in ("folders", "nbgrader"):
        return Entry(path, entry.name, (), download_name=entry.name) if folder else None
    if layout == "canvas":
        if folder:
            return None
        text = CANVAS_TEXT.fullmatch(entry.name)
        if text is not None and _canvas_name_ok(text["name"] or ""):
            return Entry(path, text["user"], (-1, 0), text["file"], bool(text["late"]),
                         display_name(text["name"] or ""), entry.name[: text.end("user")])
        readings = [Entry(path, match["user"], (int(match["item"]), _copy_number(match["file"])),
                          match["file"], bool(match["late"]), display_name(student_name),
                          entry.name[: match.end("user")])
                    for student_name, match in _canvas_parses(entry.name)]
        if not readings:
            return None
        first = readings[0]
        first.readings = readings
        return first
    if layout == "moodle":
        match = (MOODLE_FOLDER if folder else MOODLE_FILE).fullmatch(entry.name)
        if match is None:
            return None
        prefix = f"{match['name']}_{match['user']}"
        return Entry(path, match["user"], (match["plugin"] == "file",),
                     "" if folder else match["file"], False, display_name(match["name"]),
                     prefix)
    if layout == "blackboard":
        match = BLACKBOARD.fullmatch(entry.name)
        if match is None or folder:
            return None
        return Entry(path, match["prefix"], (match["date"], _copy_number(match["file"] or "")),
                     match["file"] or "", False, "", match["prefix"])
    raise AssertionError(layout)


def _resolve_canvas(entries: list[Entry]) -> list[Entry]:
    """Each Canvas file that reads two ways given to one student: the reading whose user and
    name another, unambiguous file of the download confirms; else the first reading whose user
    no other file claims under another name; else the first. Unless confirmed, the file keeps a
    doubt, which asks for a look and yields to the student's unambiguous files."""
    sure = {(e.student, e.name) for e in entries if len(e.readings) <= 1}
    claimed = {user for user, _ in sure}
    resolved = []
    for entry in entries:
        if len(entry.readings) <= 1:
            resolved.append(entry)
            continue
        options = entry.readings
        confirmed = [r for r in options if (r.student, r.name) in sure]
        if confirmed:
            resolved.append(confirmed[0])
            continue
        chosen = next((r for r in options if r.student not in claimed), options[0])
        chosen.doubt = (f"its Canvas file name reads as {len(options)} users ("
                        + ", ".join(f"{r.student} {r.name or '(no name)'}" for r in options)
                        + f"): graded as {chosen.student}; check")
        resolved.append(chosen)
    return resolved


def _owner(layout: str, parts: list[str]) -> str | None:
    """The student a path in a download belongs to (relative to where the hand-ins lie)."""
    if not parts or parts[0] == ".." or layout == "gradescope":
        return None
    inside = len(parts) > 1
    if layout in ("folders", "nbgrader"):
        return parts[0] if inside else None
    if layout == "canvas" and not inside:
        readings = _canvas_parses(parts[0])
        return readings[0][1]["user"] if len(readings) == 1 else None
    patterns = {"canvas": (CANVAS_TEXT,), "blackboard": (BLACKBOARD,),
                "moodle": (MOODLE_FOLDER,) if inside else (MOODLE_FILE,)}[layout]
    for pattern in patterns:
        match = pattern.fullmatch(parts[0])
        if match is not None:
            return match["prefix"] if layout == "blackboard" else match["user"]
    return None


def _copy_number(file_name: str) -> int:
    found = COPY_SUFFIX.search(file_name)
    return int(found.group()[1:]) if found else 0


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
        handin.name = _blackboard_metadata(entries)[0] or handin.name
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
    from grader.deadlines import nbgrader_timestamp

    stamp = folder / "timestamp.txt"
    if _size_ok(stamp) and stamp.is_file():
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
    notebooks = [e for e in candidates if _size_ok(e.path)]
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


def _size_ok(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return not path.is_symlink() and info.st_size <= MAX_NOTEBOOK_BYTES


def _blackboard_metadata(entries: list[Entry]) -> tuple[str, str]:
    """(name, username) from the latest attempt's metadata file, whose first line is
    ``Name: First Last (username)``; ('', '') where there is none."""
    for entry in sorted(entries, key=lambda e: e.order, reverse=True):
        if entry.original or not _size_ok(entry.path):
            continue
        try:
            text = entry.path.read_bytes()[:65536].decode("utf-8", errors="replace")
        except OSError:
            continue
        match = BLACKBOARD_NAME.search(text)
        if match:
            return display_name(match["name"]), match["user"]
    return "", ""


def _blackboard_students(by_prefix: dict[str, list[Entry]],
                         ) -> tuple[dict[str, list[Entry]], dict[str, str]]:
    """Blackboard names files ``<assignment>_<username>``: the username is the end of that
    prefix that the attempt's metadata names (an assignment's or a username's own "_" cannot
    tell where one ends), else the part after the last "_". Returns the entries by username,
    and each prefix's username."""
    students: dict[str, list[Entry]] = {}
    users: dict[str, str] = {}
    for prefix, entries in by_prefix.items():
        _, user = _blackboard_metadata(entries)
        if not (user and prefix.endswith("_" + user)):
            user = prefix.rsplit("_", 1)[-1]
        for entry in entries:
            entry.student = user
        students.setdefault(user, []).extend(entries)
        users[prefix] = user
    return students, users


# ------------------------------------------------------------------ Gradescope

def _gradescope(root: Path) -> tuple[list[Entry], list[str]]:
    """Each student of each submission named in ``submission_metadata.yml``."""
    path = root / GRADESCOPE_METADATA
    if path.is_symlink() or path.stat().st_size > MAX_METADATA_BYTES:
        raise CourseError(f"{GRADESCOPE_METADATA} is a link or larger than "
                          f"{MAX_METADATA_BYTES // 2**20} MiB; refusing")
    try:
        metadata = yaml.load(path.read_bytes(), Loader=_MetadataLoader)  # a SafeLoader
    except (yaml.YAMLError, RecursionError, ValueError) as error:
        raise CourseError(f"{GRADESCOPE_METADATA} is not readable YAML: "
                          f"{inert(str(error), 300)}") from None
    if not isinstance(metadata, dict):
        raise CourseError(f"{GRADESCOPE_METADATA} does not map submissions to their students")
    entries, notes = [], []
    folders = {e.name for e in visible(root) if _is_dir(e)}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, dict):
            notes.append(f"{GRADESCOPE_METADATA}: an entry that is not a submission; ignored")
            continue
        submitters = value.get(":submitters", value.get("submitters"))
        if not isinstance(submitters, list) or not 0 < len(submitters) <= MAX_SUBMITTERS:
            notes.append(f"{display_name(key)}: no list of students in {GRADESCOPE_METADATA}; "
                         "not graded")
            continue
        created = _created(value.get(":created_at", value.get("created_at")))
        if len(entries) + len(submitters) > MAX_ENTRIES:
            raise CourseError(f"{GRADESCOPE_METADATA} names more than {MAX_ENTRIES:,} students "
                              "in its submissions; refusing")
        for person in submitters:
            if not isinstance(person, dict):
                continue
            sid, email, name = (_scalar(person.get(f":{k}", person.get(k)))
                                for k in ("sid", "email", "name"))
            student = sid or email
            if not student:
                notes.append(f"{display_name(key)}: a student with neither sid nor email; "
                             "not graded")
                continue
            entries.append(Entry(
                root / key, student, (created, key), name=display_name(name),
                download_name=key, email=email,
                problem="" if key in folders else f"{display_name(key)}/ is not in the export"))
        folders.discard(key)
    for extra in sorted(folders)[:50]:
        notes.append(f"{display_name(extra)}: not in {GRADESCOPE_METADATA}; not graded")
    return entries, notes


class _MetadataLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with Ruby's tags (Gradescope writes YAML from Ruby) read as plain
    values rather than refused, and no aliases: Gradescope writes none, and each one can stand
    for a whole subtree, so a small file could name millions of students."""

    def compose_node(self, parent, index):  # PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "an alias (*name): refused",
                                              event.start_mark)
        return super().compose_node(parent, index)


_MetadataLoader.add_multi_constructor(
    "!", lambda loader, suffix, node: loader.construct_mapping(node)
    if node.id == "mapping" else loader.construct_sequence(node)
    if node.id == "sequence" else loader.construct_scalar(node))


def _scalar(value: object) -> str:
    return str(value).strip() if isinstance(value, (str, int)) and not isinstance(
        value, bool) else ""


def _created(value: object) -> float:
    """A submission time in seconds since 1970, for ordering attempts (-inf where none)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            return float("-inf")
    if isinstance(value, datetime):
        return value.timestamp()  # YAML's timestamps with an offset are aware: UTC seconds
    return float("-inf")
