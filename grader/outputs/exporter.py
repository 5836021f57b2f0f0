"""The exporter that writes a student's feedback page with the course's template, and the
preprocessor that reads the grades it shows (nbgrader's GenerateFeedback runs both; the course's
nbgrader_config.py names them)."""

from __future__ import annotations

import re
from functools import cache, lru_cache

from nbconvert.exporters import HTMLExporter
from nbconvert.exporters import html as nbconvert_html
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from nbgrader.preprocessors import GetGrades
from traitlets import Bool

from grader.gradebook.coursedir import TEMPLATES, nbgrader_templates
from grader.outputs.preprocessors import REMEMBERED_CELLS, REMEMBERED_CHARS


def inert_formgrader(c) -> None:
    """Configure nbgrader's formgrader, in an nbgrader_config.py's ``c``, to make each
    submission inert on its grading page as on the feedback page.

    formgrader's pages are served by the instructor's own Jupyter server: a student's script or
    event handler there would act with the instructor's session (kernels, terminals, files).
    Its exporter (nbgrader's HTMLExporter, template "formgrade") runs ``SanitizeUntrusted``
    first; the template's ``markdown2html`` and ``strip_files_prefix`` filters then leave that
    HTML as it is, and its MathJax (from a CDN) is not loaded: formulas are MathML already
    (grader/outputs/templates/formgrade/mathjax.html.j2). The feedback pages' exporter keeps
    its own preprocessors (``GenerateFeedback.preprocessors``, in order) and filters."""
    c.HTMLExporter.preprocessors = ["grader.outputs.preprocessors.SanitizeUntrusted"]
    c.HTMLExporter.filters = {"markdown2html": "grader.outputs.preprocessors.as_it_is",
                              "strip_files_prefix": "grader.outputs.preprocessors.as_it_is"}
    c.HTMLExporter.extra_template_basedirs = [str(TEMPLATES), nbgrader_templates()]
    c.FeedbackExporter.preprocessors = []
    c.FeedbackExporter.filters = {}


class FeedbackExporter(HTMLExporter):
    """nbgrader's ``GenerateFeedback`` exporter, under a name of its own so that the course's
    template is configured for the feedback page alone (``FeedbackExporter.template_name`` in
    the course's nbgrader_config.py). Configured as ``HTMLExporter.template_name``, it was
    loaded by formgrader too, whose grading page then failed with HTTP 500.

    HTMLExporter's last pass is left out: it parses the whole page with BeautifulSoup to give
    an image without alt text nbconvert's default one and JupyterLab's cells a tabindex. On
    these pages (nbgrader's classic template, which has no JupyterLab cells; formulas as
    MathML; highlighted code) that pass was 70% of a page's time (nbconvert 7.17). The alt
    text is added here, on the page as written. Code is highlighted by nbconvert's own filter,
    remembering what it did for the cells every page shares. The notebook is validated once,
    after the last preprocessor (nbconvert's ``optimistic_validation``), not after each of
    the seven: 17% of a page's time, and a preprocessor that broke the notebook still stops
    its page."""

    optimistic_validation = Bool(True, help="Validate once, after every preprocessor").tag(
        config=True)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._highlighters: dict[str | None, _Remembered] = {}  # by pygments lexer

    def from_notebook_node(self, nb: NotebookNode, resources: dict | None = None, **kw):
        language = nb.metadata.get("language_info")
        language = language if isinstance(language, dict) else {}
        lexer = language.get("pygments_lexer", language.get("name", None))
        lexer = lexer if isinstance(lexer, str) else None
        if lexer not in self._highlighters:
            self._highlighters[lexer] = _Remembered(Highlight2HTML(pygments_lexer=lexer,
                                                                   parent=self))
        self.filters = {**self.filters, "highlight_code": self._highlighters[lexer]}
        soup, nbconvert_html.BeautifulSoup = nbconvert_html.BeautifulSoup, _Unparsed
        try:
            page, resources = super().from_notebook_node(nb, resources, **kw)
        finally:
            nbconvert_html.BeautifulSoup = soup
        return IMG_TAG.sub(_with_alt, page), resources


class _Remembered:
    """nbconvert's code highlighter, remembering the code it highlighted last: the lesson's
    given cells are the same on every student's page (0.3 s a page of lesson 01)."""

    def __init__(self, highlight: Highlight2HTML) -> None:
        self.highlight = highlight
        self.highlighted = lru_cache(maxsize=REMEMBERED_CELLS)(self._highlight)

    def _highlight(self, source: str, language: str | None, magics: str | None) -> str:
        return self.highlight(source, language, {"magics_language": magics} if magics else None)

    def __call__(self, source: str, language: str | None = None, metadata=None) -> str:
        magics = (metadata or {}).get("magics_language")
        magics = magics if isinstance(magics, str) else None
        if len(source) > REMEMBERED_CHARS:  # a student's own long cell: not kept
            return self._highlight(source, language, magics)
        return self.highlighted(source, language, magics)


class _Unparsed(str):
    """Stands in for BeautifulSoup in HTMLExporter's last pass: the page as it is, in which
    nothing is selected (so nothing is changed)."""

    def __new__(cls, markup: str, features: str | None = None):
        return super().__new__(cls, markup)

    def select(self, selector: str) -> list:
        return []


# An <img> tag of the page and its attributes. The page's tags are the template's (attribute
# values quoted and escaped, or whole numbers) and nh3's (quoted, with < and > escaped).
IMG_TAG = re.compile(r"<img\b[^>]*>")
ATTRIBUTE = re.compile(r"""\s([^\s"'>/=]+)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'>]+))?""")
NO_ALT = "No description has been provided for this image"  # nbconvert's words


def _with_alt(tag: re.Match) -> str:
    """The tag, with nbconvert's alt text where it has none."""
    rest = tag.group(0)[len("<img"):]
    if "alt" in {name.lower() for name in ATTRIBUTE.findall(rest)}:
        return tag.group(0)
    return f'<img alt="{NO_ALT}"{rest}'


class GetGradesAtOnce(GetGrades):
    """nbgrader's ``GetGrades`` (each exercise's score, maximum and comment into the notebook,
    the total into the page's resources), the notebook's grades and comments read in one query
    each: nbgrader's asks for each cell's grade and comment in turn (20% of a page's time, two
    queries a cell), after opening a gradebook that ``preprocess`` has open already."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        from nbgrader.api import Comment, Grade
        from sqlalchemy.orm import joinedload, undefer

        meta = resources["nbgrader"]
        self.notebook_id, self.assignment_id = meta["notebook"], meta["assignment"]
        self.student_id, self.db_url = meta["student"], meta["db_url"]
        gb = _gradebook(self.db_url)
        try:
            notebook = gb.find_submission_notebook(self.notebook_id, self.assignment_id,
                                                   self.student_id)
            self._scores = {
                grade.cell.name: (grade.score, grade.max_score)
                for grade in gb.db.query(Grade).filter(Grade.notebook_id == notebook.id)
                .options(undefer(Grade.max_score), joinedload(Grade.cell))}
            self._comments = {
                comment.cell.name: comment.comment
                for comment in gb.db.query(Comment).filter(Comment.notebook_id == notebook.id)
                .options(joinedload(Comment.cell))}
            nb, resources = Preprocessor.preprocess(self, nb, resources)  # preprocess_cell
            penalty = notebook.late_submission_penalty or 0
            meta["score"] = notebook.score - penalty
            meta["max_score"], meta["late_penalty"] = notebook.max_score, penalty
        finally:
            gb.close()  # the page's session ends; the engine stays, and the queries it compiled
        return nb, resources

    def _get_comment(self, cell: NotebookNode, resources: dict) -> None:
        from nbgrader.api import MissingEntry

        name = cell.metadata["nbgrader"]["grade_id"]
        if name not in self._comments:
            raise MissingEntry(f"no comment of cell {name!r}")  # as nbgrader's find_comment
        cell.metadata.nbgrader["comment"] = self._comments[name]

    def _get_score(self, cell: NotebookNode, resources: dict) -> None:
        from nbgrader.api import MissingEntry

        name = cell.metadata["nbgrader"]["grade_id"]
        if name not in self._scores:
            raise MissingEntry(f"no grade of cell {name!r}")  # as nbgrader's find_grade
        cell.metadata.nbgrader["score"], cell.metadata.nbgrader["points"] = self._scores[name]


@cache
def _gradebook(db_url: str):
    """nbgrader's gradebook of ``db_url``, opened once in the process that makes the pages:
    each page then uses it in a session of its own (``GetGradesAtOnce``). Opened a page at a
    time, as nbgrader's GetGrades does, each page asked again for the database's tables and the
    course's row (its engine is one a database since grader/gradebook/schema.py's
    ``one_engine_a_database``; before, each page also compiled every query again)."""
    from nbgrader.api import Gradebook

    return Gradebook(db_url)
