"""Plots for a projector: every figure of every lesson fits a 1280×720 window, text legible there.

Each instructor notebook runs (once per session: tests/lecture_run.py) with a hook that, after
every cell and before the inline backend shows and closes its figures, measures each figure as
it will be drawn: its size in pixels (the tight bounding box at the figure's dpi, as the inline
backend saves it) and the smallest visible text, in pixels. JupyterLab shows a figure at its own
size, or scaled down to the width of the output area. In a 1280×720 window, with the file
browser open as JupyterLab starts, the notebook is 950 by 599 pixels (measured in headless
Chromium), which leaves about ``WIDTH_PX`` of output width beside the prompt, and ``HEIGHT_PX``
for a whole figure on screen.
"""

from __future__ import annotations

import pytest

from grader.content.lessons import all_lessons
from tests.lecture_run import lecture_run

pytestmark = pytest.mark.slow

WIDTH_PX = 840  # the output area's width in a 1280-pixel-wide JupyterLab, file browser open
HEIGHT_PX = 560  # of the notebook's 599 visible pixels, with a cell's margins: a whole figure
MIN_TEXT_PX = 11  # about 8 points: the smallest text still legible from a lecture hall's back


@pytest.mark.parametrize("lesson", all_lessons(), ids=lambda lesson: lesson.name)
def test_every_plot_fits_a_1280_by_720_window_with_legible_text(lesson, shared_tmp) -> None:
    _, figures, _ = lecture_run(lesson, shared_tmp)
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
