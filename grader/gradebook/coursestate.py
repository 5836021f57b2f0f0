"""What a course keeps beside its grades, for the life of the course: the fingerprint of its
key.

The key (``variants.key``, grader/content/variants.py) decides every student's numbers. Its
fingerprint is stored in the gradebook's database (``ctc_course_state``) when the key is first
made or first seen, so that the grades and the key travel together: a course directory whose
key is lost (a restore without it, a copy) or is another course's (a second coordinator that
made its own) refuses to grade, to release or to make a key, and says to restore the key
whose fingerprint the gradebook names. A new key would change every student's numbers.

Every key the course has had is kept beside it, ``variants.key.FINGERPRINT`` (the current one
too, so that a backup restored over ``variants.key`` loses none), and the gradebook keeps the
fingerprints of the keys it had before (``key_past``). ``release --new-key`` makes a new key
for the numbers from then on; a hand-in is graded on the key its notebook records where the
course has it, so no grade changes with the key. A key the course had before, put back (a
backup restored, or ``release --restore-key FILE``), is taken back.

A course released before keys existed has variant lessons in its gradebook, no key and no
fingerprint, and no graded notebook that records one: it is recognised as keyless
(``keyless`` is stored), and stays so: its students work on the default numbers. ``release
--new-key`` gives it a key from then on, saying what that changes.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import select

from grader.common.errors import CourseError
from grader.common.keys import KEY_BYTES, key_file, write_key
from grader.content.variants import KEY_FILE, course_key, fingerprint, variants_of
from grader.gradebook import ledger

FINGERPRINT = "key_fingerprint"
KEYLESS = "keyless"  # stored as the fingerprint of a course released before keys existed
PAST = "key_past"  # the fingerprints of the keys the course had before, a JSON list
MADE_NEW = "key_made_new"  # the fingerprint of the key that release --new-key made last
RING_NAME = re.compile(r"[0-9a-f]{12}")  # a fingerprint, as a kept key's file names it


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
    return set(fingerprint_counts(path))


def fingerprint_counts(path: Path) -> Counter:
    """How many of one notebook's variant cells record each key fingerprint."""
    found: Counter = Counter()
    try:
        if path.stat().st_size > 50 * 2**20:
            return found
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    if '"counting_the_cost"' not in text:
        return found
    try:
        nb = json.loads(text)
    except (ValueError, RecursionError):
        return found
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:
            meta = output.get("metadata") if isinstance(output, dict) else None
            mark = meta.get("counting_the_cost") if isinstance(meta, dict) else None
            shown = mark.get("variant") if isinstance(mark, dict) else None
            if isinstance(shown, dict) and isinstance(shown.get("course"), str) \
                    and shown["course"]:
                found[shown["course"][:40]] += 1
    return found


def key_ring(root: Path) -> dict[str, bytes]:
    """Every key the course directory keeps, by fingerprint: ``variants.key`` and each kept as
    ``variants.key.FINGERPRINT`` (``.FINGERPRINT.old``, as --new-key named them before). A file
    whose key does not have the fingerprint its name says is left out."""
    ring: dict[str, bytes] = {}
    for path in sorted(root.glob(f"{KEY_FILE}.*")):
        name = path.name[len(KEY_FILE) + 1:].removesuffix(".old")
        if not RING_NAME.fullmatch(name):
            continue
        try:
            key = key_file(path, what="a kept key of the course")
        except CourseError:
            continue
        if key is not None and fingerprint(key) == name:
            ring[name] = key
    current = course_key(root)
    if current is not None:
        ring[fingerprint(current)] = current
    return ring


def handin_key(notebook: Path, key: bytes | None, ring: dict[str, bytes],
               graded_with: str | None = None) -> bytes | None:
    """The key a hand-in is graded on: the one its notebook's variant cells record (most of
    them), where the course keeps it; for a notebook that records none (its outputs cleared),
    ``graded_with``, the key this very notebook was graded on before; else the course's key.
    Numbers drawn before a ``release --new-key`` stay the student's numbers."""
    if key is None or len(ring) < 2:
        return key
    counts = fingerprint_counts(notebook)
    kept = [(n, mark) for mark, n in counts.items() if mark in ring]
    if not counts and graded_with in ring:
        return ring[graded_with]
    if not kept or fingerprint(key) in counts:
        return key
    return ring[max(kept)[1]]


def _keep(root: Path, key: bytes) -> None:
    """Keep a copy of ``key`` as ``variants.key.FINGERPRINT`` (once; not in a course
    directory this user may only read, as ``report --out`` reads one)."""
    path = root / f"{KEY_FILE}.{fingerprint(key)}"
    if not path.exists() and os.access(root, os.W_OK):
        write_key(path, key)


def _past(db: str | None) -> list[str]:
    try:
        found = json.loads(read_state(db, PAST) or "[]") if db else []
    except ValueError:
        return []
    return [str(mark) for mark in found] if isinstance(found, list) else []


def _retire(db: str | None, mark: str | None) -> None:
    """Add ``mark`` to the fingerprints of the keys the course had before."""
    if db and mark not in (None, KEYLESS) and mark not in _past(db):
        write_state(db, PAST, json.dumps([*_past(db), mark]), replace=True)


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
    kept = key_ring(root).get(stored)
    return (f"{root / KEY_FILE} is missing, and {whose} "
            f"whose fingerprint is {stored}: "
            + (f"the course keeps it: python -m grader release --restore-key "
               f"{root / KEY_FILE}.{stored}" if kept else
               "restore that variants.key from a backup of the course directory (or copy it "
               "from the coordinator whose gradebook this is: coordinators sharing a database "
               "share the key, docs/many-machines.md)")
            + ". A new key would give every student other numbers than the ones they worked on")


def checked_key(course, create: bool = False, new: int = 0,
                record: bool = True) -> bytes | None:
    """The course's key, checked against the fingerprint its gradebook keeps; None where the
    course has none (no variant lesson released yet, or released before keys existed).
    ``create``: make the key where the course may have one and has none yet (``release``);
    ``new``: make one whatever the gradebook says (``release --new-key``; once more, 2, where
    the key is one --new-key made that no hand-in records yet).
    ``record``: store what is found (the hub, which runs as another user, only reads).
    Refused, saying what to do: a key missing, or another than the gradebook's (a key the
    course had before, put back, is taken back)."""
    root = course.root
    db = course.db_url if course.has_gradebook() else None
    stored = read_state(db, FINGERPRINT) if db else None
    key = course_key(root)

    def keep(value: str, replace: bool = False) -> str:
        return write_state(db, FINGERPRINT, value, replace) if record and db else value

    if new:  # a new key, whatever was there: the old one kept, and said
        if key is not None:
            _refuse_another_new_key(root, db, key, stored, new)
            _keep(root, key)
            _retire(db, fingerprint(key))
            (root / KEY_FILE).unlink()
        _retire(db, stored)
        key = course_key(root, create=True)
        _keep(root, key)
        keep(fingerprint(key), replace=True)
        if db and record:
            write_state(db, MADE_NEW, fingerprint(key), replace=True)
        course.log(f"a new key for the course, fingerprint {fingerprint(key)}"
                   + (f" (the gradebook's was {stored}, kept as {KEY_FILE}.{stored}: hand-ins "
                      "worked on its numbers are graded on them)"
                      if stored not in (None, KEYLESS) else "")
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
            if fingerprint(key) not in set(_past(db)) | _recorded_fingerprints(root):
                raise CourseError(_foreign(root, fingerprint(key), stored))
            if record and db:  # a key the course had before, put back: taken back
                _retire(db, stored)
                keep(fingerprint(key), replace=True)
                write_state(db, MADE_NEW, "", replace=True)
                _keep(root, key)
                course.log(f"{root / KEY_FILE} is the key this course had before (fingerprint "
                           f"{fingerprint(key)}): taken back, every student's numbers are "
                           f"drawn with it again; hand-ins worked on the numbers of {stored}"
                           + (f" (kept as {KEY_FILE}.{stored})" if stored in key_ring(root)
                              else "") + " are graded on them")
        elif record:
            _keep(root, key)
        return key
    if key is not None:  # made before the gradebook, or by an older version: adopted
        seen = _recorded_fingerprints(root) if db else set()
        if seen and fingerprint(key) not in seen:  # but not the key its notebooks were drawn with
            raise CourseError(_foreign(root, fingerprint(key), ", ".join(sorted(seen))))
        kept = keep(fingerprint(key))
        if kept != fingerprint(key):
            raise CourseError(_foreign(root, fingerprint(key), kept))
        if record:
            _keep(root, key)
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
    _keep(root, key)
    return key


def _refuse_another_new_key(root: Path, db: str | None, key: bytes, stored: str | None,
                            new: int) -> None:
    """A second ``--new-key`` in a row makes no third key unless given twice: the key the first
    made, while no hand-in records it, is kept (students may have taken its codes)."""
    mark = fingerprint(key)
    if new > 1 or not db or stored != mark or read_state(db, MADE_NEW) != mark \
            or mark in _recorded_fingerprints(root):
        return
    before = [m for m in _past(db) if m in key_ring(root)]
    raise CourseError(
        f"the course's key ({mark}) is the one release --new-key made, and no hand-in records "
        "it yet: release without --new-key to keep it (the codes given out stay right). To "
        "replace it too (given out by mistake, or leaked), give --new-key twice"
        + (f"; to go back to the key before it:  python -m grader release --restore-key "
           f"{root / KEY_FILE}.{before[-1]}" if before else ""))


def restore_key(course, source: Path) -> bytes:
    """Put back a key the course had before (``release --restore-key FILE``): ``source`` is
    taken as the course's key when its fingerprint is one the gradebook had, or one its graded
    or handed-in notebooks record; the key it replaces is kept."""
    try:
        info = source.lstat()
        data = source.read_bytes() if info.st_size == KEY_BYTES else b""
    except OSError as error:
        raise CourseError(f"{source} cannot be read ({error.strerror}): give the key file to "
                          "restore (a backup's variants.key, or one the course keeps as "
                          f"{KEY_FILE}.FINGERPRINT)") from None
    if len(data) != KEY_BYTES:
        raise CourseError(f"{source} is not a course's key (a file of {KEY_BYTES} bytes)")
    root = course.root
    db = course.db_url if course.has_gradebook() else None
    stored = read_state(db, FINGERPRINT) if db else None
    mark = fingerprint(data)
    known = set(_past(db)) | _recorded_fingerprints(root) | ({stored} if stored else set())
    if mark not in known:
        raise CourseError(
            f"{source} (fingerprint {mark}) was never this course's key: its gradebook has had "
            + (", ".join(sorted(known - {KEYLESS})) or "none") + ", and none of its notebooks "
            "records it; give the course's own key")
    current = course_key(root)
    if current is not None:
        _keep(root, current)
    write_key(root / KEY_FILE, data, replace=True)
    _keep(root, data)
    return checked_key(course)


def _foreign(root: Path, mark: str, stored: str) -> str:
    return (f"{root / KEY_FILE} (fingerprint {mark}) is not the key this course's gradebook "
            f"was graded with (fingerprint {stored}): restore the course's own variants.key; "
            "a coordinator that shares this database must use that key, not one of its own "
            "(docs/many-machines.md)")
