"""One batch of a lesson at a time: a lock per course and lesson, held while a command changes
that lesson's grades (``autograde``, ``review --regrade``, ``withdraw``).

Two batches of one lesson at once would read and write the same students (each one's copy of
a hand-in, its stored grade, --resume's view of what is done): the second is refused, in one
line naming the first. The lock lives where the grades live, so that it holds across every
machine that shares them:

- SQLite (one machine): an ``flock`` on a file beside the database,
  ``<gradebook.db>.LESSON.lock``, which the kernel releases when its process ends, however it
  ends (a SIGKILL, the OOM killer);
- PostgreSQL (several graders): a session-level advisory lock of the database
  (``pg_try_advisory_lock``) on a connection held for the batch, which the server releases
  when that connection ends, the grader's machine lost included. The connection's
  ``application_name`` says who holds it (machine, process, command).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.faults import Unavailable, database_name, describe, is_database_error
from grader.common.text import inert


class Busy(CourseError):
    """Another batch of the lesson holds its lock."""


def _holder(what: str) -> str:
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{what} on {socket.gethostname()}, process {os.getpid()}, since {started}"


def _refusal(lesson: str, holder: str) -> str:
    who = inert(holder, 400) or "who, unknown"
    return (f"another command is changing the grades of {lesson} ({who}): one batch of a "
            "lesson at a time. Wait for it to end, then run this again (with --resume, a "
            "batch skips what the other stored)")


@contextlib.contextmanager
def lesson_lock(course, lesson: str, what: str) -> Iterator[None]:
    """Hold the lock of ``lesson`` in ``course``'s gradebook while the block runs, or raise
    ``Busy`` at once when another command holds it. ``what``: the command, for the other's
    refusal."""
    url = course.db_url
    if url.startswith("sqlite"):
        with _file_lock(_lock_file(course, lesson), lesson, what):
            yield
    elif url.startswith("postgresql"):
        with _advisory_lock(url, lesson, what):
            yield
    else:  # another database: nbgrader supports these two; say that nothing guards it
        course.log(f"note: no lock for {url.split(':', 1)[0]} databases: run one batch of "
                   f"{lesson} at a time")
        yield


def _lock_file(course, lesson: str) -> Path:
    from sqlalchemy.engine import make_url

    database = make_url(course.db_url).database
    if not database or database == ":memory:":
        return course.root / f".batch-{lesson}.lock"
    path = Path(database)
    return path.with_name(f".{path.name}.{lesson}.lock")


@contextlib.contextmanager
def _file_lock(path: Path, lesson: str, what: str) -> Iterator[None]:
    # Never through a link, never a file of another kind: a symlink put at the lock's name
    # would otherwise have the lock's holder truncate and write whatever it points to (the
    # course's key, say).
    try:
        handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CourseError(f"cannot lock the grades of {lesson}: {path} is a symbolic link, "
                              "not the grader's lock file; remove it and run again") from None
        raise CourseError(f"cannot lock the grades of {lesson} ({path}: "
                          f"{error.strerror}): is the course directory writable?") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise CourseError(f"cannot lock the grades of {lesson}: {path} is not a regular file, "
                          "not the grader's lock file; remove it and run again")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(handle, 400, 0).decode("utf-8", "replace").strip()
            raise Busy(_refusal(lesson, holder)) from None
        with contextlib.suppress(OSError):  # who holds it, for the other's refusal
            text = _holder(what).encode()
            os.ftruncate(handle, 0)
            os.pwrite(handle, text, 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.close(handle)  # the lock goes with the file's last descriptor


def advisory_key(lesson: str) -> int:
    """The lesson's lock as PostgreSQL's advisory lock key: a signed 64-bit number."""
    return int.from_bytes(hashlib.sha256(f"ctc-batch/{lesson}".encode()).digest()[:8], "big",
                          signed=True)


# How the server cuts off a lock holder whose machine is lost (preempted, powered off: no
# FIN, no RST): TCP keepalive probes from the server after 10 s of silence, 5 s apart, 4 of
# them unanswered, and no sent byte left unacknowledged for 30 s (tcp_user_timeout). The
# server then ends the session and the lock with it, within about 30 s; the defaults, the
# system's, took 2 h 11 min. Per session, for the lock's connection alone.
SERVER_KEEPALIVE = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5,
                    "tcp_keepalives_count": 4, "tcp_user_timeout": 30_000}


@contextlib.contextmanager
def _advisory_lock(url: str, lesson: str, what: str) -> Iterator[None]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    key = advisory_key(lesson)
    # the client side's keepalive too: a lost database server is noticed as soon
    engine = create_engine(url, poolclass=NullPool,
                           connect_args={"application_name": ("ctc " + _holder(what))[:63],
                                         "keepalives": 1, "keepalives_idle": 10,
                                         "keepalives_interval": 5, "keepalives_count": 4})
    try:
        connection = engine.connect()
    except Exception as error:
        engine.dispose()
        if is_database_error(error):
            raise Unavailable(f"the gradebook's database ({database_name(url)})",
                              describe(error)) from error
        raise
    try:
        for setting, value in SERVER_KEEPALIVE.items():  # (names are ours, not input)
            # a server too old for one goes without it
            with contextlib.suppress(Exception), connection.begin_nested():
                connection.execute(text(f"SET {setting} = {int(value)}"))
        for _ in range(5):
            got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                     {"key": key}).scalar()
            connection.commit()
            if got:
                break
            holder = _pg_holder(connection, key)
            if holder is not None:
                raise Busy(_refusal(lesson, holder))
            # no one holds it now: its holder ended (the server cut a lost machine off, say)
            # between the two queries, and the lesson is free: try again
            time.sleep(0.05)
        else:
            raise Busy(_refusal(lesson, ""))
        beating = _Heartbeat(connection)
        beating.start()
        try:
            yield
        finally:
            beating.stop()
    finally:
        with contextlib.suppress(Exception):
            connection.close()  # ends the session, and with it the lock
        engine.dispose()


HEARTBEAT_SECONDS = 10.0


class _Heartbeat(threading.Thread):
    """A query on the lock's connection every HEARTBEAT_SECONDS while the lock is held, so that
    pg_stat_activity shows it alive: another grader's refusal says how long a holder has been
    silent (three beats missed: its machine is likely lost, and the server ends it)."""

    def __init__(self, connection):
        super().__init__(daemon=True, name="ctc-lock-heartbeat")
        self.connection, self.stopping = connection, threading.Event()

    def run(self) -> None:
        from sqlalchemy import text

        while not self.stopping.wait(HEARTBEAT_SECONDS):
            try:
                self.connection.execute(text("SELECT 1"))
                self.connection.commit()
            except Exception:  # the server gone: the batch's own queries say so
                return

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


def _pg_holder(connection, key: int) -> str | None:
    """Who holds the advisory lock ``key``: their connection's application name, and how long
    the connection has said nothing (a lost machine's is cut off by the server); None when
    no one holds it now."""
    from sqlalchemy import text

    unsigned = key & 0xFFFFFFFFFFFFFFFF
    row = connection.execute(text(
        "SELECT a.application_name, host(a.client_addr), "
        "EXTRACT(EPOCH FROM now() - a.state_change) FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.classid::bigint = :high AND l.objid::bigint = :low "
        "AND l.objsubid = 1"),
        {"high": unsigned >> 32, "low": unsigned & 0xFFFFFFFF}).first()
    # (pg_stat_activity is read once a transaction: the next look must see it afresh)
    connection.rollback()
    if row is None:
        return None
    holder = str(row[0] or "").removeprefix("ctc ")
    if row[2] is not None and float(row[2]) >= 3 * HEARTBEAT_SECONDS:
        holder += (f"; its connection{' from ' + str(row[1]) if row[1] else ''} has "
                   f"been silent for {float(row[2]):.0f} s, and the server ends it "
                   "within about 30 s of silence if its machine is lost")
    return holder
