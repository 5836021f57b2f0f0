"""What a course keeps beside its grades, for the life of the course: the fingerprint of its
key.

The key (``variants.key``, grader/content/variants.py) decides every student's numbers. Its
fingerprint is stored in the gradebook's database (``ctc_course_state``) when the key is first
made or first seen, so that the grades and the key travel together: a course directory whose
key is lost (a restore without it, a copy) or is another course's (a second coordinator that
made its own) refuses to grade, to release or to make a key, and says to restore the key
whose fingerprint the gradebook names. A new key would change every student's numbers.

A course released before keys existed has variant lessons in its gradebook, no key and no
fingerprint, and no graded notebook that records one: it is recognised as keyless
(``keyless`` is stored), and stays so: its students work on the default numbers. ``release
--new-key`` gives it a key from then on, saying what that changes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import select

from grader.common.errors import CourseError
from grader.content.variants import KEY_FILE, course_key, fingerprint, variants_of
from grader.gradebook import ledger

FINGERPRINT = "key_fingerprint"
KEYLESS = "keyless"  # stored as the fingerprint of a course released before keys existed


def read_state(db_url: str, name: str) -> str | None:
    with ledger.engine(db_url).connect() as connection:
        row = connection.execute(select(ledger.COURSE_STATE.c.value).where(
            ledger.COURSE_STATE.c.name == name)).first()
    return None if row is None else str(row[0])


def write_state(db_url: str, name: str, value: str, replace: bool = False) -> str:
    """Store ``value`` under ``name`` unless a value is there (or ``replace``); the value in
    force afterwards (another grader's, where it stored one first)."""
    from sqlalchemy.exc import IntegrityError

    table = ledger.COURSE_STATE
    try:
        with ledger.engine(db_url).begin() as connection:
            if replace:
                connection.execute(table.delete().where(table.c.name == name))
            connection.execute(table.insert().values(name=name, value=value, at=time.time()))
    except IntegrityError:  # there already: the first one stands
        pass
    found = read_state(db_url, name)
    return value if found is None else found


def _variant_lessons_released(course) -> list[str]:
    """The lessons with variants that nbgrader's gradebook knows as released."""
    from grader.content.lessons import load_lesson

    if not course.has_gradebook():
        return []
    with course.gradebook() as gb:
        names = sorted(a.name for a in gb.assignments)
    found = []
    for name in names:
        try:
            if variants_of(load_lesson(name)):
                found.append(name)
        except CourseError:
            continue
    return found


def _recorded_fingerprints(root: Path) -> set[str]:
    """The key fingerprints the course's graded and handed-in notebooks record (their
    variant cells' output): a course whose notebooks name one had a key."""
    found: set[str] = set()
    for folder in ("autograded", "submitted"):
        for path in sorted((root / folder).glob("*/*/*.ipynb"))[:2000]:
            found |= notebook_fingerprints(path)
    return found


def notebook_fingerprints(path: Path) -> set[str]:
    """The key fingerprints one notebook's variant cells record (none where it cannot be
    read)."""
    try:
        if path.stat().st_size > 50 * 2**20:
            return set()
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    if '"counting_the_cost"' not in text:
        return set()
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError):
        return set()
    found: set[str] = set()
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            meta = output.get("metadata") if isinstance(output, dict) else None
            mark = meta.get("counting_the_cost") if isinstance(meta, dict) else None
            shown = mark.get("variant") if isinstance(mark, dict) else None
            if isinstance(shown, dict) and isinstance(shown.get("course"), str) \
                    and shown["course"]:
                found.add(shown["course"][:40])
    return found


def refuse_keyless_grading(course, notebooks: list[Path]) -> None:
    """A course with no key grades everyone on the default numbers: refused where the hand-ins
    themselves say they were drawn with a course's key (a fingerprint that two of them, or the
    only one, record): that key was lost, and must be restored (and is then taken back,
    although the course was taken for keyless a moment ago)."""
    from collections import Counter

    counts = Counter(mark for path in notebooks for mark in notebook_fingerprints(path))
    if counts:
        mark, n = counts.most_common(1)[0]
        if n >= min(2, len(notebooks)):
            if course.has_gradebook() and read_state(course.db_url, FINGERPRINT) == KEYLESS:
                write_state(course.db_url, FINGERPRINT, mark, replace=True)
            raise CourseError(restore_message(course.root, mark,
                                              f"{n} of these hand-ins were worked with a key"))


def restore_message(root: Path, stored: str,
                    whose: str = "this course's gradebook was graded with a key") -> str:
    return (f"{root / KEY_FILE} is missing, and {whose} "
            f"whose fingerprint is {stored}: restore that variants.key from a backup of the "
            "course directory (or copy it from the coordinator whose gradebook this is: "
            "coordinators sharing a database share the key, docs/many-machines.md). A new key "
            "would give every student other numbers than the ones they worked on")


def checked_key(course, create: bool = False, new: bool = False,
                record: bool = True) -> bytes | None:
    """The course's key, checked against the fingerprint its gradebook keeps; None where the
    course has none (no variant lesson released yet, or released before keys existed).
    ``create``: make the key where the course may have one and has none yet (``release``);
    ``new``: make or adopt one whatever the gradebook says (``release --new-key``).
    ``record``: store what is found (the hub, which runs as another user, only reads).
    Refused, saying what to do: a key missing, or another than the gradebook's."""
    root = course.root
    db = course.db_url if course.has_gradebook() else None
    stored = read_state(db, FINGERPRINT) if db else None
    key = course_key(root)

    def keep(value: str, replace: bool = False) -> str:
        return write_state(db, FINGERPRINT, value, replace) if record and db else value

    if new:  # a new key, whatever was there: the old one kept aside, and said
        aside = ""
        if key is not None:
            aside = f"{KEY_FILE}.{fingerprint(key)}.old"
            (root / KEY_FILE).rename(root / aside)
        key = course_key(root, create=True)
        keep(fingerprint(key), replace=True)
        course.log(f"a new key for the course, fingerprint {fingerprint(key)}"
                   + (f" (the gradebook's was {stored})" if stored not in (None, KEYLESS)
                      else "") + (f"; the old one kept as {aside}" if aside else "")
                   + ": every student's numbers change from now on; give students on their "
                     "own machines their new codes (python -m grader variants)")
        return key
    if stored == KEYLESS:
        if key is not None and fingerprint(key) in _recorded_fingerprints(root):
            keep(fingerprint(key), replace=True)  # the key it lost, restored
            return key
        if key is not None:
            raise CourseError(f"this course was released before courses had keys, and "
                              f"{root / KEY_FILE} has appeared since: remove it (its students "
                              "worked on the default numbers), or give every student numbers "
                              "of their own from now on with  python -m grader release "
                              "--new-key")
        return None
    if stored is not None:
        if key is None:
            raise CourseError(restore_message(root, stored))
        if fingerprint(key) != stored:
            raise CourseError(_foreign(root, fingerprint(key), stored))
        return key
    if key is not None:  # made before the gradebook, or by an older version: adopted
        seen = _recorded_fingerprints(root) if db else set()
        if seen and fingerprint(key) not in seen:  # but not the key its notebooks were drawn with
            raise CourseError(_foreign(root, fingerprint(key), ", ".join(sorted(seen))))
        kept = keep(fingerprint(key))
        if kept != fingerprint(key):
            raise CourseError(_foreign(root, fingerprint(key), kept))
        return key
    released = _variant_lessons_released(course)
    if released:
        seen = _recorded_fingerprints(root)
        if seen:
            raise CourseError(restore_message(root, ", ".join(sorted(seen))))
        if keep(KEYLESS) == KEYLESS and record and db:
            course.log(f"note: this course released {', '.join(released)} before courses had "
                       "keys: it has none, and its students work on the default numbers "
                       "(release --new-key gives each student numbers of their own from then "
                       "on)")
        return None
    if not create:
        return None
    key = course_key(root, create=True)
    kept = keep(fingerprint(key))
    if kept != fingerprint(key):
        raise CourseError(_foreign(root, fingerprint(key), kept))
    return key


def _foreign(root: Path, mark: str, stored: str) -> str:
    return (f"{root / KEY_FILE} (fingerprint {mark}) is not the key this course's gradebook "
            f"was graded with (fingerprint {stored}): restore the course's own variants.key; "
            "a coordinator that shares this database must use that key, not one of its own "
            "(docs/many-machines.md)")
