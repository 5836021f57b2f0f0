"""Each lesson's instructor version run once per test session in lecture mode (as `make demo`
runs it), its figures measured as they are drawn; tests/test_notebooks.py reads the run's outputs
and tests/test_plots.py its figures. One xdist worker runs a lesson while the other waits for it
(tests/grading_helpers.make_once).

The run is a student's: the kernel is given the draws of a student id (``LECTURE_STUDENT``) who
answers a variant of the graded prediction other than the default (``lecture_variant``), as the
lab gives them, so that tests/test_notebooks.py can check that no cell shows that student their
own answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

from tests.grading_helpers import make_once

# Before every figure is shown and closed by the inline backend: its size in pixels (the tight
# bounding box at the figure's dpi, as the backend saves it) and its smallest visible text.
MEASURE = r'''
import json as _ctc_json

from matplotlib.backend_bases import FigureCanvasBase as _ctc_Canvas
from matplotlib.text import Text as _ctc_Text

_ctc_print_figure = _ctc_Canvas.print_figure


def _ctc_measured_print_figure(canvas, *args, **kwargs):
    fig = canvas.figure
    dpi = kwargs.get("dpi") or fig.dpi
    if dpi == "figure":
        dpi = fig.dpi
    if kwargs.get("bbox_inches") == "tight":
        box = fig.get_tightbbox(canvas.get_renderer())
        width, height = box.width, box.height
    else:
        width, height = fig.get_size_inches()
    sizes = [t.get_fontsize() for t in fig.findobj(_ctc_Text)
             if t.get_visible() and t.get_text().strip() and t.get_alpha() != 0]
    with open(_ctc_figures_log, "a") as log:
        log.write(_ctc_json.dumps({"cell": _ctc_cell_number(), "width": width * dpi,
                                   "height": height * dpi,
                                   "min_font_px": min(sizes) * dpi / 72 if sizes else None})
                  + "\n")
    return _ctc_print_figure(canvas, *args, **kwargs)


def _ctc_cell_number():
    return get_ipython().execution_count


_ctc_Canvas.print_figure = _ctc_measured_print_figure
'''




LECTURE_STUDENT = "lecture-run"


def lecture_variant(lesson) -> dict[str, int]:
    """The variant of each graded prediction the lecture run's student answers: never the
    default, and another one from lesson to lesson."""
    from grader.content.variants import variants_of

    return {name: 1 + int(lesson.name[:2]) % (len(spec.choices) - 1)
            for name, spec in variants_of(lesson).items()}


def lecture_run(lesson, shared: Path) -> tuple[nbformat.NotebookNode, list[dict], float]:
    """(the executed notebook, each figure's measures, the run's seconds) of ``lesson``, run
    for ``LECTURE_STUDENT``."""
    from grader.content.variants import ENV, kernel_variants
    from grader.lab.progress import execute

    folder = shared / "lecture-runs"
    folder.mkdir(exist_ok=True)
    ran, figures, seconds = (folder / f"{lesson.name}{suffix}"
                             for suffix in (".ipynb", ".jsonl", ".seconds"))

    def run() -> None:
        nb = nbformat.read(lesson.notebook, as_version=4)
        figures.unlink(missing_ok=True)
        nb.cells.insert(0, new_code_cell(f"_ctc_figures_log = {str(figures)!r}\n" + MEASURE))
        start = time.perf_counter()
        draws = kernel_variants(LECTURE_STUDENT, {lesson.name: lecture_variant(lesson)},
                                "0123456789ab")
        execute(nb, lesson.folder, None, 120, env={ENV: draws})
        took = time.perf_counter() - start
        nb.cells.pop(0)
        nbformat.write(nb, ran)
        seconds.write_text(repr(took))

    make_once(seconds, run)
    measured = ([json.loads(line) for line in figures.read_text().splitlines()]
                if figures.exists() else [])
    return nbformat.read(ran, as_version=4), measured, float(seconds.read_text())
