"""The student's Validate button: nbgrader's validator, and an answer a student can act on.

nbgrader's Validate runs the notebook and lists every failed test cell with its source and its
whole traceback; when everything passes, the dialog of nbgrader 0.9.6's lab extension throws
(its ``passed`` branch loops over a list it never received) and the student reads "Validation
failed". So the course answers Validate itself, in two parts:

- this server extension runs the notebook with nbgrader's ``Validator`` and reads each
  exercise's test cell: passes, fails (one line saying why), to do, or, for a graded
  prediction, in (a number is there; grading compares it with the answer for the student's own
  numbers, which the lab never holds, so its point is counted apart, never as passing). It
  also reads the notebook as saved: a record of other numbers than the student's (worked
  without an id, or for another) is said first (grader/lab/numbers.py). It answers at
  ``/counting-the-cost/validate`` in the course's own form (``summary``), and at nbgrader's
  ``/assignments/validate`` in nbgrader's, shaped for the branches of nbgrader's dialog that
  work, for a front end without the course's button;
- ``grader/lab/labextension/`` is a small JupyterLab plugin: the Validate button of the course,
  which saves the notebook, asks the first address and shows the summary first, then each
  exercise still to do one line each, then the note about hidden checks. The lab and the hub
  turn nbgrader's own Validate button off and this one on (grader/lab/server.py, deploy/hub/).

Counts never promise more than grading gives: an exercise counts as passing only when its
visible checks pass and nothing marks it as earning no point, and a graded prediction's point,
which only grading can judge, is never in a total.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from grader.grading.sandbox import NO_FIGURE_FORMATS
from grader.lab.numbers import saved_numbers_problem

HIDDEN_NOTE = ("Hidden checks also run when your work is graded: they try more inputs of your "
               "own. Passing the visible checks is needed, not enough.")
IN_NOTE = "your number is in: it is graded when you hand in"
# A graded prediction's test cell: its check holds no answer (grader/content/notebook_checks.py).
GRADED_PREDICTION = re.compile(r"check_prediction\([^)]*graded\s*=\s*True")
# The output metadata key that grader/content/notebook_checks.py marks verdicts with.
MARK = "counting_the_cost"
LONGEST_MESSAGE = 300


@dataclass(frozen=True)
class Exercise:
    """One graded exercise as its visible checks left it."""

    name: str
    points: float
    status: str  # "passes", "fails", "to do", or "in" (a graded prediction with a number in)
    message: str = ""
    prediction: bool = False  # a graded prediction: only grading knows its answer

    @property
    def counts(self) -> bool:
        """Whether its points are sure, as far as the visible checks can tell."""
        return self.status == "passes" and not self.prediction

    @property
    def done(self) -> bool:
        """Passes, or (a graded prediction) is in: nothing left to do before the hand-in."""
        return self.status in ("passes", "in")

    def line(self) -> str:
        """``fails   decode (2 points): ...``: one line for a terminal or the dialog."""
        points = f"{self.points:g} point{'s' * (self.points != 1)}"
        return f"  {self.status:<8} {self.name} ({points})" + (
            f": {self.message}" if self.message else "")


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= LONGEST_MESSAGE else text[:LONGEST_MESSAGE - 3] + "..."


def _verdict(cell: NotebookNode) -> Exercise | None:
    """What a test cell's outputs say, as (status, message); None for a test cell that is not
    an exercise's."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if not (meta.get("grade") and str(meta.get("grade_id", "")).startswith("test-")):
        return None
    name, points = meta["grade_id"].removeprefix("test-"), float(meta.get("points", 0) or 0)
    prediction = GRADED_PREDICTION.search(str(cell.get("source", ""))) is not None
    outputs = cell.get("outputs", [])
    for output in outputs:
        if output.get("output_type") == "error":
            ename, evalue = output.get("ename", ""), output.get("evalue", "")
            if ename == "NotImplementedError" or "not implemented yet" in evalue \
                    or ": not done yet" in evalue:
                return Exercise(name, points, "to do", prediction=prediction)
            if ename == "CellTimeoutError":
                return Exercise(name, points, "fails", "ran too long: stopped after the time "
                                "limit (is there a loop that never ends?)", prediction)
            shown = evalue if ename in ("AssertionError", "CheckFailed") else f"{ename}: {evalue}"
            return Exercise(name, points, "fails", _one_line(shown) or ename, prediction)
    for output in outputs:
        verdict = output.get("metadata", {}).get(MARK, {})
        if isinstance(verdict, dict) and verdict.get("verdict") == "in" and prediction:
            return Exercise(name, points, "in", IN_NOTE, prediction)
    if not outputs and cell.get("execution_count") is None:  # the run never reached it
        return Exercise(name, points, "fails", "not run: the notebook stopped before this cell",
                        prediction)
    if prediction:  # ran, said nothing: not a number grading can read
        return Exercise(name, points, "fails", "no number came in", prediction)
    return Exercise(name, points, "passes")


def exercises(nb: NotebookNode) -> list[Exercise]:
    """Every exercise of an executed notebook, in the notebook's order."""
    return [e for e in map(_verdict, nb.cells) if e is not None]


def _points(points: float) -> str:
    return f"{points:g} point{'s' * (points != 1)}"


def headline(found: list[Exercise]) -> str:
    """The summary's first line: passing exercises and their points, never more than grading
    can give; a graded prediction apart, its point in no total (only grading knows its
    answer)."""
    checked = [e for e in found if not e.prediction]
    predictions = [e for e in found if e.prediction]
    passing = [e for e in checked if e.counts]
    points, total = sum(e.points for e in passing), sum(e.points for e in checked)
    if checked and len(passing) == len(checked):
        line = (f"All {len(checked)} exercises pass their visible checks ({points:g} of "
                f"{total:g} points).")
    else:
        line = (f"{len(passing)} of {len(checked)} exercises pass their visible checks "
                f"({points:g} of {total:g} points).")
    for e in predictions:
        said = ("is in: it is graded when you hand in" if e.status == "in" else
                "is still to do" if e.status == "to do" else "fails its check")
        line += f" Your graded prediction, {e.name}, {said} ({_points(e.points)})."
    if found and all(e.done for e in found):
        line += " Hand in the notebook as your course asks."
    return line


def summarize(nb: NotebookNode) -> tuple[list[dict[str, str]], str]:
    """The exercises that do not pass (as nbgrader's answer lists failed cells) and the summary
    as text: the headline, each exercise on a line, the note on hidden checks."""
    found = exercises(nb)
    failed = [{"source": f"{e.name} ({_points(e.points)})",
               "error": html.escape(e.message or e.status), "raw_error": e.message or e.status}
              for e in found if not e.done]
    summary = "\n".join([headline(found), "", *(e.line() for e in found), "", HIDDEN_NOTE])
    return failed, summary


def _changed(result: dict) -> list[str]:
    """The first line of each locked cell nbgrader found changed (grading uses the course's)."""
    cells = result.get("type_changed", []) + result.get("changed", [])
    return [_one_line((c.get("source", "").strip().splitlines() or ["(empty)"])[0])
            for c in cells]


def run_validator(path: Path, config) -> tuple[dict, NotebookNode | None]:
    """nbgrader's ``Validator`` on ``path``: its answer, and the notebook as it ran (None where
    nbgrader stopped before running it: a cell's type changed)."""
    from nbgrader.validator import Validator

    class Keeping(Validator):
        executed: NotebookNode | None = None

        def _preprocess(self, nb: NotebookNode) -> NotebookNode:
            self.executed = super()._preprocess(nb)
            return self.executed

    validator = Keeping(config=config)
    result = validator.validate(str(path))
    return result, validator.executed


def whose_numbers(nb: NotebookNode) -> str:
    """Whose numbers the notebook's graded prediction asked about, as its variant cell said
    when it ran ("" for a lesson whose numbers do not vary)."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            mark = output.get("metadata", {}).get(MARK)
            shown = mark.get("variant") if isinstance(mark, dict) else None
            if isinstance(shown, dict):
                student = shown.get("student")
                return (f"Your graded prediction asks about the numbers drawn for {student}."
                        if isinstance(student, str) else
                        "Your graded prediction asks about the course's default numbers: no "
                        "student id is set.")
    return ""


def saved_problem(path: Path) -> str:
    """What grader/lab/numbers.py says of the notebook as saved, against this process's
    ``CTC_VARIANTS`` (the lab's): "" when its numbers are the student's own."""
    try:
        saved = nbformat.read(path, as_version=4)
    except Exception:  # nbgrader's run says what is wrong with the file
        return ""
    return saved_numbers_problem(saved, os.environ.get("CTC_VARIANTS"))


def course_answer(path: Path, config) -> dict:
    """The course's answer: ``headline``, ``exercises`` (name, points, status, message,
    prediction), ``changed`` (locked cells edited), ``numbers`` (whose numbers the graded
    prediction asked about), ``saved_numbers`` (the saved notebook's numbers are not the
    student's: what to re-run) and ``note``."""
    problem_with_numbers = saved_problem(path)  # before the run: what the student saved
    result, executed = run_validator(path, config)
    found = exercises(executed) if executed is not None else []
    numbers = whose_numbers(executed) if executed is not None else ""
    return {"headline": headline(found) if executed is not None else
            "Validate did not run the notebook: a cell's type was changed.",
            "exercises": [asdict(e) for e in found], "changed": _changed(result),
            "numbers": numbers, "saved_numbers": problem_with_numbers,
            "note": " ".join(filter(None, [HIDDEN_NOTE, numbers]))}


def nbgrader_answer(answer: dict) -> dict:
    """The course's answer in nbgrader's form, for nbgrader's own dialog. Only its ``failed``
    branch and its plain success branch work in nbgrader 0.9.6 (``passed`` throws), so the
    summary rides as a ``failed`` entry whenever something does not pass."""
    rows = [Exercise(**e) for e in answer["exercises"]]
    summary = "\n".join([answer["headline"], "", *(e.line() for e in rows), "",
                         answer["note"]])
    if answer["changed"]:
        summary = ("These locked cells were changed (grading uses the course's version): "
                   + "; ".join(answer["changed"]) + "\n\n" + summary)
    if answer.get("saved_numbers"):
        summary = answer["saved_numbers"] + "\n\n" + summary
    if all(e.done for e in rows) and rows and not answer["changed"] \
            and not answer.get("saved_numbers"):
        return {}  # nbgrader shows "Success! Your notebook passes all the tests."
    return {"failed": [{"source": "Summary", "error": html.escape(summary),
                        "raw_error": summary}]}


def problem(error: BaseException) -> str:
    """What went wrong when the notebook could not be run, for the student."""
    name = type(error).__name__
    if name == "DeadKernelError":
        return ("Validate could not finish: the notebook's kernel stopped while running it "
                "(out of memory, or a cell that ends the process). Restart the kernel and run "
                "the cells from the top to find which one.")
    if name in ("CellTimeoutError", "TimeoutError", "RuntimeError") and "kernel" in str(
            error).lower():
        return ("Validate could not start a kernel for the notebook in time; the machine may "
                "be busy. Try again in a minute.")
    return f"Validate could not run the notebook: {name}: {_one_line(str(error))}"


# A lesson imports torch, which can keep a loaded laptop's kernel busy a while: wait for it
# rather than fail with a timeout (nbgrader's defaults are 30 s a cell and an error on a slow
# IOPub). Files on nbgrader's configuration path may set other values.
# Validate reads checks, not plots: its kernel makes the lesson's figures without drawing
# them (grader/grading/sandbox.py's NO_FIGURE_FORMATS, as grading does), a second or two less.
COURSE_DEFAULTS = {"timeout": 120, "iopub_timeout": 30, "raise_on_iopub_timeout": False,
                   "startup_timeout": 120, "extra_arguments": [NO_FIGURE_FORMATS]}


def nbgrader_config():
    """nbgrader's configuration as its own Validate handler loads it (./ and Jupyter's
    paths), over the course's defaults."""
    from jupyter_core.paths import jupyter_config_path
    from nbgrader.apps import NbGrader
    from traitlets.config import Config

    app = NbGrader()
    app.config_file_paths.append([os.getcwd(), *jupyter_config_path()])
    app.load_config_file()
    config = Config({"Execute": dict(COURSE_DEFAULTS)})
    config.merge(app.config)
    return config


def answer_for(path: Path) -> dict:
    """The reply to the course's button: ``success`` and ``value`` (the course's answer, or
    what went wrong)."""
    try:
        return {"success": True, "value": course_answer(path, nbgrader_config())}
    except Exception as error:  # say what went wrong, not a traceback
        return {"success": False, "value": problem(error)}


def main(argv: list[str] | None = None) -> None:
    """``python -m grader.lab.validate NOTEBOOK``: the reply, as JSON on stdout. The server
    runs each Validate in a process of its own, so that the run's working folder and
    environment (nbgrader's Validator changes both) stay out of the server, a dying kernel or
    a stuck run cannot take the server down, and the lab stays responsive meanwhile."""
    import sys

    (path,) = sys.argv[1:] if argv is None else argv
    reply = answer_for(Path(path))
    sys.stdout.write("\n" + REPLY_MARK + json.dumps(reply) + "\n")


REPLY_MARK = "counting-the-cost validate reply: "
LONGEST_RUN_SECONDS = 15 * 60  # every cell has nbgrader's own limit; this bounds the whole run


async def validate_in_a_process(path: Path) -> dict:
    """Run ``main`` on ``path`` in a child process; its reply (or what went wrong)."""
    import asyncio
    import sys

    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grader.lab.validate", str(path), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(child.communicate(), LONGEST_RUN_SECONDS)
    except TimeoutError:
        child.kill()
        await child.wait()
        return {"success": False, "value": "Validate stopped: the notebook ran for more than "
                f"{LONGEST_RUN_SECONDS // 60} minutes. Run its cells from the top to see "
                "which one does not finish."}
    for line in reversed(out.decode(errors="replace").splitlines()):
        if line.startswith(REPLY_MARK):
            return json.loads(line.removeprefix(REPLY_MARK))
    last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
    return {"success": False, "value": f"Validate could not run the notebook ({_one_line(last)})"}


def _load_jupyter_server_extension(server_app) -> None:
    from jupyter_server.base.handlers import JupyterHandler
    from jupyter_server.utils import url_path_join
    from tornado import web

    def notebook_path(handler) -> Path:
        try:
            path = handler.get_argument("path")
        except web.MissingArgumentError:
            path = (handler.get_json_body() or {}).get("path", "")
        root = Path(server_app.root_dir).resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root):
            raise web.HTTPError(403, "that notebook is outside the course's folder")
        if target.suffix != ".ipynb" or not target.is_file():
            raise web.HTTPError(404, f"no notebook at {path!r}")
        return target

    class CourseValidate(JupyterHandler):
        @web.authenticated
        async def post(self) -> None:
            self.finish(json.dumps(await validate_in_a_process(notebook_path(self))))

    class NbgraderValidate(JupyterHandler):
        """nbgrader's address and reply form, for nbgrader's own button."""

        @web.authenticated
        async def post(self) -> None:
            reply = await validate_in_a_process(notebook_path(self))
            if reply["success"]:
                reply["value"] = json.dumps(nbgrader_answer(reply["value"]))
            self.finish(json.dumps(reply))

    from nbgrader.server_extensions.validate_assignment.handlers import (
        NbGraderVersionHandler,
    )

    base = server_app.web_app.settings["base_url"]
    server_app.web_app.add_handlers(".*$", [
        (url_path_join(base, "/counting-the-cost/validate"), CourseValidate),
        (url_path_join(base, "/assignments/validate"), NbgraderValidate),
        (url_path_join(base, "/nbgrader_version"), NbGraderVersionHandler)])


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "grader.lab.validate"}]


if __name__ == "__main__":
    main()
