"""nbgrader's exchange: the folder a JupyterHub's students fetch lessons from and submit to.

The layout is nbgrader 0.9's default exchange (``nbgrader.exchange.default``)::

    ROOT/COURSE_ID/outbound/LESSON/                    the student version (release_assignment)
    ROOT/COURSE_ID/inbound/STUDENT+LESSON+TIME+RANDOM/ one submission, written by the student
    ROOT/COURSE_ID/feedback/HASH.html                  feedback, named by the submission's secret

Release and feedback go through nbgrader's own commands. Collecting is ours: nbgrader's
``collect`` copies a submission folder whole and follows links in it (a link to a large file, a
device or the instructor's own files is copied as its target), a named pipe in it blocks the
copy, and a submission written by another user than the one it names is only warned about
(``CollectApp.check_owner``). A student owns their submission folders and may change them
while we read, so ours opens each folder once (never through a link) and reads the notebook and
nbgrader's two small files through that descriptor, refuses what another user wrote, and,
since the student writes ``timestamp.txt`` and may write any time in it, takes the change time
of the notebook file it read where that is another time (``_counted``).

The exchange's root and the course's id there are given to ``release --exchange DIR`` and
remembered in the course directory (``exchange.json``) for ``collect`` and ``feedback``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.files import remove_tree
from grader.common.text import display_name, inert, valid_student_id
from grader.content.lessons import COURSE_ID, Lesson
from grader.intake.zips import MAX_NOTEBOOK_BYTES

DEFAULT_ROOT = Path("/srv/nbgrader/exchange")  # nbgrader's default Exchange.root
SETTINGS_FILE = "exchange.json"
COLLECTED = "collected"  # <course-dir>/collected/STUDENT/LESSON/: nbgrader's collect layout
STAMP, SECRET = "timestamp.txt", "submission_secret.txt"  # what nbgrader's submit writes
SOURCE = ".exchange-source"  # beside a collected notebook: the exchange folder it came from
# nbgrader's submit stamps the time before copying the notebook; the copy takes well under a
# second, and clocks kept by NTP (a student's server's, the file server's) agree within this.
CLOCK_SLACK_SECONDS = 120
SECRET_PATTERN = re.compile(r"[0-9a-f]{32,256}")  # secrets.token_hex(64): 128 hex digits
COURSE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class Exchange:
    root: Path
    course_id: str

    @property
    def course_path(self) -> Path:
        return self.root / self.course_id

    def options(self) -> list[str]:
        """nbgrader's command-line options that point its exchange commands here."""
        return [f"--Exchange.root={self.root}", f"--course={self.course_id}"]


def settings(course, root: str | None = None, course_id: str | None = None,
             remember: bool = False) -> Exchange:
    """The exchange to use: what is given, else what ``release --exchange`` remembered, else
    nbgrader's default root and the course's id."""
    saved: dict[str, str] = {}
    path = course.root / SETTINGS_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CourseError(f"{path} cannot be read ({error}): delete it and give the "
                              "exchange again (python -m grader release LESSON --exchange DIR)"
                              ) from None
    chosen = Exchange(Path(root or saved.get("root") or DEFAULT_ROOT).absolute(),
                      course_id or saved.get("course_id") or COURSE_ID)
    if not COURSE_ID_PATTERN.fullmatch(chosen.course_id):
        raise CourseError(f"course id {chosen.course_id!r}: use letters, digits and ._- "
                          "(it names a folder of the exchange)")
    if remember:
        path.write_text(json.dumps({"root": str(chosen.root), "course_id": chosen.course_id},
                                   indent=1) + "\n")
    return chosen


def check_folders(course, exchange: Exchange, *inside: str) -> None:
    """The course's folder in the exchange (and ``inside`` it) must be real folders of the user
    running the grader: a student could have made the course's folder first, or a link in its
    place, before the course was published, to serve lessons of their own to the class. And
    the course directory should be closed to other users of the hub."""
    for path in (exchange.course_path, *(exchange.course_path / name for name in inside)):
        try:
            info = path.lstat()
        except OSError as error:
            raise CourseError(f"{path}: {error.strerror}") from None
        what = "a link" if stat.S_ISLNK(info.st_mode) else (
            "not a folder" if not stat.S_ISDIR(info.st_mode) else "")
        if what or info.st_uid != os.geteuid():
            raise CourseError(
                f"{path} is {what or 'a folder'} of user {inert(_owner(info.st_uid), 60)}, not "
                "a folder of yours: someone put it there before the course was published, or "
                "you are not the user who published it. Publish and collect as one user; "
                "remove it (as root) if it is not the course's, then publish again")
    mode = course.root.stat().st_mode
    if mode & 0o077:
        course.log(f"warning: the course directory {course.root} may be read by other users "
                   f"(mode {stat.S_IMODE(mode):o}): on a hub, students could read the "
                   f"solutions, the gradebook and each other's work. chmod 700 {course.root}")


@dataclass
class Submission:
    student: str
    name: str  # the folder's name in inbound/ (str, as os.scandir decodes it)
    inode: tuple[int, int]  # (st_dev, st_ino) of the folder when it was scanned
    owner: int
    time: float  # for choosing each student's newest: timestamp.txt, or the notebook's ctime
    stamp: str  # timestamp.txt as written
    stamp_time: float


def collect(course, lesson: Lesson, exchange: Exchange,
            check_owner: bool = True) -> dict[str, list[str]]:
    """Copy each student's newest submission of ``lesson`` from the exchange to
    ``collected/STUDENT/LESSON/``: the notebook, ``timestamp.txt`` and the submission's secret
    (which names the feedback file). Returns the students collected, unchanged and refused.

    A student owns their submission folders and may rename, replace or change them while we
    read: every folder is opened once, not followed if a link, and read through that
    descriptor; the notebook's time is the ctime of the very file read, taken after reading."""
    inbound = exchange.course_path / "inbound"
    if not inbound.is_dir():
        raise CourseError(f"no submissions folder {inbound}: publish the lesson first "
                          f"(python -m grader release {lesson.name} --exchange DIR), or give "
                          "the exchange students submit to (--exchange DIR, --course-id ID)")
    check_folders(course, exchange, "inbound")
    try:
        inbound_fd = os.open(inbound, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise CourseError(f"cannot read {inbound} ({error.strerror}): collect as the user who "
                          "published the lesson") from None
    try:
        if os.fstat(inbound_fd).st_uid != os.geteuid():  # swapped since it was checked
            raise CourseError(f"{inbound} changed while being opened: collect again")
        return _collect(course, lesson, inbound, inbound_fd, check_owner)
    finally:
        os.close(inbound_fd)


def _collect(course, lesson: Lesson, inbound: Path, inbound_fd: int,
             check_owner: bool) -> dict[str, list[str]]:
    newest: dict[str, Submission] = {}
    refused: list[str] = []
    try:
        names = os.listdir(inbound_fd)
    except OSError as error:
        raise CourseError(f"cannot read {inbound} ({error.strerror}): collect as the user who "
                          "published the lesson") from None
    for name in names:
        parts = name.split("+")
        if len(parts) not in (3, 4) or parts[1] != lesson.name:
            continue  # another lesson's, or not a submission
        found = _scan(name, parts[0], lesson, inbound_fd, check_owner)
        if isinstance(found, str):
            refused.append(f"{display_name(name)}: {found}")
        elif found.student not in newest or found.time > newest[found.student].time:
            newest[found.student] = found
    target_root = course.root / COLLECTED
    done: dict[str, list[str]] = {"collected": [], "unchanged": [], "refused": refused,
                                  "notes": []}
    for student, submission in sorted(newest.items()):
        target = target_root / student / lesson.name
        if read_small(target / SOURCE, 1000, binary=True) == _source(submission):
            done["unchanged"].append(student)
            continue
        try:
            problem = _copy_submission(submission, lesson, inbound_fd, target, check_owner,
                                       done["notes"])
        except OSError as error:  # one hand-in must not stop the class
            problem = f"could not be copied ({error.strerror or type(error).__name__})"
            remove_tree(target.parent / f".{lesson.name}.collecting")
        if problem:
            refused.append(f"{display_name(submission.name)}: {problem}")
        else:
            done["collected"].append(student)
    notes = done["notes"]
    course.log(f"collected {lesson.name} from {inbound}: {len(done['collected'])} new or newer "
               f"submission(s), {len(done['unchanged'])} unchanged, in {target_root}/"
               + "".join(f"\n  note: {note}" for note in notes[:50])
               + "".join(f"\n  refused {why}" for why in refused[:50])
               + (f"\n  and {len(refused) - 50} more refused" if len(refused) > 50 else ""))
    return done


def _scan(name: str, student: str, lesson: Lesson, inbound_fd: int,
          check_owner: bool) -> Submission | str:
    """One submission folder, looked at: a Submission, or why it is refused."""
    from grader.intake.times import nbgrader_timestamp

    if not valid_student_id(student):
        return "not a student id"
    folder = _open_folder(name, inbound_fd)
    if isinstance(folder, str):
        return folder
    try:
        info = os.fstat(folder)
        refusal = _owner_refusal(info.st_uid, student, check_owner)
        if refusal:
            return refusal
        stamp, _ = _read_at(folder, STAMP, 200)
        text = stamp.decode("utf-8", "replace").strip()[:100] if stamp is not None else ""
        stamp_time = nbgrader_timestamp(text)
        if stamp_time is None:
            return f"no readable {STAMP}"
        notebook = _notebook_stat(folder, lesson.notebook.name, info.st_uid, check_owner)
        if isinstance(notebook, str):
            return notebook
        changed = max(notebook.st_ctime, info.st_ctime)
        return Submission(student, name, (info.st_dev, info.st_ino), info.st_uid,
                          _counted(stamp_time, changed), text, stamp_time)
    finally:
        os.close(folder)


def _copy_submission(submission: Submission, lesson: Lesson, inbound_fd: int, target: Path,
                     check_owner: bool, notes: list[str]) -> str:
    """Write the submission's notebook, stamp and secret into ``target`` (replaced whole);
    an empty string, or why nothing could be copied."""
    folder = _open_folder(submission.name, inbound_fd)
    if isinstance(folder, str):
        return f"{folder} (it changed while being collected: collect again)"
    try:
        info = os.fstat(folder)
        if (info.st_dev, info.st_ino) != submission.inode or info.st_uid != submission.owner:
            return "replaced while being collected: collect again"
        name = lesson.notebook.name
        data, after = _read_at(folder, name, MAX_NOTEBOOK_BYTES)
        if data is None:
            return _no_notebook(name)
        if check_owner and after.st_uid != info.st_uid:
            return _not_own(name, after.st_uid)
        secret = secret_of(_read_at(folder, SECRET, 1024)[0])
    finally:
        os.close(folder)
    when = _counted(submission.stamp_time, max(after.st_ctime, info.st_ctime))
    stamp = _nbgrader_time(when)  # nbgrader's own form, whatever the student wrote
    if when != submission.stamp_time:
        notes.append(f"{display_name(submission.student)}: {STAMP} says "
                     f"{inert(submission.stamp, 40)}, but the submission was last changed at "
                     f"{stamp}: that time counts")
    staging = target.parent / f".{lesson.name}.collecting"
    if staging.exists():
        remove_tree(staging)
    target.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # students' work
    staging.mkdir(parents=True)
    (staging / name).write_bytes(data)
    (staging / STAMP).write_text(stamp)
    (staging / SOURCE).write_bytes(_source(submission))
    if secret:  # without it there is no feedback through the exchange
        write_private(staging / SECRET, secret)
    if target.exists():
        remove_tree(target)
    staging.rename(target)
    return ""


def _counted(stamp_time: float, changed: float) -> float:
    """The hand-in's time: its ``timestamp.txt``, unless the submission changed at another time
    (beyond clocks' disagreement): ``changed`` is the later of the notebook's ctime and its
    folder's (a folder prepared early and renamed into view later changes the folder's). A
    ctime is set by the kernel (the file server's, over NFS) to its own clock: a student can
    make it later, never earlier. nbgrader's submit changes the folder's mode right after
    writing the stamp. Copying an exchange (a backup restored) resets the ctimes: collect
    before moving one."""
    return stamp_time if abs(changed - stamp_time) <= CLOCK_SLACK_SECONDS else changed


def _open_folder(name: str, inbound_fd: int) -> int | str:
    """A descriptor of the submission folder ``name`` (never through a link), or why not."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=inbound_fd)
    except OSError as error:
        if error.errno in (errno.ENOTDIR, errno.ELOOP):
            return "not a folder"
        return f"cannot be opened ({error.strerror})"


def _owner_refusal(uid: int, student: str, check_owner: bool) -> str:
    owner = _owner(uid)
    if check_owner and owner != student:
        return (f"written by user {inert(owner, 60)}, not by {display_name(student)} (a hand-in "
                "under another's name; --no-check-owner where every student is the same user, "
                "as on a Kubernetes hub)")
    return ""


def _notebook_stat(folder: int, name: str, owner: int, check_owner: bool):
    """The notebook's lstat in the folder, or why it cannot be the student's notebook."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return _no_notebook(name)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
        return _no_notebook(name)
    if check_owner and info.st_uid != owner:
        return _not_own(name, info.st_uid)
    return info


def _not_own(name: str, uid: int) -> str:
    return f"{name} is not the student's own file (its owner is {inert(_owner(uid))})"


def secret_of(raw: bytes | str | None) -> str:
    """A submission secret as nbgrader's submit writes it (hex digits), or "" for anything
    else: it names a feedback file, so nothing else may pass."""
    text = (raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw or "").strip()
    return text if SECRET_PATTERN.fullmatch(text) else ""


def _no_notebook(name: str) -> str:
    return (f"no {name} (a regular file of at most {MAX_NOTEBOOK_BYTES // 2**20} MiB): the "
            "student should fetch the lesson again and submit it under its name")


def _read_at(folder: int | None, name: str | Path,
             limit: int) -> tuple[bytes | None, os.stat_result | None]:
    """A regular file's bytes (at most ``limit``) in the folder open as ``folder``, and its
    fstat taken after reading; (None, None) where it is not one. Never through a link, and
    never blocking on a named pipe."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except OSError:
        return None, None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, None
        data = handle.read(limit + 1)
        after = os.fstat(fd)
    if len(data) > limit:
        return None, None
    return data, after


def _source(submission: Submission) -> bytes:
    """Which exchange folder, at which time, a collected submission came from (the folder's
    name as the file system has it: any bytes)."""
    return os.fsencode(submission.name) + f"\n{submission.stamp}\n".encode()


def _nbgrader_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def read_small(path: Path, limit: int, binary: bool = False):
    """``_read_at`` by path: a regular file's content (at most ``limit`` bytes), else None."""
    data, _ = _read_at(None, path, limit)
    if data is None or binary:
        return data
    return data.decode("utf-8", "replace")


def write_private(path: Path, text: str) -> None:
    """A file only its owner may read: a submission's secret fetches its feedback."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def copy_exchange_files(source_folder: Path, target_folder: Path) -> None:
    """nbgrader's stamp and secret beside a collected notebook, into the course's copy of the
    hand-in (where ``release_feedback`` reads the secret of the graded submission)."""
    for name, limit in ((STAMP, 200), (SECRET, 1024)):
        text = read_small(source_folder / name, limit)
        if text is not None and name == SECRET:
            text = secret_of(text) or None
        if text is not None:
            write_private(target_folder / name, text)


