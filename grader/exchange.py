"""nbgrader's exchange: the folder a JupyterHub's students fetch lessons from and submit to.

The layout is nbgrader 0.9's default exchange (``nbgrader.exchange.default``)::

    ROOT/COURSE_ID/outbound/LESSON/                    the student version (release_assignment)
    ROOT/COURSE_ID/inbound/STUDENT+LESSON+TIME+RANDOM/ one submission, written by the student
    ROOT/COURSE_ID/feedback/HASH.html                  feedback, named by the submission's secret

Release and feedback go through nbgrader's own commands. Collecting is ours, for three reasons:
nbgrader's ``collect`` copies a submission folder whole and follows links in it (a link to a
large file, a device or the instructor's own files is copied as its target), a named pipe in
it blocks the copy, and a submission written by another user than the one it names is only
warned about (``CollectApp.check_owner``). Ours copies the notebook and nbgrader's two small
files, never through a link, and refuses a submission that someone else wrote.

The exchange's root and the course's id there are given to ``release --exchange DIR`` and
remembered in the course directory (``exchange.json``) for ``collect`` and ``feedback``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from grader.intake import MAX_NOTEBOOK_BYTES, display_name, inert, valid_student_id
from grader.lessons import CourseError, Lesson
from grader.sandbox import remove_tree

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
    from grader.course import COURSE_ID

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


def publish(course, lesson: Lesson, exchange: Exchange) -> Path:
    """Copy the released student version to the exchange's outbound folder (nbgrader's
    ``release_assignment``); students' Assignment Lists offer it from then on."""
    done = course.nbgrader("release_assignment", lesson.name, "--force", *exchange.options())
    outbound = exchange.course_path / "outbound" / lesson.name
    if done.returncode != 0 or not outbound.is_dir():
        raise CourseError(f"nbgrader release_assignment {lesson.name} to {exchange.root} "
                          "failed (the exchange must be a folder you may write, mode 0777 "
                          "so that students may submit; nbgrader creates it where it may):\n"
                          + _tail(done.stderr + done.stdout))
    course.log(f"published {lesson.name} to the exchange: {outbound} (course id "
               f"{exchange.course_id}); students fetch it in their Assignment List")
    return outbound


@dataclass
class Submission:
    student: str
    folder: Path
    time: float
    stamp: str


def collect(course, lesson: Lesson, exchange: Exchange,
            check_owner: bool = True) -> dict[str, list[str]]:
    """Copy each student's newest submission of ``lesson`` from the exchange to
    ``collected/STUDENT/LESSON/``: the notebook, ``timestamp.txt`` and the submission's secret
    (which names the feedback file). Returns the students collected, unchanged and refused."""
    from grader.deadlines import nbgrader_timestamp

    inbound = exchange.course_path / "inbound"
    if not inbound.is_dir():
        raise CourseError(f"no submissions folder {inbound}: publish the lesson first "
                          f"(python -m grader release {lesson.name} --exchange DIR), or give "
                          "the exchange students submit to (--exchange DIR, --course-id ID)")
    newest: dict[str, Submission] = {}
    refused: list[str] = []
    notes: list[str] = []
    try:
        entries = list(os.scandir(inbound))
    except OSError as error:
        raise CourseError(f"cannot read {inbound} ({error.strerror}): collect as the user who "
                          "published the lesson") from None
    for entry in entries:
        parts = entry.name.split("+")
        if len(parts) not in (3, 4) or parts[1] != lesson.name:
            continue  # another lesson's, or not a submission
        student, shown = parts[0], display_name(parts[0])
        if not valid_student_id(student):
            refused.append(f"{display_name(entry.name)}: not a student id")
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            refused.append(f"{display_name(entry.name)}: not a folder")
            continue
        owner = _owner(info.st_uid)
        if check_owner and owner != student:
            refused.append(f"{display_name(entry.name)}: written by user {inert(owner, 60)}, "
                           f"not by {shown} (a hand-in under another's name; --no-check-owner "
                           "where every student is the same user, as on a Kubernetes hub)")
            continue
        stamp = _read_small(Path(entry.path) / STAMP, 200)
        when = nbgrader_timestamp(stamp) if stamp is not None else None
        if when is None:
            refused.append(f"{display_name(entry.name)}: no readable {STAMP}")
            continue
        written = _changed_at(Path(entry.path) / lesson.notebook.name)
        if written is not None and abs(written - when) > CLOCK_SLACK_SECONDS:
            notes.append(f"{shown}: {STAMP} says {inert(stamp.strip(), 40)}, but the notebook was "
                         f"last written at {_nbgrader_time(written)}: that time counts")
            when, stamp = written, _nbgrader_time(written)
        if student not in newest or when > newest[student].time:
            newest[student] = Submission(student, Path(entry.path), when, stamp.strip()[:100])
    target_root = course.root / COLLECTED
    done: dict[str, list[str]] = {"collected": [], "unchanged": [], "refused": refused}
    for student, submission in sorted(newest.items()):
        target = target_root / student / lesson.name
        if _read_small(target / SOURCE, 1000) == _source(submission):
            done["unchanged"].append(student)
            continue
        problem = _copy_submission(submission, lesson, target)
        if problem:
            refused.append(f"{display_name(submission.folder.name)}: {problem}")
        else:
            done["collected"].append(student)
    done["notes"] = notes
    course.log(f"collected {lesson.name} from {inbound}: {len(done['collected'])} new or newer "
               f"submission(s), {len(done['unchanged'])} unchanged, in {target_root}/"
               + "".join(f"\n  note: {note}" for note in notes[:50])
               + "".join(f"\n  refused {why}" for why in refused[:50])
               + (f"\n  and {len(refused) - 50} more refused" if len(refused) > 50 else ""))
    return done


def _copy_submission(submission: Submission, lesson: Lesson, target: Path) -> str:
    """Write the submission's notebook, stamp and secret into ``target`` (replaced whole);
    an empty string, or why nothing could be copied."""
    name = lesson.notebook.name
    notebook = _read_small(submission.folder / name, MAX_NOTEBOOK_BYTES, binary=True)
    if notebook is None:
        return (f"no {name} (a regular file of at most {MAX_NOTEBOOK_BYTES // 2**20} MiB): "
                "the student should fetch the lesson again and submit it under its name")
    secret = (_read_small(submission.folder / SECRET, 1024) or "").strip()
    staging = target.parent / f".{lesson.name}.collecting"
    if staging.exists():
        remove_tree(staging)
    target.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # students' work
    staging.mkdir(parents=True)
    (staging / name).write_bytes(notebook)
    (staging / STAMP).write_text(submission.stamp)
    (staging / SOURCE).write_text(_source(submission))
    if SECRET_PATTERN.fullmatch(secret):  # without it there is no feedback through the exchange
        write_private(staging / SECRET, secret)
    if target.exists():
        remove_tree(target)
    staging.rename(target)
    return ""


def _source(submission: Submission) -> str:
    """Which exchange folder, at which time, a collected submission came from."""
    return f"{submission.folder.name}\n{submission.stamp}\n"


def _changed_at(path: Path) -> float | None:
    """When the file's inode last changed: set by the kernel (the file server, over NFS) to
    its own clock, so a student can make it later but never earlier, unlike ``timestamp.txt``.
    Copying an exchange (a backup restored) resets it: collect before moving one."""
    try:
        return path.lstat().st_ctime
    except OSError:
        return None


def _nbgrader_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def _read_small(path: Path, limit: int, binary: bool = False):
    """A regular file's content if it has at most ``limit`` bytes, else None. Never through a
    link, and never blocking on a named pipe a student left in the exchange."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = handle.read(limit + 1)
    if len(data) > limit:
        return None
    return data if binary else data.decode("utf-8", "replace")


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


def release_feedback(course, lesson: Lesson, exchange: Exchange) -> int:
    """Put each graded student's feedback page where their Assignment List's Fetch Feedback
    finds it (nbgrader's ``release_feedback``: the page named by a hash of the submission's
    secret). Students graded from elsewhere than the exchange have no secret and are left out.
    Returns how many pages were released."""
    feedback = course.root / "feedback"
    pages = sorted(feedback.glob(f"*/{lesson.name}/{lesson.notebook.stem}.html"))
    released, without = [], []
    for page in pages:
        student = page.parent.parent.name
        submitted = course.root / "submitted" / student / lesson.name
        secret = (_read_small(submitted / SECRET, 1024) or "").strip()
        stamp = _read_small(submitted / STAMP, 200)
        if not SECRET_PATTERN.fullmatch(secret) or stamp is None:
            without.append(student)
            continue
        write_private(page.parent / SECRET, secret)
        (page.parent / STAMP).write_text(stamp)
        released.append(student)
    if released:
        exclude = [p.name for p in feedback.iterdir() if p.name not in set(released)]
        done = course.nbgrader("release_feedback", lesson.name, *exchange.options(),
                               f"--CourseDirectory.student_id_exclude={','.join(exclude)}")
        if done.returncode != 0:
            raise CourseError(f"nbgrader release_feedback {lesson.name} failed:\n"
                              + _tail(done.stderr + done.stdout))
    course.log(f"released the feedback of {len(released)} student(s) to "
               f"{exchange.course_path / 'feedback'}: they see it with Fetch Feedback in the "
               "Assignment List"
               + (f"; {len(without)} graded from elsewhere than the exchange have no "
                  f"submission secret and were left out: {inert(', '.join(without), 200)}"
                  if without else ""))
    return len(released)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def copy_exchange_files(source_folder: Path, target_folder: Path) -> None:
    """nbgrader's stamp and secret beside a collected notebook, into the course's copy of the
    hand-in (where ``release_feedback`` reads the secret of the graded submission)."""
    for name, limit in ((STAMP, 200), (SECRET, 1024)):
        text = _read_small(source_folder / name, limit)
        if text is not None and (name == STAMP or SECRET_PATTERN.fullmatch(text.strip())):
            write_private(target_folder / name, text.strip() if name == SECRET else text)


