"""Each hand-in's submission time, as stored beside the gradebook (``ctc_submission_time``):
when, from which source, and whether the LMS marked it late."""

from __future__ import annotations

import time

from sqlalchemy import Boolean, Column, Float, String, Table, select


def _table():
    from grader.gradebook.ledger import METADATA

    if "ctc_submission_time" in METADATA.tables:
        return METADATA.tables["ctc_submission_time"]
    return Table(
        "ctc_submission_time", METADATA,
        Column("lesson", String(64), primary_key=True),
        Column("student_id", String(128), primary_key=True),
        Column("submitted_at", Float, nullable=True),  # seconds since the epoch; None: unknown
        Column("source", String(200), nullable=False, default=""),
        Column("late_mark", Boolean, nullable=False, default=False),
        Column("recorded_at", Float, nullable=False),
    )


TIMES = _table()


def write_times(db_url: str, lesson: str, rows: dict[str, dict]) -> None:
    """Store (replace) each student's submission time for ``lesson``."""
    from grader.gradebook.ledger import engine

    TIMES.create(engine(db_url), checkfirst=True)
    with engine(db_url).begin() as connection:
        for student, row in rows.items():
            connection.execute(TIMES.delete().where(
                (TIMES.c.lesson == lesson) & (TIMES.c.student_id == student)))
            connection.execute(TIMES.insert().values(
                lesson=lesson, student_id=student, submitted_at=row.get("submitted_at"),
                source=str(row.get("source", ""))[:200], late_mark=bool(row.get("late_mark")),
                recorded_at=time.time()))


def read_times(db_url: str) -> dict[tuple[str, str], dict]:
    from grader.gradebook.ledger import engine

    TIMES.create(engine(db_url), checkfirst=True)
    with engine(db_url).connect() as connection:
        return {(row.lesson, row.student_id): {"submitted_at": row.submitted_at,
                                               "source": row.source,
                                               "late_mark": row.late_mark}
                for row in connection.execute(select(TIMES))}
