"""Secret keys kept in files: made once, whole, readable by their owner alone.

The course's key (``variants.key``: each student's numbers) and the queue's key
(``queue.key``: what the coordinator and its workers sign). A key file is written whole under
another name, then linked into place: it is there entire or not at all (a crash, a full disk),
and of two commands that make it at once the first one wins. One that is not a plain file of
the right size, or that others may read, is refused: a key replaced or read by someone else
gives away or changes what it protects.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

from grader.common.errors import CourseError

KEY_BYTES = 32


def key_file(path: Path, create: bool = False, what: str = "key",
             damaged: str = "restore it from a backup") -> bytes | None:
    """The key in ``path``; made there first with ``create`` (None without it when there is
    none). ``what`` and ``damaged`` name it and say what to do, in the refusals."""
    if create and not path.exists():
        write_key(path, secrets.token_bytes(KEY_BYTES))
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size != KEY_BYTES:
        raise CourseError(f"{path} is not {what} (a plain file of {KEY_BYTES} bytes): "
                          f"{damaged}")
    if info.st_mode & 0o077:
        raise CourseError(f"{path} may be read by others than its owner, and with it anyone "
                          f"can use {what}: run  chmod 600 {path}")
    return path.read_bytes()


def write_key(path: Path, data: bytes, replace: bool = False) -> None:
    """Write ``data`` as the key file ``path``, whole (mode 0600): where one is there already it
    stands (another command made it a moment ago), unless ``replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, written = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)  # mode 0600
    try:
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        if replace:
            os.replace(written, path)
            return
        with contextlib.suppress(FileExistsError):
            os.link(written, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(written)
