"""Files the grader writes and removes: a file written whole or not at all, a folder removed
however deep its tree.

Every file written for a person or an LMS (a CSV, a zip, an HTML page, a report, a plot) goes
through ``written``: it is written under a temporary name beside its final one and renamed
into place when complete, so a full disk, a kill or an error half way leaves the earlier file
as it was (a rename within a folder is atomic on POSIX), never a file cut mid-row. A disk that
cannot take it stops the command with ``Unavailable`` (one line, exit status 3)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from grader.common.faults import Unavailable, describe, is_disk_error, process_alive


@contextlib.contextmanager
def written(path: Path, mode: str = "w", *, newline: str | None = None,
            encoding: str | None = "utf-8", private: bool = False) -> Iterator[IO]:
    """A handle to write ``path`` through: under a temporary name in its folder, renamed to
    ``path`` once the block ends without an error (flushed to the disk first); on an error
    the temporary file goes and ``path`` is left as it was. A full or read-only disk raises
    ``Unavailable``. ``private``: readable by its owner alone (else as a new file would be)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_left_behind(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_OWNER}-",
                                   suffix=".partial")
    except OSError as error:
        raise _stopped(path, error) from error
    try:
        if not private:  # mkstemp makes 0600: give the mode a new file would have
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
        binary = "b" in mode
        with os.fdopen(fd, mode, **({} if binary else {"newline": newline,
                                                        "encoding": encoding})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(error, OSError) and is_disk_error(error):
            raise _stopped(path, error) from error
        raise


# Whose temporary files are whose: this machine and process, in each one's name.
_OWNER = f"{socket.gethostname().replace('.', '_').replace('-', '_')[:40]}.{os.getpid()}"


def _remove_left_behind(path: Path) -> None:
    """Remove the temporary files of ``path`` that a writer killed half way left (a kill -9,
    a lost machine cannot clean up): those of a process of this machine that no longer runs,
    and any a day old (another machine's, or one named before names said whose)."""
    host = _OWNER.rsplit(".", 1)[0]
    for partial in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
        owner = partial.name[len(path.name) + 2:].rsplit("-", 1)[0]
        machine, _, pid = owner.rpartition(".")
        try:
            if machine == host and pid.isdigit():
                if process_alive(int(pid)):
                    continue
            elif time.time() - partial.lstat().st_mtime < 86400:
                continue
            partial.unlink()
        except OSError:
            continue  # gone meanwhile, or not ours to remove: it harms nothing


def write_text(path: Path, text: str) -> None:
    """``path``'s text, written whole (``written``)."""
    with written(path) as handle:
        handle.write(text)


def write_bytes(path: Path, data: bytes) -> None:
    """``path``'s bytes, written whole (``written``)."""
    with written(path, "wb") as handle:
        handle.write(data)


def _stopped(path: Path, error: OSError) -> Exception:
    if not is_disk_error(error):
        return error
    import errno

    what = ("is read-only" if error.errno == errno.EROFS else "is full"
            if error.errno in (errno.ENOSPC, errno.EDQUOT) else "cannot be written")
    return Unavailable(f"the disk holding {path.parent} {what}; {path.name} was not written "
                       "(an earlier one stays as it was)", describe(error))


def remove_tree(path: Path) -> None:
    """Remove a folder however deep its tree (shutil.rmtree recurses in Python, and raises
    RecursionError on a tree deeper than about a thousand folders)."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False,
                       capture_output=True)
