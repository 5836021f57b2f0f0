"""nbgrader preprocessors the course adds to nbgrader's feedback pipeline."""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from traitlets import Bool, Unicode

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


# Output types a feedback page may show as they are: text, and images the template embeds as
# <img> (an SVG shown that way runs no script). Everything else but HTML and Markdown is dropped.
SAFE_OUTPUTS = {"text/plain", "text/latex", "image/png", "image/jpeg", "image/gif",
                "image/svg+xml", "application/json"}


class SanitizeUntrusted(Preprocessor):
    """Make a student's notebook inert for its feedback page.

    Markdown cells and HTML or Markdown outputs are rendered to HTML and cleaned by nh3 (the
    Python binding of the Ammonia sanitiser): no script, event handler or javascript: link
    survives, headings, tables and images do. The course's feedback template
    (grader/templates/ctc_feedback) shows a Markdown cell's source as the HTML it now is: it
    must not render it as Markdown a second time, which would turn text that nh3 left alone,
    such as [x](javascript:...), into a live link. JavaScript and widget outputs are dropped."""

    enabled = Bool(True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int):
        import nh3
        from nbconvert.filters import markdown2html

        if cell.cell_type in ("markdown", "raw"):
            html = markdown2html(cell.source) if cell.cell_type == "markdown" else cell.source
            cell.source = nh3.clean(html)
            cell.pop("attachments", None)
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not isinstance(data, dict):
                continue
            if "text/markdown" in data and "text/html" not in data:
                data["text/html"] = markdown2html(str(data["text/markdown"]))
            for mime in list(data):
                if mime == "text/html":
                    data[mime] = nh3.clean("".join(data[mime]) if isinstance(data[mime], list)
                                           else str(data[mime]))
                elif mime not in SAFE_OUTPUTS:
                    del data[mime]
            output.get("metadata", {}).pop("text/html", None)  # no "isolated" iframe
        return cell, resources


class ShowReview(Preprocessor):
    """Show the instructor's review decisions (grader/review.py) on the feedback page.

    Runs after nbgrader's GetGrades, which has read each exercise's score from the gradebook
    (a score set in review is there, as nbgrader's manual score). A lesson score set in review
    replaces the page's total. The decisions in force that carry a note are listed in a block
    at the top of the page, and an exercise's under its test cell. The instructor's words are
    escaped here, and the block is cleaned again by SanitizeUntrusted, which runs after this:
    a note is shown as text, never as markup."""

    enabled = Bool(True)

    def preprocess(self, nb: NotebookNode, resources: dict):
        import html

        from nbformat.v4 import new_output, new_raw_cell

        from grader.review import state_of

        meta = resources.get("nbgrader", {})
        state = state_of(meta["db_url"], meta["assignment"], meta["student"])
        if state.total is not None:
            resources["nbgrader"]["score"] = float(state.total.points or 0.0)
        for cell in nb.cells:
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            decision = state.overrides.get(grade_id.removeprefix("test-")) \
                if cell.cell_type == "code" and grade_id.startswith("test-") else None
            if decision is not None:
                cell.setdefault("outputs", []).append(new_output(
                    "stream", name="stdout", text=f"[review] {_told(decision)}\n"))
        shown = [d for d in state.in_force if d.note or d.action in ("total", "set")]
        if shown:
            items = "".join(f"<li>{html.escape(_told(d))}</li>" for d in shown)
            nb.cells.insert(0, new_raw_cell(
                f"<div><p><strong>Your instructor reviewed this grade.</strong></p>"
                f"<ul>{items}</ul></div>", metadata={"format": "text/html"}))
        return nb, resources


def _told(decision) -> str:
    """A decision as the student reads it."""
    what = {"set": f"{decision.exercise}: {decision.points:g} point(s)"
                   + (f" (the checks gave {decision.computed:g})"
                      if decision.computed is not None else ""),
            "total": f"score for the lesson: {decision.points:g}"
                     + (f" (the checks gave {decision.computed:g})"
                        if decision.computed is not None else ""),
            "accept": "the computed score stands"}.get(decision.action, "note")
    return f"{what}, by {decision.by} on {decision.when}" + (
        f": {decision.note}" if decision.note else "")


class ShowLate(Preprocessor):
    """Show the late policy's effect on the feedback page (grader/deadlines.py): when the
    notebook was handed in and how that is known, the due time, and the score before and after
    the penalty; the page's total becomes the final score. Runs after ShowReview, which has set
    the total a review decided: the penalty applies to that. Nothing is shown without a
    deadlines file, or for a lesson it gives no due date."""

    enabled = Bool(True)
    deadlines_file = Unicode("", help="the course's deadlines file").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict):
        import html
        from pathlib import Path

        from nbformat.v4 import new_raw_cell

        from grader import deadlines

        found = deadlines.load(Path(self.deadlines_file)) if self.deadlines_file else None
        meta = resources.get("nbgrader", {})
        if found is None or meta.get("assignment") not in found.due:
            return nb, resources
        known = deadlines.read_times(meta["db_url"]).get(
            (meta["assignment"], meta["student"]),
            {"submitted_at": None, "source": "none", "late_mark": False})
        late = found.judge(meta["assignment"], meta["student"], known["submitted_at"],
                           known["source"], bool(known["late_mark"]))
        raw = float(meta.get("score") or 0.0)
        final = raw * (1 - late.fraction)
        meta["score"] = final
        when = late.submitted.isoformat(timespec="minutes") if late.submitted else "unknown"
        text = (f"Due {late.due.isoformat(timespec='minutes')}"
                + (" (your extension)" if late.extended else "")
                + f"; handed in {when} ({late.source}): {late.note}. "
                + (f"Score {raw:g}, late penalty {raw - final:g}, final {final:g}."
                   if late.fraction else ""))
        nb.cells.insert(0, new_raw_cell(f"<div><p>{html.escape(text)}</p></div>",
                                        metadata={"format": "text/html"}))
        return nb, resources
