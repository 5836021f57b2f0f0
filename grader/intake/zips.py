"""Taking submissions in: a folder or an LMS zip, names as the bytes they are, nothing trusted.

Whatever a zip or a folder holds, each student is received (or refused, with a reason) on their
own: a name that is not valid UTF-8, too long, too deep, a file and a folder of the same name,
a link, a zip bomb. What the grader prints or writes about a submission passes through
``inert`` first, so that no name or message can move a terminal's cursor or start a formula.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.faults import Unavailable, describe, is_disk_error
from grader.common.text import display_name, inert

MAX_ZIP_BYTES = 2 * 2**30  # unpacked size of an LMS zip we accept
MAX_ZIP_MEMBERS = 50_000
MAX_NOTEBOOK_BYTES = 50 * 2**20
MAX_METADATA_BYTES = 20 * 2**20  # an LMS's own file beside the notebooks (Gradescope's YAML)
# What intake reads of a zip: notebooks, and the small text files an LMS or nbgrader writes
# (Gradescope's YAML, Blackboard's attempt .txt, nbgrader's timestamp.txt, JSON). Any other
# member is received by name only, as an empty file: its name still counts (a layout is known
# by its names; a student is told what was ignored), its bytes never touch the disk.
READ_SUFFIXES = {".ipynb": MAX_NOTEBOOK_BYTES, ".txt": MAX_METADATA_BYTES,
                 ".yml": MAX_METADATA_BYTES, ".yaml": MAX_METADATA_BYTES,
                 ".json": MAX_METADATA_BYTES}
MAX_DEPTH = 8  # folders below a student's folder that we look into
MAX_NAME_BYTES = 255  # one path component, as Linux file systems allow
MAX_PATH_BYTES = 1024
IGNORED = ("__MACOSX",)  # folders an archiver adds


@dataclass
class Received:
    """A submissions folder, or a zip unpacked into one, and what was refused on the way."""

    root: Path
    refused_members: list[tuple[list[str], str]] = field(default_factory=list)  # zip: path, why
    notes: list[str] = field(default_factory=list)  # about the whole batch


def find_notebook(folder: Path, expected: str) -> tuple[Path | None, str]:
    """The student's notebook named ``expected``, or the only other one, and a note when it had
    to be guessed. Looks at most MAX_DEPTH folders down and never follows a link."""
    direct = folder / expected
    try:
        info = direct.lstat()
        if stat.S_ISREG(info.st_mode):
            if info.st_size > MAX_NOTEBOOK_BYTES:
                return None, f"{expected} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
            return direct, ""
    except OSError:
        pass
    found: list[Path] = []
    truncated = False
    todo = [(folder, 0)]
    while todo and len(found) < 20:
        current, depth = todo.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name.startswith(".") or entry.name in IGNORED:
                            continue
                        if depth + 1 < MAX_DEPTH:
                            todo.append((Path(entry.path), depth + 1))
                        else:
                            truncated = True
                    elif (entry.is_file(follow_symlinks=False) and entry.name.endswith(".ipynb")
                          and not entry.name.startswith(".")):
                        found.append(Path(entry.path))
        except OSError:
            truncated = True
    found = [p for p in found if p.lstat().st_size <= MAX_NOTEBOOK_BYTES]
    if len(found) == 1:
        where = display_name(str(found[0].relative_to(folder)))
        return found[0], f"graded {where} in place of {expected}"
    if not found:
        deeper = f" (folders more than {MAX_DEPTH} deep were not searched)" if truncated else ""
        return None, f"no notebook {expected} in the submission{deeper}"
    return None, f"no {expected}, and {len(found)} other notebooks: cannot tell which"


def unpack_zip(archive_path: Path, into: Path,
               named_by_lms: Callable[[str], bool] = lambda name: False) -> Received:
    """Unpack an LMS zip member by member; a member that cannot be unpacked safely is refused
    with a reason, and the rest are unpacked. Hidden files (a name beginning with ".") are left
    out unless ``named_by_lms`` says an LMS named them so (a full name may begin with ".")."""
    try:
        archive = zipfile.ZipFile(archive_path)
    except zipfile.BadZipFile as error:
        raise CourseError(f"{display_name(str(archive_path))} is not a readable zip file "
                          f"({error})") from None
    except UnicodeDecodeError:
        raise CourseError(f"{display_name(str(archive_path))}: a member's name is marked as "
                          "UTF-8 but is not; make the zip again") from None
    received = Received(into)
    with archive:
        members = archive.infolist()
        for member in members:
            member.filename = _utf8_name(member)
        if len(members) > MAX_ZIP_MEMBERS:
            raise CourseError(f"{display_name(str(archive_path))} has {len(members)} members, "
                              f"more than {MAX_ZIP_MEMBERS}; refusing")
        if sum(m.file_size for m in members if _limit(m.filename)) > MAX_ZIP_BYTES:
            raise CourseError(f"{display_name(str(archive_path))} unpacks to more than "
                              f"{MAX_ZIP_BYTES // 2**30} GiB of notebooks; refusing")
        ignored = 0
        for member in members:
            parts = [p for p in member.filename.replace("\\", "/").split("/") if p not in ("", ".")]
            if not parts or parts[0] in IGNORED or any(
                    p.startswith(".") and p != ".." and not named_by_lms(p) for p in parts):
                ignored += 1
                continue
            problem = _member_problem(member, parts)
            target = into.joinpath(*parts) if problem is None else None
            limit = _limit(member.filename)
            if target is not None and not member.is_dir() and limit is None:
                problem = _placeholder(target)  # not read: its name only
            elif target is not None and not member.is_dir():
                problem = (f"larger than the {limit // 2**20} MiB such a file may be; not "
                           "unpacked" if member.file_size > limit
                           else _extract(archive, member, target))
            elif target is not None:
                problem = _make_folder(target)
            if problem is not None:
                received.refused_members.append(
                    (parts, f"zip member {inert(member.filename, 120)} refused: {problem}"))
        for parts, _ in received.refused_members:  # the refused member's student is still one
            if len(parts) > 1 and parts[0] != ".." and len(os.fsencode(parts[0])) <= MAX_NAME_BYTES:
                _make_folder(into / parts[0])
        if ignored:
            received.notes.append(f"ignored {ignored} zip member(s) of __MACOSX or hidden files")
    return received


def _utf8_name(member: zipfile.ZipInfo) -> str:
    """A member's name as its maker meant it. The zip format's default is cp437, and a name in
    UTF-8 should carry the UTF-8 flag; Info-ZIP's ``zip`` on Linux (and others) writes UTF-8
    names without it, which cp437 reads as "Anna M├╝ller". A name without the flag is taken as
    UTF-8 where its bytes are valid UTF-8 (cp437 text beyond ASCII almost never is), else as
    cp437. (Only the name used here changes: the archive checks each member's header against
    the name as read.)"""
    if member.flag_bits & 0x800 or member.filename.isascii():
        return member.filename
    try:
        return member.filename.encode("cp437").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return member.filename


def _member_problem(member: zipfile.ZipInfo, parts: list[str]) -> str | None:
    if member.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        return "its path points outside the archive"
    if (member.external_attr >> 16) & 0o170000 == 0o120000:
        return "it is a link"
    if member.flag_bits & 0x1:
        return "it is encrypted"
    if any(len(os.fsencode(p)) > MAX_NAME_BYTES for p in parts):
        return f"a name in its path is longer than {MAX_NAME_BYTES} bytes"
    if len(os.fsencode("/".join(parts))) > MAX_PATH_BYTES:
        return f"its path is longer than {MAX_PATH_BYTES} bytes"
    if len(parts) > MAX_DEPTH + 2:
        return f"it lies more than {MAX_DEPTH + 2} folders deep"
    if any("\0" in p for p in parts):
        return "its name holds a NUL character"
    return None


def _limit(name: str) -> int | None:
    """The most bytes a member of this name may unpack to; None for a member not read."""
    return READ_SUFFIXES.get(os.path.splitext(name.rstrip("/"))[1].lower())


def _placeholder(target: Path) -> str | None:
    """An empty file in the member's place."""
    problem = _make_folder(target.parent)
    if problem is not None:
        return problem
    try:
        with open(target, "xb"):
            pass
    except FileExistsError:
        return "a file or folder of the same name is already there"
    except IsADirectoryError:
        return "a folder of the same name is already there"
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def _make_folder(target: Path) -> str | None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return "a file of the same name is in the way"
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def _extract(archive: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path) -> str | None:
    problem = _make_folder(target.parent)
    if problem is not None:
        return problem
    try:
        with archive.open(member) as source, open(target, "xb") as sink:
            copied = 0
            while chunk := source.read(2**20):
                copied += len(chunk)
                if copied > member.file_size:  # the header lied: a zip bomb
                    raise ValueError("it unpacks to more than its header says")
                sink.write(chunk)
    except FileExistsError:
        return "a file or folder of the same name is already there"
    except IsADirectoryError:
        return "a folder of the same name is already there"
    except OSError as error:
        with contextlib.suppress(OSError):
            target.unlink()
        if is_disk_error(error):  # our disk: stop the intake, it is not this member's fault
            raise Unavailable(f"the disk holding {target.parent} cannot be written",
                              describe(error)) from error
        return error.strerror or type(error).__name__
    except Exception as error:  # a damaged stream (zlib.error, LZMAError, CRC), a method
        with contextlib.suppress(OSError):  # zipfile cannot read, a lying header: this
            target.unlink()                 # member alone is refused
        if isinstance(error, ValueError) and "header says" in str(error):
            return str(error)
        return f"it cannot be unpacked ({type(error).__name__}: {inert(str(error), 120)})"
    return None


def copy_notebook(source: Path, target: Path) -> None:
    """Copy a student's notebook (only the notebook: nothing beside it can shadow a module)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target, follow_symlinks=False)
