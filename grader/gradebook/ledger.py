"""What nbgrader's gradebook does not hold: each submission's status, reason and details, and
the instructor's review decisions.

Its tables, ``ctc_grading_status`` and ``ctc_review_log`` (and the course's roster and state,
``ctc_roster`` and ``ctc_course_state``), in the same database as the
gradebook (SQLite in the course directory by default, PostgreSQL where several graders share
one), so that everything a grade needs lives where the grades live and several graders can
write at once. ``ctc_grading_status`` has a row per lesson and student; writing one replaces it.
``grading_status.json`` in the course directory is a copy of it for people and scripts, written
after each batch.

``ctc_review_log`` is the audit trail of ``python -m grader review``: one row per decision
(accept, set, total, clear, clear-total, note, regrade, discard), who made it and when (UTC),
never changed or deleted; the decisions in force are what replaying it in order gives
(grader/gradebook/review.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from functools import cache

from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

METADATA = MetaData()
STATUS = Table(
    "ctc_grading_status", METADATA,
    Column("lesson", String(64), primary_key=True),
    Column("student_id", String(128), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("details", Text, nullable=False, default="{}"),  # JSON: seconds, flags, exercises
    Column("notebook_sha256", String(64), nullable=False, default=""),
    Column("graded_at", Float, nullable=False, default=0.0),
)
REVIEW_LOG = Table(
    "ctc_review_log", METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("lesson", String(64), nullable=False, index=True),
    Column("student_id", String(128), nullable=False),
    Column("action", String(16), nullable=False),
    Column("exercise", String(128), nullable=False, default=""),
    Column("points", Float, nullable=True),  # the score set; None for other actions
    Column("computed", Float, nullable=True),  # what the grader had computed, for the record
    Column("note", Text, nullable=False, default=""),
    Column("by", String(128), nullable=False),
    Column("at", Float, nullable=False),  # seconds since the epoch (UTC)
    Column("notebook_sha256", String(64), nullable=False, default=""),
)

# The course roster (grader/gradebook/identity.py): every id that stands for a student, each
# mapped to the student's course id; a row per (kind, value).
ROSTER = Table(
    "ctc_roster", METADATA,
    Column("kind", String(80), primary_key=True),  # canvas, moodle:LESSON, email, ...
    Column("value", String(200), primary_key=True),
    Column("course_id", String(128), nullable=False, index=True),
    Column("name", Text, nullable=False, default=""),
    Column("email", Text, nullable=False, default=""),
    Column("source", Text, nullable=False, default=""),  # the file and line it came from
    Column("added_at", Float, nullable=False, default=0.0),
)
# What a whole course keeps beside its grades: the fingerprint of its key (variants.key).
COURSE_STATE = Table(
    "ctc_course_state", METADATA,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    Column("at", Float, nullable=False, default=0.0),
)


@cache
def engine(db_url: str) -> Engine:
    """The database's engine, the course's tables created where missing. Two graders that
    create them at the same instant on PostgreSQL collide in its catalogue (a duplicate key of
    pg_type): the loser finds them made on its next try."""
    made = create_engine(db_url, pool_pre_ping=True)
    for attempt in range(5):
        try:
            METADATA.create_all(made)
            return made
        except (IntegrityError, ProgrammingError):
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    return made


def write_in(connection, lesson: str, rows: Iterable[dict]) -> None:
    """Store (replace) the status of each student in ``rows`` for ``lesson`` through
    ``connection`` (a SQLAlchemy connection or session), inside the caller's transaction: the
    grader writes a submission's grades and its row here together, or neither."""
    for row in rows:
        connection.execute(STATUS.delete().where(
            (STATUS.c.lesson == lesson) & (STATUS.c.student_id == row["student_id"])))
        connection.execute(STATUS.insert().values(
            lesson=lesson, student_id=row["student_id"], status=row["status"],
            reason=row.get("reason", ""),
            details=json.dumps(row.get("details", {}), sort_keys=True),
            notebook_sha256=row.get("notebook_sha256", ""), graded_at=time.time()))


def write(db_url: str, lesson: str, rows: Iterable[dict]) -> None:
    """Store (replace) the status of each student in ``rows`` for ``lesson``, in a
    transaction of its own."""
    rows = list(rows)
    for attempt in range(5):  # another grader may hold the database for a moment
        try:
            with engine(db_url).begin() as connection:
                write_in(connection, lesson, rows)
            return
        except (IntegrityError, OperationalError):
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def refresh_handin(db_url: str, lesson: str, student_id: str, handin: dict) -> None:
    """Replace what ``student_id``'s row of ``lesson`` keeps of the hand-in (its names), the
    grade and when it was made untouched: ``autograde --resume`` skipping a student."""
    with engine(db_url).begin() as connection:
        row = connection.execute(select(STATUS.c.details).where(
            (STATUS.c.lesson == lesson) & (STATUS.c.student_id == student_id))).first()
        if row is None:
            return
        details = {**json.loads(row.details), "handin": handin}
        connection.execute(STATUS.update().where(
            (STATUS.c.lesson == lesson) & (STATUS.c.student_id == student_id)).values(
            details=json.dumps(details, sort_keys=True)))


def read(db_url: str, lesson: str | None = None) -> dict[str, dict[str, dict]]:
    """lesson -> student -> {status, reason, notebook_sha256, and the details}."""
    query = select(STATUS)
    if lesson is not None:
        query = query.where(STATUS.c.lesson == lesson)
    found: dict[str, dict[str, dict]] = {}
    with engine(db_url).connect() as connection:
        for row in connection.execute(query):
            record = {"status": row.status, "reason": row.reason,
                      "notebook_sha256": row.notebook_sha256, **json.loads(row.details)}
            found.setdefault(row.lesson, {})[row.student_id] = record
    return found


def log_in(connection, rows: Iterable[dict]) -> None:
    """Append decisions to the review log through ``connection``, in the caller's
    transaction."""
    for row in rows:
        connection.execute(REVIEW_LOG.insert().values(
            lesson=row["lesson"], student_id=row["student_id"],
            action=row["action"], exercise=row.get("exercise", ""),
            points=row.get("points"), computed=row.get("computed"),
            note=row.get("note", ""), by=row["by"], at=row.get("at", time.time()),
            notebook_sha256=row.get("notebook_sha256", "")))


def log_decisions(db_url: str, rows: Iterable[dict]) -> None:
    """Append decisions to the review log, all or none."""
    rows = list(rows)
    for attempt in range(5):
        try:
            with engine(db_url).begin() as connection:
                log_in(connection, rows)
            return
        except OperationalError:  # SQLite busy: another grader is writing
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def read_decisions(db_url: str, lesson: str | None = None,
                   student_id: str | None = None) -> list[dict]:
    """The review log, oldest first (as written: the id orders it)."""
    query = select(REVIEW_LOG).order_by(REVIEW_LOG.c.id)
    if lesson is not None:
        query = query.where(REVIEW_LOG.c.lesson == lesson)
    if student_id is not None:
        query = query.where(REVIEW_LOG.c.student_id == student_id)
    with engine(db_url).connect() as connection:
        return [dict(row._mapping) for row in connection.execute(query)]
