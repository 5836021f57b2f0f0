"""Student-controlled text as it may go into a CSV cell: no spreadsheet runs it as a formula.

A spreadsheet (Excel, LibreOffice, Google Sheets) reads a cell that begins with ``=``, ``+``,
``-`` or ``@`` as a formula, and a tab or carriage return before one as the same (OWASP, "CSV
Injection"). Every cell a student can put text into (a name, an id, a reason quoting a file
name, an exercise id read from their notebook) goes through ``display`` or ``student_cell``:
control characters escaped (``inert``), and a leading ``'``, which spreadsheets show as text,
where the text would otherwise start a formula. Identifiers an LMS must match exactly are never
quoted: the LMS exports refuse them instead (grader/export.py, ``unsafe_identifier``).
"""

from __future__ import annotations

from grader.intake import inert, valid_student_id

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
