"""Text from students, made neutral for wherever it goes: a terminal, a CSV that a spreadsheet
opens, HTML, nbgrader's gradebook. Ids, names, file names and whatever a notebook printed are
the student's: nothing of them may move a cursor, start a formula or become markup."""

from __future__ import annotations

import os
import re
import unicodedata

STUDENT_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+-")
# A cell's nbgrader grade_id as the lessons write them. nbgrader's templates print it into HTML
# ids and text unescaped (formgrader's grading page, the feedback page): one a student wrote
# that is not of this shape is dropped with the rest of the cell's nbgrader metadata.
GRADE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")


def trusted_nbgrader_metadata(meta: object) -> bool:
    """Whether a cell's nbgrader metadata can be read and shown: a dict whose grade_id, if it
    has one (not empty), is of ``GRADE_ID``'s shape and whose points, if any, are a number."""
    if not isinstance(meta, dict):
        return False
    grade_id = meta.get("grade_id")
    return ((grade_id in (None, "") or (isinstance(grade_id, str)
                                        and GRADE_ID.fullmatch(grade_id) is not None))
            and type(meta.get("points", 0)) in (int, float))


def inert(text: object, limit: int = 500) -> str:
    """``text`` safe to print on a terminal or write to a report: control and format characters
    (escape codes, bidirectional overrides, lone surrogates) written as escapes, at most
    ``limit`` characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="backslashreplace")
    text = str(text)
    out = []
    for char in text[: limit * 2]:
        category = unicodedata.category(char)
        if category in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") and char not in "\n\t":
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
        else:
            out.append(char)
    text = "".join(out).replace("\n", " ").replace("\t", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def display_name(name: str) -> str:
    """A file name as a person should see it: its bytes decoded as UTF-8, whatever is not valid
    UTF-8 written as \\xNN escapes, control characters escaped."""
    raw = os.fsencode(name)
    return inert(raw.decode("utf-8", errors="backslashreplace"), limit=120)


def valid_student_id(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not set(name) - STUDENT_ID_CHARS \
        and len(name) <= 100


def text_safe(value: object) -> object:
    """``value`` (a notebook's JSON) with every lone surrogate in its strings replaced by its
    escape, so that it can be written as UTF-8: a kernel may send them."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", errors="backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return type(value)((text_safe(k), text_safe(v)) for k, v in value.items())
    if isinstance(value, list):
        return [text_safe(v) for v in value]
    return value


# What nbconvert's templates (the feedback page's, formgrader's) write into an <img> tag from
# an output's metadata, at the top or under the image's MIME type: width and height unquoted,
# filenames as its src. A kernel's display() sets any of them to anything.
IMAGE_KEYS = ("width", "height", "unconfined", "alt", "filenames")


def displayable(metadata: object) -> dict:
    """An output's ``metadata`` with what a page's <img> tag takes from it made safe: width and
    height kept only as whole numbers of pixels, unconfined only as a bool, alt only as text
    (the templates quote and escape it), filenames dropped (a graded notebook's images are in
    it); the rest as it is."""
    if not isinstance(metadata, dict):
        return {}
    safe = {key: value for key, value in metadata.items() if key not in IMAGE_KEYS}
    safe.update(_image_keys(metadata))
    for mime, scoped in metadata.items():
        if isinstance(mime, str) and mime.startswith("image/") and isinstance(scoped, dict):
            safe[mime] = {**{k: v for k, v in scoped.items() if k not in IMAGE_KEYS},
                          **_image_keys(scoped)}
    return safe


def shown_safely(nb: dict) -> dict:
    """``nb`` (a notebook's JSON) with every output's metadata ``displayable``: a copy, ``nb``
    itself unchanged."""
    cells = []
    for cell in nb.get("cells", []):
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        if isinstance(outputs, list):
            cell = {**cell, "outputs": [
                {**output, "metadata": displayable(output["metadata"])}
                if isinstance(output, dict) and "metadata" in output else output
                for output in outputs]}
        cells.append(cell)
    return {**nb, "cells": cells}


def _image_keys(scope: dict) -> dict:
    kept: dict = {}
    for key in ("width", "height"):
        value = scope.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and 0 < value <= 100_000:  # NaN and infinities fail the comparison
            kept[key] = int(value)
    if isinstance(scope.get("unconfined"), bool):
        kept["unconfined"] = scope["unconfined"]
    if isinstance(scope.get("alt"), str):
        kept["alt"] = scope["alt"]
    return kept


def gradebook_text(value: object) -> str:
    """A name or e-mail as nbgrader's gradebook keeps it: neutral wherever nbgrader shows it.
    nbgrader 0.9.6's ``export`` joins fields with commas, unquoted, so a comma or semicolon (a
    separator in some locales) or a double quote would move the columns, and a field that
    begins with = + - @ is a formula; formgrader's grading page prints first and last name
    into its HTML unescaped. So: control characters escaped (``inert``), at most 120
    characters, no , ; " < > & (written in their fullwidth forms), and a leading ' before a
    formula's first character, as export.py writes names."""
    text = inert(value, 120).translate(GRADEBOOK_LOOKALIKES)
    text = " ".join(text.split())
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


# The fullwidth forms of the characters nbgrader's export and formgrader would read as syntax.
GRADEBOOK_LOOKALIKES = str.maketrans({",": "\uff0c", ";": "\uff1b", '"': "\uff02",
                                       "<": "\uff1c", ">": "\uff1e", "&": "\uff06"})


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ------------------------------------------------------------------ CSV cells
# A spreadsheet (Excel, LibreOffice, Google Sheets) reads a cell that begins with ``=``, ``+``,
# ``-`` or ``@`` as a formula, and a tab or carriage return before one as the same (OWASP, "CSV
# Injection"). Every cell a student can put text into (a name, an id, a reason quoting a file
# name, an exercise id read from their notebook) goes through ``display`` or ``student_cell``:
# control characters escaped (``inert``), and a leading ``'``, which spreadsheets show as text,
# where the text would otherwise start a formula. Identifiers an LMS must match exactly are
# never quoted: the LMS exports refuse them instead (``unsafe_identifier``).

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def display(value: object, limit: int = 1000) -> str:
    """A display field (a name, a reason, a note) that no spreadsheet runs as a formula."""
    text = str(value)
    quoted = text.startswith(FORMULA_START)
    text = inert(text, limit=limit)
    return "'" + text if quoted or text.startswith(FORMULA_START) else text


def student_cell(student_id: object) -> str:
    """A student id as our own files write it: as it is where no spreadsheet could read it as
    a formula, else quoted like a name (a gradebook id may begin with ``+``, ``-`` or ``@``; a
    folder's name refused as an id may hold anything)."""
    text = str(student_id)
    if valid_student_id(text) and not text.startswith(FORMULA_START):
        return text
    return display(text)


def exercise_width(names, least: int = 26) -> int:
    """The width of a table's exercise column: its longest name's (lesson 08's
    predicted_cache_bytes_after_generation is 38 characters), at least ``least``."""
    return max([least, *(len(str(name)) for name in names)])
