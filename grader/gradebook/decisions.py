"""The instructor's review decisions as the log holds them: each decision, and the state in
force for a student (what replaying the log in order gives). Written by grader/gradebook/review.py,
read wherever grades are stored or shown."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime

from grader.common.errors import CourseError
from grader.common.text import inert
from grader.gradebook import ledger

RESOLVING = ("accept", "set", "total")  # decisions that settle a flagged submission


@dataclass
class Decision:
    """One row of the review log."""

    action: str
    by: str
    at: float
    exercise: str = ""
    points: float | None = None
    computed: float | None = None
    note: str = ""
    notebook_sha256: str = ""

    @property
    def when(self) -> str:
        return utc(self.at)

    def line(self) -> str:
        """The decision in one line, for the terminal and the export (control characters
        escaped)."""
        what = {"accept": "accepted the computed score",
                "set": f"set {self.exercise} to {_num(self.points)}"
                       + (f" (computed {_num(self.computed)})" if self.computed is not None
                          else ""),
                "total": f"set the lesson's score to {_num(self.points)}"
                         + (f" (computed {_num(self.computed)})" if self.computed is not None
                            else ""),
                "clear": f"cleared the score set for {self.exercise}",
                "clear-total": "cleared the lesson's score set",
                "note": "left a note",
                "discard": "discarded every earlier decision",
                "regrade": "graded the stored notebook again",
                "withdraw": "withdrew the grades"}.get(self.action, self.action)
        text = f"{self.when} {self.by}: {what}" + (f': "{self.note}"' if self.note else "")
        return inert(text, 3000)


@dataclass
class State:
    """The decisions in force for one student's lesson, and the whole trail."""

    overrides: dict[str, Decision] = field(default_factory=dict)  # exercise -> its "set"
    total: Decision | None = None
    accepted: Decision | None = None
    notes: list[Decision] = field(default_factory=list)
    history: list[Decision] = field(default_factory=list)

    @property
    def in_force(self) -> list[Decision]:
        found = [*self.overrides.values(), *([self.total] if self.total else []),
                 *([self.accepted] if self.accepted else []), *self.notes]
        return sorted(found, key=lambda d: d.at)

    @property
    def resolved(self) -> bool:
        return any(d.action in RESOLVING for d in self.in_force)

    def resolved_for(self, notebook_sha256: str) -> bool:
        """Whether a decision in force settles the flags of the notebook graded now: one made
        on that notebook (or on one the log did not name). A decision on an earlier hand-in
        settles nothing of a later, different one (a copy handed in after an accept, or no
        notebook at all)."""
        return any(d.action in RESOLVING and d.notebook_sha256 in ("", notebook_sha256)
                   for d in self.in_force)

    def made_elsewhere(self, notebook_sha256: str) -> bool:
        """Whether a decision in force that sets or settles a score was made on another
        notebook than the one graded now: its score stands, but it asks for a look."""
        return any(d.action in RESOLVING and d.notebook_sha256 not in ("", notebook_sha256)
                   for d in self.in_force)

    def summary(self) -> str:
        """What the export's ``review`` column says: the decisions in force, briefly."""
        parts = []
        if self.accepted:
            parts.append("accepted")
        parts += [f"set {name}" for name in sorted(self.overrides)]
        if self.total:
            parts.append("set total")
        if self.notes:
            parts.append("note")
        return "; ".join(parts)

    def comments(self) -> list[Decision]:
        """The decisions in force that carry a note, oldest first: what the student is shown."""
        return [d for d in self.in_force if d.note]


def replay(rows: list[dict]) -> dict[tuple[str, str], State]:
    """(lesson, student) -> the decisions in force, from the log's rows (oldest first)."""
    states: dict[tuple[str, str], State] = {}
    for row in rows:
        state = states.setdefault((row["lesson"], row["student_id"]), State())
        decision = Decision(row["action"], row["by"], row["at"], row["exercise"] or "",
                            row["points"], row["computed"], row["note"] or "",
                            row["notebook_sha256"] or "")
        state.history.append(decision)
        if decision.action == "set":
            state.overrides[decision.exercise] = decision
        elif decision.action == "clear":
            state.overrides.pop(decision.exercise, None)
        elif decision.action == "total":
            state.total = decision
        elif decision.action == "clear-total":
            state.total = None
        elif decision.action == "accept":
            state.accepted = decision
        elif decision.action == "note":
            state.notes.append(decision)
        elif decision.action in ("discard", "withdraw"):  # withdraw: the grades went too
            state.overrides, state.total, state.accepted, state.notes = {}, None, None, []
    return states


def states(db_url: str, lesson: str | None = None) -> dict[tuple[str, str], State]:
    try:
        return replay(ledger.read_decisions(db_url, lesson))
    except Exception as error:
        raise CourseError(f"cannot read the review log in {db_url}: "
                          f"{type(error).__name__}: {error}") from None


def state_of(db_url: str, lesson: str, student_id: str) -> State:
    return replay(ledger.read_decisions(db_url, lesson, student_id)).get(
        (lesson, student_id), State())


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def who(by: str | None) -> str:
    """The name a decision is recorded under: ``--by NAME``, else the operating system's user."""
    if by is not None:
        name = by.strip()
        if not name or len(name) > 128 or inert(name, 200) != name:
            raise CourseError("--by must be a name of 1 to 128 characters, with no control "
                              "characters")
        return name
    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment nor in the password database
        return f"uid {os.getuid()}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
