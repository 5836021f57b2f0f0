"""How each LMS names what it hands back: Canvas's flat files, Moodle's folders, Blackboard's
attempts and metadata, Gradescope's submission_metadata.yml. Each name read to the student it
belongs to (an ``Entry``), without trusting it; grader/intake/handins.py makes the hand-ins."""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from grader.common.errors import CourseError
from grader.common.text import display_name, inert, valid_student_id
from grader.intake.zips import IGNORED, MAX_METADATA_BYTES, MAX_NOTEBOOK_BYTES

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
    sid: str = ""  # Gradescope: the SID the metadata gives


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


def is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def named_by_lms(name: str) -> bool:
    """Whether a file or folder name is one an LMS's download gives a hand-in. Never "._...":
    macOS's AppleDouble files beside a copied file (no LMS name begins so)."""
    return not name.startswith("._") and any(pattern.fullmatch(name) for pattern in (
        CANVAS, CANVAS_TEXT, MOODLE_FOLDER, MOODLE_FILE, BLACKBOARD))


def entry_of(layout: str, entry: os.DirEntry) -> Entry | None:
    """What a top-level name says in ``layout``, or None where it is not one of its names."""
    path, folder = Path(entry.path), is_dir(entry)
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


def resolve_canvas(entries: list[Entry]) -> list[Entry]:
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


def owner_of(layout: str, parts: list[str]) -> str | None:
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


def size_ok(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return not path.is_symlink() and info.st_size <= MAX_NOTEBOOK_BYTES


def blackboard_metadata(entries: list[Entry]) -> tuple[str, str]:
    """(name, username) from the latest attempt's metadata file, whose first line is
    ``Name: First Last (username)``; ('', '') where there is none."""
    for entry in sorted(entries, key=lambda e: e.order, reverse=True):
        if entry.original or not size_ok(entry.path):
            continue
        try:
            text = entry.path.read_bytes()[:65536].decode("utf-8", errors="replace")
        except OSError:
            continue
        match = BLACKBOARD_NAME.search(text)
        if match:
            return display_name(match["name"]), match["user"]
    return "", ""


def blackboard_students(by_prefix: dict[str, list[Entry]],
                         ) -> tuple[dict[str, list[Entry]], dict[str, str]]:
    """Blackboard names files ``<assignment>_<username>``: the username is the end of that
    prefix that the attempt's metadata names (an assignment's or a username's own "_" cannot
    tell where one ends), else the part after the last "_". Returns the entries by username,
    and each prefix's username."""
    students: dict[str, list[Entry]] = {}
    users: dict[str, str] = {}
    for prefix, entries in by_prefix.items():
        _, user = blackboard_metadata(entries)
        if not (user and prefix.endswith("_" + user)):
            user = prefix.rsplit("_", 1)[-1]
        for entry in entries:
            entry.student = user
        students.setdefault(user, []).extend(entries)
        users[prefix] = user
    return students, users


def gradescope(root: Path) -> tuple[list[Entry], list[str]]:
    """Each student of each submission named in ``submission_metadata.yml``."""
    path = root / GRADESCOPE_METADATA
    if path.is_symlink() or path.stat().st_size > MAX_METADATA_BYTES:
        raise CourseError(f"{GRADESCOPE_METADATA} is a link or larger than "
                          f"{MAX_METADATA_BYTES // 2**20} MiB; refusing")
    try:
        metadata = yaml.load(path.read_bytes(), Loader=MetadataLoader)  # a SafeLoader
    except (yaml.YAMLError, RecursionError, ValueError) as error:
        raise CourseError(f"{GRADESCOPE_METADATA} is not readable YAML: "
                          f"{inert(str(error), 300)}") from None
    if not isinstance(metadata, dict):
        raise CourseError(f"{GRADESCOPE_METADATA} does not map submissions to their students")
    entries, notes = [], []
    folders = {e.name for e in visible(root) if is_dir(e)}
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
                download_name=key, email=email, sid=sid,
                problem="" if key in folders else f"{display_name(key)}/ is not in the export"))
        folders.discard(key)
    for extra in sorted(folders)[:50]:
        notes.append(f"{display_name(extra)}: not in {GRADESCOPE_METADATA}; not graded")
    return _shared_sids(entries), notes


def _shared_sids(entries: list[Entry]) -> list[Entry]:
    """Entries whose SID Gradescope gives to two different people (a typo in its roster): each
    graded under their own e-mail and flagged, never merged into one student (whose latest
    hand-in alone would count)."""
    import hashlib

    people: dict[str, set[str]] = {}
    for entry in entries:
        if entry.sid:
            people.setdefault(entry.sid, set()).add(
                entry.email.casefold() or f"name:{entry.name.casefold()}")
    for entry in entries:
        if entry.sid and len(people[entry.sid]) > 1:
            others = len(people[entry.sid]) - 1
            digest = hashlib.sha256(f"{entry.sid}\0{entry.name}".encode()).hexdigest()[:12]
            entry.student = entry.email if valid_student_id(entry.email) else \
                f"gradescope-{digest}"
            entry.doubt = (f"Gradescope gives this student's SID {inert(entry.sid, 40)!r} to "
                           f"{others} other student(s) too: graded as {entry.student}, apart; "
                           "correct the SID in Gradescope's roster")
    return entries


class MetadataLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with Ruby's tags (Gradescope writes YAML from Ruby) read as plain
    values rather than refused, and no aliases: Gradescope writes none, and each one can stand
    for a whole subtree, so a small file could name millions of students."""

    def compose_node(self, parent, index):  # PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "an alias (*name): refused",
                                              event.start_mark)
        return super().compose_node(parent, index)


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
