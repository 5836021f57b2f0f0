"""nbgrader preprocessors the course adds to the autograde pipeline."""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from traitlets import Bool


class StderrToStdout(Preprocessor):
    """Turn stderr stream output into stdout before nbgrader scores the test cells.

    nbgrader gives a test cell 0 points when it printed anything to stderr, so correct code
    that emits a warning (a DeprecationWarning from a library, a ``print(..., file=sys.stderr)``)
    would lose its points. Errors are ``error`` outputs, not stderr, and still score 0.
    """

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                output["name"] = "stdout"
        return cell, resources
