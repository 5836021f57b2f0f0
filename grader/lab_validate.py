"""The student's Validate button: nbgrader's validator, and an answer a student can act on.

nbgrader's Validate runs the notebook and lists every failed test cell with its source and its
whole traceback. This server extension answers the same request (``/assignments/validate``,
so nbgrader's own button calls it) with nbgrader's ``Validator`` doing the run, and reports
per exercise: one line for what failed, then a summary of every exercise, passed or not, with
the points at stake, and a reminder that hidden checks run at grading. The lab starts it in
place of nbgrader's validate extension (grader/lab.py).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from nbformat import NotebookNode

HIDDEN_NOTE = ("Hidden checks also run when your work is graded: they try more inputs, bad "
               "input included. Passing the visible checks is needed, not enough.")


def _error_line(cell: NotebookNode) -> str | None:
    """The one line that says why a test cell failed (None when it passed)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            name, value = output.get("ename", ""), output.get("evalue", "")
            if "not implemented yet" in value or name == "NotImplementedError":
                return "not done yet"
            return f"{value}" if name in ("AssertionError", "CheckFailed") else f"{name}: {value}"
    return None


def summarize(nb: NotebookNode) -> tuple[list[dict[str, str]], str]:
    """The failed exercises (as nbgrader's answer lists failed cells) and the summary text."""
    failed, rows = [], []
    total = passed_points = 0.0
    passed = 0
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not (meta.get("grade") and str(meta.get("grade_id", "")).startswith("test-")):
            continue
        name, points = meta["grade_id"].removeprefix("test-"), float(meta.get("points", 0))
        total += points
        error = _error_line(cell)
        if error is None:
            passed += 1
            passed_points += points
            rows.append(f"  passes   {name} ({points:g} point{'s' * (points != 1)})")
        else:
            short = error if len(error) <= 300 else error[:297] + "..."
            rows.append(f"  {'to do ' if error == 'not done yet' else 'fails '}   {name} "
                        f"({points:g} point{'s' * (points != 1)}): {short}")
            failed.append({"source": f"{name} ({points:g} point{'s' * (points != 1)})",
                           "error": html.escape(short), "raw_error": short})
    summary = "\n".join([
        f"{passed} of {len(rows)} exercises pass their visible checks "
        f"({passed_points:g} of {total:g} points).", "", *rows, "", HIDDEN_NOTE])
    return failed, summary


def validate(path: Path, config) -> dict:
    """Run nbgrader's validator on ``path`` and answer as nbgrader's Validate does, with the
    failed exercises one line each and a summary last."""
    from nbgrader.validator import Validator

    class Keeping(Validator):
        executed: NotebookNode | None = None

        def _preprocess(self, nb: NotebookNode) -> NotebookNode:
            self.executed = super()._preprocess(nb)
            return self.executed

    validator = Keeping(config=config)
    result = validator.validate(str(path))
    if "type_changed" in result or "changed" in result or validator.executed is None:
        return result  # nbgrader's own warnings about edited cells, as they are
    failed, summary = summarize(validator.executed)
    entry = {"source": "Summary", "error": html.escape(summary), "raw_error": summary}
    if failed:
        return {"failed": [*failed, entry]}
    return {"passed": [{"source": summary}]}


def _load_jupyter_server_extension(server_app) -> None:
    from jupyter_server.base.handlers import JupyterHandler
    from jupyter_server.utils import url_path_join
    from tornado import web

    class ValidateHandler(JupyterHandler):
        @web.authenticated
        def post(self) -> None:
            from jupyter_core.paths import jupyter_config_path
            from nbgrader.apps import NbGrader

            try:
                path = self.get_argument("path")
            except web.MissingArgumentError:
                path = self.get_json_body()["path"]
            root = Path(server_app.root_dir).resolve()
            target = (root / path).resolve()
            if not target.is_relative_to(root):
                raise web.HTTPError(403, "that notebook is outside the course's folder")
            app = NbGrader()  # configured as nbgrader's own handler is: ./ and Jupyter's paths
            app.config_file_paths.append([os.getcwd(), *jupyter_config_path()])
            app.load_config_file()
            try:
                answer = {"success": True, "value": validate(target, app.config)}
            except Exception as error:  # say what went wrong, not a server traceback
                answer = {"success": False, "value": f"Validate could not run the notebook: "
                                                     f"{type(error).__name__}: {error}"}
            self.finish(json.dumps(answer))

    from nbgrader.server_extensions.validate_assignment.handlers import (
        NbGraderVersionHandler,
    )

    base = server_app.web_app.settings["base_url"]
    server_app.web_app.add_handlers(".*$", [
        (url_path_join(base, "/assignments/validate"), ValidateHandler),
        (url_path_join(base, "/nbgrader_version"), NbGraderVersionHandler)])


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "grader.lab_validate"}]
