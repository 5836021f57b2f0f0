"""What the course adds to nbgrader's feedback pipeline: preprocessors that each change one
thing on the page (the exporter that writes it, and the grades it reads: exporter.py)."""

from __future__ import annotations

import html
import re
from functools import cache, lru_cache
from pathlib import Path

import nh3
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.filters.strings import strip_files_prefix
from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from traitlets import Bool, Unicode

from grader.common.text import displayable, trusted_nbgrader_metadata
from grader.content.lessons import BEGIN_HIDDEN, END_HIDDEN


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
# <img> (an SVG shown that way runs no script). Everything else but HTML and Markdown is dropped;
# LaTeX is shown as the MathML it is turned into.
SAFE_OUTPUTS = {"text/plain", "image/png", "image/jpeg", "image/gif", "image/svg+xml",
                "application/json"}

# Formulas are written into the page as MathML, which browsers draw themselves (Chromium from
# 109, Firefox, Safari): the page needs no MathJax from a CDN and shows its math offline. These
# are MathML Core's elements and presentation attributes, allowed by nh3 beside its HTML ones;
# no href, style or class (latex2mathml writes \href and \style as attributes).
MATHML_TAGS = {"math", "mi", "mn", "mo", "ms", "mspace", "mtext", "mrow", "mfrac", "msqrt",
               "mroot", "msub", "msup", "msubsup", "munder", "mover", "munderover", "mtable",
               "mtr", "mtd", "mstyle", "mpadded", "mphantom", "menclose", "semantics",
               "annotation", "merror", "mmultiscripts", "mprescripts", "none"}
MATHML_ATTRIBUTES = {"display", "mathvariant", "displaystyle", "scriptlevel", "stretchy",
                     "fence", "separator", "form", "lspace", "rspace", "minsize", "maxsize",
                     "symmetric", "largeop", "movablelimits", "accent", "accentunder", "width",
                     "height", "depth", "linethickness", "columnalign", "rowalign",
                     "columnspacing", "rowspacing", "columnlines", "rowlines", "frame",
                     "notation", "columnspan", "rowspan", "encoding"}
ALLOWED_TAGS = nh3.ALLOWED_TAGS | MATHML_TAGS
ALLOWED_ATTRIBUTES = {**nh3.ALLOWED_ATTRIBUTES,
                      **{tag: MATHML_ATTRIBUTES for tag in MATHML_TAGS}}
LONGEST_FORMULA = 5000  # characters of LaTeX converted; a longer one is shown as its source


def clean(markup: str) -> str:
    """HTML with MathML made inert: no script, event handler, style or javascript: link.

    nbconvert's templates strip a ``files/`` prefix from links after this (formgrader's does,
    with ``strip_files_prefix``): ``files/javascript:...``, a relative link to nh3, would then
    become a live one. The prefixes are stripped first, however deep, so that nh3 judges the
    links as a page will show them."""
    stripped = strip_files_prefix(markup)
    while stripped != markup:
        markup, stripped = stripped, strip_files_prefix(stripped)
    return nh3.clean(markup, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES)


def mathml(tex: str, display: str = "inline") -> str:
    """A LaTeX formula as MathML (not yet cleaned: latex2mathml copies \\text{...} as it is),
    or its source as code where it cannot be converted."""
    import latex2mathml.converter

    if len(tex) <= LONGEST_FORMULA:
        try:
            return latex2mathml.converter.convert(tex, display=display)
        except Exception:  # any LaTeX a student wrote: show it as written
            pass
    return f'<code class="tex">{html.escape(tex)}</code>'


class _MathRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer, each formula written as MathML instead of left as TeX
    for MathJax."""

    def block_math(self, body: str) -> str:
        return mathml(body, "block")

    def inline_math(self, body: str) -> str:
        return mathml(body)

    def latex_environment(self, name: str, body: str) -> str:
        return mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", "block")


def markdown_html(source: str, attachments: dict | None = None) -> str:
    """Markdown as HTML (not yet cleaned), formulas as MathML. Markdown that cannot be
    rendered (an image of an attachment the notebook lacks) is shown as its text."""
    try:
        renderer = _MathRenderer(escape=False, attachments=attachments or {})
        return MarkdownWithMath(renderer=renderer).render(source)
    except Exception:
        return f"<pre>{html.escape(source)}</pre>"


# The longest cell whose page HTML is remembered, and how many are kept: the lessons' own cells
# are under 32,000 characters (lesson 01's checks, 23,640, the longest), and a page of lesson 01
# has some 50 (a class's own cells come and go; the lesson's stay, used on every page).
REMEMBERED_CHARS = 65_536
REMEMBERED_CELLS = 256


@lru_cache(maxsize=REMEMBERED_CELLS)
def _clean_markdown(source: str) -> str:
    """A Markdown cell without attachments as its page shows it. Remembered: the lesson's own
    cells are the same on every student's page (0.1 s a page of lesson 01's formulas)."""
    return clean(markdown_html(source))


# A matplotlib figure that the grader did not draw (autograde without --plots) shows as its
# repr, which the page turns into words.
FIGURE_REPR = re.compile(r"<Figure size [0-9.e+]+x[0-9.e+]+ with \d+ Axes>")  # sizes as %g
UNDRAWN = "[a plot: not drawn when the notebook was graded; your own notebook shows it]"


class SanitizeUntrusted(Preprocessor):
    """Make a student's notebook inert for its feedback page.

    Markdown cells and HTML, Markdown or LaTeX outputs are rendered to HTML (formulas to MathML)
    and cleaned by nh3 (the Python binding of the Ammonia sanitiser): no script, event handler
    or javascript: link survives, headings, tables, images and math do. The course's feedback
    template (grader/outputs/templates/ctc_feedback) shows a Markdown cell's source as the HTML it
    now is, and so does formgrader's under the course's configuration: it must not render it as
    Markdown a second time, which would turn text that nh3 left alone, such as
    [x](javascript:...), into a live link. JavaScript and widget outputs are
    dropped, and so is a cell's nbgrader metadata of the wrong shape (its grade_id is printed
    unescaped by nbgrader's templates; autograde drops such metadata before grading)."""

    enabled = Bool(True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int):
        metadata = cell.get("metadata", {})
        if "nbgrader" in metadata and not trusted_nbgrader_metadata(metadata["nbgrader"]):
            del metadata["nbgrader"]  # in a notebook graded before autograde dropped it
        if cell.cell_type == "markdown" and not cell.get("attachments") \
                and len(cell.source) <= REMEMBERED_CHARS:
            cell.source = _clean_markdown(cell.source)
        elif cell.cell_type in ("markdown", "raw"):
            markup = markdown_html(cell.source, cell.get("attachments")) \
                if cell.cell_type == "markdown" else cell.source
            cell.source = clean(markup)
            cell.pop("attachments", None)
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not isinstance(data, dict):
                continue
            if set(data) == {"text/plain"} and FIGURE_REPR.fullmatch(_text(data["text/plain"])):
                data["text/plain"] = UNDRAWN  # graded without --plots: not drawn
            for mime in ("text/markdown", "text/latex"):  # LaTeX as Markdown: its $...$ too
                if mime in data and "text/html" not in data:
                    data["text/html"] = markdown_html(_text(data[mime]))
            for mime in list(data):
                if mime == "text/html":
                    data[mime] = clean(_text(data[mime]))
                elif mime not in SAFE_OUTPUTS:
                    del data[mime]
            if "metadata" in output:  # an <img> tag's attributes: numbers and text only
                output["metadata"] = displayable(output["metadata"])
            output.get("metadata", {}).pop("text/html", None)  # no "isolated" iframe
        return cell, resources


def as_it_is(source: str) -> str:
    """formgrader's ``markdown2html`` and ``strip_files_prefix`` filters in the course's
    configuration (``grader.outputs.exporter.inert_formgrader``): a Markdown cell's source is
    HTML already, rendered and cleaned by ``SanitizeUntrusted`` (formgrader's exporter runs it
    first); rendered as Markdown again, or its links changed, text or links the sanitiser left
    alone, such as [x](javascript:...) or files/javascript:..., would become live links."""
    return source


def _text(value: object) -> str:
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


class ShowReview(Preprocessor):
    """Show the instructor's review decisions (grader/gradebook/review.py) on the feedback page.

    Runs after GetGradesAtOnce (nbgrader's GetGrades), which has read each exercise's score
    from the gradebook (a score set in review is there, as nbgrader's manual score). A lesson
    score set in review replaces the page's total. The decisions in force that carry a note
    are listed in a block at the top of the page, and an exercise's under its test cell. The
    instructor's words are escaped here, and the block is cleaned again by SanitizeUntrusted,
    which runs after this: a note is shown as text, never as markup."""

    enabled = Bool(True)

    def preprocess(self, nb: NotebookNode, resources: dict):
        from nbformat.v4 import new_output, new_raw_cell

        from grader.gradebook.decisions import state_of

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
    """A decision as the student reads it. Only a "set" and a "total" carry points: an accept
    or a note has none (its points are None), and says so in words."""
    gave = (f" (the checks gave {decision.computed:g})" if decision.computed is not None
            else "")
    if decision.action == "set":
        what = f"{decision.exercise}: {float(decision.points or 0):g} point(s){gave}"
    elif decision.action == "total":
        what = f"score for the lesson: {float(decision.points or 0):g}{gave}"
    elif decision.action == "accept":
        what = "the computed score stands"
    else:
        what = "note"
    return f"{what}, by {decision.by} on {decision.when}" + (
        f": {decision.note}" if decision.note else "")


class ShowLate(Preprocessor):
    """Show the late policy's effect on the feedback page (grader/gradebook/deadlines.py): when the
    notebook was due and when it was handed in, both in one zone (the deadlines file's
    ``timezone``, else the due time's own), how the time is known, the policy in words, and the
    score before and after the penalty; the page's total becomes the final score. Runs after
    ShowReview, which has set the total a review decided: the penalty applies to that. Nothing
    is shown without a deadlines file, or for a lesson it gives no due date."""

    enabled = Bool(True)
    deadlines_file = Unicode("", help="the course's deadlines file").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict):
        from nbformat.v4 import new_raw_cell

        from grader.gradebook import deadlines_check
        from grader.gradebook import times as stored_times

        meta = resources.get("nbgrader", {})
        found = deadlines_check.for_gradebook(Path(self.deadlines_file), meta.get("db_url", "")) \
            if self.deadlines_file else None  # extensions by e-mail or name, as export reads
        if found is None or meta.get("assignment") not in found.due:
            return nb, resources
        known = stored_times.read_times(meta["db_url"]).get(
            (meta["assignment"], meta["student"]),
            {"submitted_at": None, "source": "none", "late_mark": False})
        late = found.judge(meta["assignment"], meta["student"], known["submitted_at"],
                           known["source"], bool(known["late_mark"]))
        if late.due is None:
            return nb, resources
        raw = float(meta.get("score") or 0.0)
        final = raw * (1 - late.fraction)
        meta["score"] = final
        zone = found.zone or late.due.tzinfo
        handed_in = (f"handed in {_local(late.submitted, zone)} ({late.source}): {late.note}"
                     if late.submitted else late.note + (
                         f" ({late.source})" if late.source not in ("", "none") else ""))
        lines = [f"Due {_local(late.due, zone)}" + (" (your extension)" if late.extended else "")
                 + f"; {handed_in}."
                 + (f" Score {raw:g}, late penalty {raw - final:g}, final {final:g}."
                    if late.fraction else ""),
                 "Late policy: " + policy_in_words(found.policies.get(meta["assignment"],
                                                                      found.policy))
                 + f". Times are in {getattr(zone, 'key', None) or late.due.tzname()}."]
        nb.cells.insert(0, new_raw_cell(
            "<div>" + "".join(f"<p>{html.escape(line)}</p>" for line in lines) + "</div>",
            metadata={"format": "text/html"}))
        return nb, resources


def _local(when, zone) -> str:
    """``2025-03-10 23:59 CET``: a time in the page's one zone."""
    shown = when.astimezone(zone)
    return f"{shown:%Y-%m-%d %H:%M} {shown.tzname()}"


def policy_in_words(policy) -> str:
    """A late policy (grader.gradebook.deadlines.Policy) as a student reads it."""
    def percent(fraction: float) -> str:
        return f"{fraction * 100:g}%"

    def span(delta) -> str:
        days, hours = delta.days, delta.total_seconds() / 3600
        return (f"{days} day{'s' * (days != 1)}" if delta == type(delta)(days=days)
                else f"{hours:g} hour{'s' * (hours != 1)}")

    parts = []
    if policy.per != "none" and policy.rate > 0:
        parts.append(f"{percent(policy.rate)} of the score is taken off for each {policy.per} "
                     f"late or part of one" + (f", at most {percent(policy.cap)}"
                                               if policy.cap < 1 else ""))
    if policy.zero_after is not None:
        parts.append(f"handed in more than {span(policy.zero_after)} late, it scores 0")
    if not parts:
        return "no penalty for a late hand-in"
    minutes = policy.grace.total_seconds() / 60
    if minutes:
        parts.append(f"up to {minutes:g} minute{'s' * (minutes != 1)} late counts as on time")
    return "; ".join(parts)


class NameExercises(Preprocessor):
    """Name each graded cell as the lesson does, for the page's list of scores and the heading
    of each test cell: the heading above it in the course's own copy of the notebook
    (``source/LESSON/``, as released), such as "Exercise: `split_bits`"; a heading that does not
    name the exercise gets its name after it ("Adding a small number ten thousand times:
    `predicted_bf16_stall`"). A cell the lesson lacks is named by its grade id. The names go
    to the template as ``resources.ctc_names`` (grade id -> HTML)."""

    enabled = Bool(True)
    source_root = Unicode("", help="the course's source folder (source/)").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict):
        meta = resources.get("nbgrader", {})
        headings = _headings(str(Path(self.source_root) / str(meta.get("assignment", ""))
                                 / f"{meta.get('notebook', '')}.ipynb")) \
            if self.source_root else {}
        names = {}
        for cell in nb.cells:
            grade_id = str(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
            if grade_id and cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                name = grade_id.removeprefix("test-")
                label = headings.get(grade_id, "")
                if name not in label:
                    label = f"{label}: `{name}`" if label else f"`{name}`"
                names[grade_id] = _inline_html(label)
        resources["ctc_names"] = names
        return nb, resources


@cache
def _headings(path: str) -> dict[str, str]:
    """grade id -> the text of the last Markdown heading above its cell, in the notebook at
    ``path`` (empty where it cannot be read)."""
    import nbformat

    try:
        cells = nbformat.read(path, as_version=4).cells
    except (OSError, ValueError):
        return {}
    found, heading = {}, ""
    for cell in cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    heading = line.lstrip("#").strip()
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id:
            found[grade_id] = heading
    return found


def _inline_html(text: str) -> str:
    """One line of the lesson's Markdown as HTML: `code` and $math$, the rest as text."""
    parts = []
    for number, piece in enumerate(text.split("`")):
        if number % 2:
            parts.append(f"<code>{html.escape(piece)}</code>")
        else:
            parts += [mathml(bit) if place % 2 else html.escape(bit)
                      for place, bit in enumerate(piece.split("$"))]
    return clean("".join(parts))
