"""Lesson 03's roofline explorer in a real browser: JupyterLab in headless Chromium.

The instructor version runs top to bottom; then the test moves the explorer's controls as a
student would (types a size, picks a GPU, nudges a slider with the keyboard) and checks that
each value the explorer shows becomes what the reference functions give for the new setting.
"""

from __future__ import annotations

import time

import pytest

from grader.content.lessons import load_lesson
from solutions.flops import arithmetic_intensity, matmul_bytes, matmul_flops, ridge_point, roofline
from solutions.hardware import load_hardware
from tests.test_browser import (
    CHROMIUM,
    KERNEL_STATUS,
    SCREENSHOTS,
    assert_every_plot_fits,
    error_texts,
    run_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-03"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-03"  # the instructor version's folder in the shared lab
LESSON = load_lesson("03_matmul_flops")
HARDWARE = load_hardware()


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the lesson's instructor version."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def shown(page, key: str) -> float:
    """The value the explorer's table shows for ``key``, exactly (its data-value attribute)."""
    return float(page.get_attribute(f".ctc-readout .ctc-{key}", "data-value"))


def wait_until_shown(page, key: str, expected: float, rel: float = 0.0) -> None:
    """Wait (the kernel recomputes, the page updates) until ``key`` shows ``expected``."""
    deadline = time.monotonic() + 30
    while True:
        got = shown(page, key)
        if abs(got - expected) <= rel * abs(expected):
            return
        assert time.monotonic() < deadline, f"{key}: shows {got!r}, expected {expected!r}"
        page.wait_for_timeout(200)


def bf16_intensity(m: int, k: int, n: int, bytes_per_element: int = 2) -> float:
    return arithmetic_intensity(matmul_flops(m, k, n), matmul_bytes(m, k, n, bytes_per_element))


@pytest.fixture(scope="module")
def page(lab):
    """The instructor version, run top to bottom in a 1280×720 window: no error on the page."""
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-03-run-all",
                   notebook=LESSON.notebook.name, viewport=(1280, 720))
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    return page


def test_every_plot_fits_a_1280_by_720_window(page) -> None:
    """The lesson's plots as JupyterLab shows them (see tests/test_browser.py)."""
    assert_every_plot_fits(page, LESSON)


def test_moving_the_explorers_controls_shows_what_the_reference_functions_give(page) -> None:
    page.locator(".ctc-readout .ctc-intensity").wait_for(timeout=60_000)
    page.locator(".ctc-readout").scroll_into_view_if_needed()
    h100, a100 = HARDWARE["H100 SXM"], HARDWARE["A100 SXM 80GB"]

    # As it starts: (256, 8192) @ (8192, 8192) on an H100 in bf16, below the ridge.
    assert shown(page, "intensity") == bf16_intensity(256, 8192, 8192)
    assert "memory-bound" in page.text_content(".ctc-readout .ctc-bound")

    # Type a larger m: past the critical batch, compute-bound, at the peak.
    size = page.locator(".ctc-m input")
    size.fill("4096")
    size.press("Enter")
    wait_until_shown(page, "intensity", bf16_intensity(4096, 8192, 8192))
    assert shown(page, "attainable") == roofline(bf16_intensity(4096, 8192, 8192),
                                                 h100["peak_flops"]["bf16"],
                                                 h100["memory_bandwidth"])
    assert "compute-bound" in page.text_content(".ctc-readout .ctc-bound")

    # Pick another GPU: its ridge point.
    page.locator(".ctc-gpu select").select_option("A100 SXM 80GB")
    wait_until_shown(page, "ridge_point", ridge_point(a100["peak_flops"]["bf16"],
                                                      a100["memory_bandwidth"]))

    # Nudge the peak slider with the keyboard: the chip becomes the sliders' own.
    plot = page.locator(".ctc-roofline-explorer img").first
    plot.wait_for(timeout=30_000)
    drawn = plot.get_attribute("src")
    page.locator(".ctc-peak .noUi-handle").focus()
    page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + 30
    while not page.eval_on_selector(".ctc-gpu select", "e => e.value").startswith("custom"):
        assert time.monotonic() < deadline, "moving a slider should select the custom chip"
        page.wait_for_timeout(200)
    peak = float(page.text_content(".ctc-peak .widget-readout")) * 1e12  # 4 digits shown
    wait_until_shown(page, "ridge_point", ridge_point(peak, a100["memory_bandwidth"]), rel=1e-3)
    assert shown(page, "ridge_point") > ridge_point(a100["peak_flops"]["bf16"],
                                                    a100["memory_bandwidth"])
    # The plot is drawn again for the new chip.
    deadline = time.monotonic() + 30
    while plot.get_attribute("src") == drawn:
        assert time.monotonic() < deadline, "the plot should be drawn again"
        page.wait_for_timeout(200)
    page.wait_for_function(f"() => ({KERNEL_STATUS})() === 'idle'", timeout=30_000)
    page.wait_for_timeout(1000)  # the new image decoded and painted, for the screenshots
    plot = page.locator(".ctc-roofline-explorer img").first
    plot.scroll_into_view_if_needed()
    assert plot.evaluate("e => e.complete && e.naturalWidth") > 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "widget-03-plot.png"))
    page.locator(".ctc-readout").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "widget-03-controls.png"))
