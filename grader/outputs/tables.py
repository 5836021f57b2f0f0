"""Where an export's tables go: each written whole (grader/common/files.py), or, for a dry run,
compared with the file at the same path (the one written last time) and nothing written.

``export --dry-run`` shows, file by file, what each student's grade in it would become: the
rows whose grade changes, the new ones, and those the file held that would no longer be
written, so that an instructor sees a change before the LMS does."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from grader.common.files import written
from grader.common.text import inert

SHOWN = 50  # the rows a dry run lists of each file (the counts cover them all)


class Tables:
    """Write (or, with ``dry_run``, compare) an export's CSV files."""

    def __init__(self, log: Callable[[str], None], dry_run: bool = False):
        self.log, self.dry_run = log, dry_run

    def write(self, path: Path, lines: list[list], key: Sequence[str], value: Sequence[str],
              name: str = "", quoting: int = csv.QUOTE_MINIMAL) -> None:
        """``lines`` (a header, then rows) to ``path``. ``key``: the header names of the
        columns that identify a row (a student), ``value``: those of the grade, ``name``: of a
        person's name, for a dry run's lines."""
        if self.dry_run:
            self.log("\n".join(compare(path, lines, key, value, name)))
            return
        with written(path, newline="") as handle:
            csv.writer(handle, quoting=quoting).writerows(lines)

    def side_file(self, path: Path, lines: list[list], quoting: int) -> None:
        """A file beside the export (the list of what was left out): written, or nothing."""
        if not self.dry_run:
            with written(path, newline="") as handle:
                csv.writer(handle, quoting=quoting).writerows(lines)


def _rows(lines: list[list], key: Sequence[str], value: Sequence[str],
          name: str) -> dict[tuple, tuple[str, str]]:
    """key -> (the grade's text, the name) of each row of ``lines``."""
    if not lines:
        return {}
    header = [str(cell) for cell in lines[0]]

    def cells(row: list, names: Sequence[str]) -> list[str]:
        return [str(row[header.index(n)]) if n in header and header.index(n) < len(row)
                else "" for n in names]

    found = {}
    for row in lines[1:]:
        found[tuple(cells(row, key))] = (" ".join(cells(row, value)).strip(),
                                         (cells(row, [name]) if name else [""])[0])
    return found


def compare(path: Path, lines: list[list], key: Sequence[str], value: Sequence[str],
            name: str) -> list[str]:
    """What writing ``lines`` to ``path`` would change, in lines to print."""
    new = _rows(lines, key, value, name)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            old_lines = list(csv.reader(handle))
        when = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OSError, UnicodeDecodeError, csv.Error):
        return [f"dry run: {path} does not exist yet: {len(new)} row(s) would be new"]
    old = _rows([[c for c in old_lines[0]], *old_lines[1:]] if old_lines else [], key, value,
                name)
    changed = [k for k in new if k in old and new[k][0] != old[k][0]]
    added = [k for k in new if k not in old]
    gone = [k for k in old if k not in new]

    def who(k: tuple, row: tuple[str, str]) -> str:
        ids = " ".join(part for part in k if part) or "(no identifier)"
        return inert(ids, 120) + (f" ({inert(row[1], 80)})" if row[1] else "")

    lines_out = [f"dry run: {path}, against the file written {when}: {len(changed)} "
                 f"changed, {len(added)} new, {len(gone)} no longer written, "
                 f"{len(new) - len(changed) - len(added)} the same (nothing was written)"]
    listed = ([f"  {who(k, new[k])}: {inert(old[k][0], 60) or 'blank'} -> "
               f"{inert(new[k][0], 60) or 'blank'}" for k in changed]
              + [f"  {who(k, new[k])}: new: {inert(new[k][0], 60)}" for k in added]
              + [f"  {who(k, old[k])}: {inert(old[k][0], 60)} -> not written now (the LMS "
                 "keeps what it has)" for k in gone])
    return lines_out + listed[:SHOWN] + ([f"  and {len(listed) - SHOWN} more"]
                                         if len(listed) > SHOWN else [])
