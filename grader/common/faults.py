"""Faults of the grader's infrastructure, told apart from a student's mistakes.

A gradebook database that does not answer, a broker gone away, a full disk: nobody's fault, and
never a reason to charge a student. Where the grader meets one it waits and tries again, within
a bound; past the bound it raises ``Unavailable``, the batch stops early with one line saying
what is missing, and ``--resume`` later finishes it (each submission is stored whole or not at
all, so nothing stored is lost and nothing half-stored is trusted).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# How long a database or broker may stay away before the batch stops (seconds). A restart of
# PostgreSQL or Redis takes a few seconds; a longer outage is the instructor's to fix.
WAIT_SECONDS = float(os.environ.get("CTC_INFRASTRUCTURE_WAIT", "60"))
# Free space below which a file system counts as full: a submission's run writes its notebook,
# the kernel's files and the graded copy, a few MiB at most.
LOW_SPACE_BYTES = 8 * 2**20
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}


class Unavailable(Exception):
    """Something the grader needs is not there (database, broker, disk): the batch stops."""

    def __init__(self, what: str, detail: str = ""):
        super().__init__(what + (f" ({detail})" if detail else ""))
        self.what = what


def is_database_error(error: BaseException) -> bool:
    """A database that did not answer or dropped the connection (not a bad query of ours)."""
    try:
        from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
    except ImportError:  # pragma: no cover - sqlalchemy comes with nbgrader
        return False
    if isinstance(error, (OperationalError, InterfaceError)):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


def is_disk_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_ERRNOS


def is_broker_error(error: BaseException) -> bool:
    """Redis (Celery's broker and result store) gone: a refused or dropped connection."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"ConnectionError", "TimeoutError", "OperationalError",
                         "BusyLoadingError"}) and any(
        cls.__module__.split(".")[0] in ("redis", "kombu", "celery", "builtins")
        for cls in type(error).__mro__)


# What SQLite says of a database file that is not one, or no longer whole.
DAMAGED = ("file is not a database", "database disk image is malformed",
           "malformed database schema", "file is encrypted or is not a database")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every error it came from (its cause, its context, a driver's ``orig``),
    each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "orig", None)]


def damaged_database(error: BaseException) -> str:
    """What SQLite said, where ``error`` (or an error it came from) says the database file is
    damaged; else ''."""
    for current in _chain(error):
        text = str(current).lower()
        found = next((what for what in DAMAGED if what in text), "")
        if found:
            return found
    return ""


def damaged_database_line(error: BaseException, db_url: str | None,
                          course_dir: str | None) -> str:
    """One line for a command stopped by a damaged gradebook's database, or ''."""
    what = damaged_database(error)
    if not what:
        return ""
    where = database_name(db_url) if db_url else os.path.join(course_dir or ".course",
                                                               "gradebook.db")
    return (f"the gradebook's database {where} is damaged ({what}): restore it from your "
            "backup, and keep the damaged file aside; nothing was changed")


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an error it came from) says the disk is full: an OSError's
    ENOSPC or EDQUOT, or SQLite's "database or disk is full"."""
    return any((isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT))
               or "database or disk is full" in str(current).lower()
               for current in _chain(error))


def describe(error: BaseException) -> str:
    """The first line of an error, short."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {text[:200]}"


def database_name(db_url: str) -> str:
    """The database's URL without a password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(db_url).render_as_string(hide_password=True)
    except Exception:
        return "the gradebook's database"


def retrying(action: Callable[[], T], *, what: str, is_transient: Callable[[BaseException], bool],
             wait_seconds: float | None = None, log: Callable[[str], None] | None = None) -> T:
    """``action()``, tried again with growing pauses while it fails with a transient error,
    for at most ``wait_seconds``; then ``Unavailable(what)``."""
    budget = WAIT_SECONDS if wait_seconds is None else wait_seconds
    deadline = time.monotonic() + budget
    pause, told = 0.5, False
    while True:
        try:
            return action()
        except Exception as error:
            if not is_transient(error):
                raise
            if time.monotonic() + pause > deadline:
                raise Unavailable(what, describe(error)) from error
            if log is not None and not told:
                log(f"{what} is not answering ({describe(error)}); trying again for up to "
                    f"{budget:.0f} s")
                told = True
            time.sleep(pause)
            pause = min(pause * 2, 8.0)


def check_space(folders: Iterable[Path], need: int = LOW_SPACE_BYTES) -> None:
    """``Unavailable`` where one of ``folders`` lies on a file system with less than ``need``
    bytes free."""
    for folder in folders:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            continue
        if free < need:
            raise Unavailable(f"the disk holding {folder} is full",
                              f"{free // 2**20} MiB free")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
