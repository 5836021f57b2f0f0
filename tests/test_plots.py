"""Plots for a projector: every figure of every lesson fits a 1280×720 window, text legible there.

Each instructor notebook runs with a hook that, after every cell and before the inline backend
shows and closes its figures, measures each figure as it will be drawn: its size in pixels
(the tight bounding box at the figure's dpi, as the inline backend saves it) and the smallest
visible text, in pixels. JupyterLab shows a figure at its own size, or scaled down to the width
of the output area. In a 1280×720 window, with the file browser open as JupyterLab starts, the
notebook is 950 by 599 pixels (measured in headless Chromium), which leaves about ``WIDTH_PX``
of output width beside the prompt, and ``HEIGHT_PX`` for a whole figure on screen.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

from grader.content.lessons import all_lessons

pytestmark = pytest.mark.slow

WIDTH_PX = 840  # the output area's width in a 1280-pixel-wide JupyterLab, file browser open
HEIGHT_PX = 560  # of the notebook's 599 visible pixels, with a cell's margins: a whole figure
MIN_TEXT_PX = 11  # about 8 points: the smallest text still legible from a lecture hall's back

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


def measured_figures(lesson, tmp_path) -> list[dict]:
    nb = nbformat.read(lesson.notebook, as_version=4)
    log = tmp_path / f"{lesson.name}.jsonl"
    nb.cells.insert(0, new_code_cell(f"_ctc_figures_log = {str(log)!r}\n" + MEASURE))
    os.environ.pop("NBGRADER_EXECUTION", None)  # the lecture's plots, not the grader's
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False,
                   resources={"metadata": {"path": str(lesson.folder)}}).execute()
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("lesson", all_lessons(), ids=lambda lesson: lesson.name)
def test_every_plot_fits_a_1280_by_720_window_with_legible_text(lesson, tmp_path) -> None:
    figures = measured_figures(lesson, tmp_path)
    assert figures, f"{lesson.name} draws no plot"
    problems = []
    for figure in figures:
        scale = min(1.0, WIDTH_PX / figure["width"])  # JupyterLab shrinks a wide figure
        height = figure["height"] * scale
        if height > HEIGHT_PX:
            problems.append(f"code cell {figure['cell']}: {height:.0f} px tall on screen "
                            f"(at most {HEIGHT_PX})")
        text = figure["min_font_px"]
        if text is not None and text * scale < MIN_TEXT_PX:
            problems.append(f"code cell {figure['cell']}: text {text * scale:.1f} px on screen "
                            f"(at least {MIN_TEXT_PX})")
    assert problems == [], problems
