"""nbgrader preprocessors the course adds to nbgrader's feedback pipeline."""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from traitlets import Bool

from grader.lessons import BEGIN_HIDDEN, END_HIDDEN


class RedactHiddenTests(Preprocessor):
    """Keep hidden checks out of the feedback a student sees.

    The autograded notebook holds each test cell's hidden region (restored by nbgrader from the
    gradebook). In feedback the region becomes one comment line, and an error raised by a
    hidden check is replaced by a line that says only that a hidden check failed.
    """

    enabled = Bool(True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int):
        if cell.cell_type != "code" or BEGIN_HIDDEN not in cell.source:
            return cell, resources
        before, rest = cell.source.split(BEGIN_HIDDEN, 1)
        hidden, after = rest.split(END_HIDDEN, 1) if END_HIDDEN in rest else (rest, "")
        secrets = [line.strip() for line in hidden.splitlines() if line.strip()]
        cell.source = before + "# (hidden checks, not shown)" + after
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            shown = " ".join([output.get("evalue", ""), *output.get("traceback", [])])
            if any(_quoted_expression(line) in shown for line in secrets):
                output["ename"], output["evalue"] = "AssertionError", "a hidden check failed"
                output["traceback"] = ["AssertionError: a hidden check failed"]
        return cell, resources


def _quoted_expression(line: str) -> str:
    """The expression of a ``check('expr', expected)`` line, or the whole line."""
    if line.startswith("check(") and len(line) > 8:
        quote = line[6]
        end = line.find(quote + ",", 7)
        if end > 7:
            return line[7:end]
    return line
