"""Each student's own variant of an exercise: a course key, and a draw from it (issue 34).

A course's key is 32 random bytes in ``<course-dir>/variants.key`` (mode 0600), made once (by
the first ``release``, once the lessons draw variants) and kept for the life of the course. A
student's variant of an exercise is HMAC-SHA256(key, "LESSON/EXERCISE/STUDENT") read as a
number, modulo the number of variants: the same id always draws the same variant, in the lab,
at grading, in review and feedback, and without the key no one can tell which variant another
id draws. The key lives beside the gradebook; nothing under ``release/`` or ``source/`` (what
students receive) holds it.

HMAC rather than a plain hash of the id: the ids are known (a class list), so a plain hash
would let anyone compute every student's variant. ``seed`` gives the same kind of number for
drawing a student's own hidden-check inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from grader.common.errors import CourseError

KEY_FILE = "variants.key"
KEY_BYTES = 32


def course_key(root: Path, create: bool = False) -> bytes | None:
    """The course's key, read from ``root``/variants.key; made there first with ``create``
    (None without it when there is none yet). A key file that is not a plain file of 32 bytes
    readable by its owner alone is refused: grading with another key would give every student
    other questions."""
    path = root / KEY_FILE
    if create and not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another release made it a moment ago
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_bytes(KEY_BYTES))
            finally:
                os.close(fd)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
        raise CourseError(f"{path} is not the course's key (a plain file of {KEY_BYTES} "
                          "bytes): restore it from a backup of the course directory; a new key "
                          "would give every student other variants")
    if info.st_mode & 0o077:
        raise CourseError(f"{path} may be read by others than its owner, and with it anyone "
                          f"can tell every student's variant: run  chmod 600 {path}")
    return path.read_bytes()


def _number(key: bytes, lesson: str, exercise: str, student_id: str) -> int:
    message = "/".join((lesson, exercise, student_id)).encode()
    return int.from_bytes(hmac.new(key, message, hashlib.sha256).digest(), "big")


def draw(key: bytes, lesson: str, exercise: str, student_id: str, count: int) -> int:
    """The variant (0 to ``count`` - 1) of ``exercise`` that ``student_id`` answers. With 256
    bits drawn, reducing modulo a small count leaves no bias worth a thought (under 2**-240)."""
    if count < 1:
        raise ValueError(f"an exercise has at least one variant, got {count}")
    return _number(key, lesson, exercise, student_id) % count


def seed(key: bytes, lesson: str, exercise: str, student_id: str) -> int:
    """A 64-bit seed of the student's own for ``exercise`` (its hidden checks' drawn inputs)."""
    return _number(key, lesson, f"{exercise}#seed", student_id) >> 192
