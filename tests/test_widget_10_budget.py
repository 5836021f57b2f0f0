"""Lesson 10's explorer in a real browser: the instructor version runs in JupyterLab in
headless Chromium, controls are moved as a person would move them (the arrow key on a slider, a
choice in a drop-down, a number typed), and every value the panel shows becomes the
reference's ``budget_plan``. Reuses tests/test_browser.py's helpers; the screenshot goes to
build/screenshots/."""

from __future__ import annotations

import json
import math
import time

import pytest

from grader.content.lessons import load_lesson
from solutions.budget_explorer import START_FLOPS, budget_plan
from tests.test_browser import (
    CHROMIUM,
    SCREENSHOTS,
    assert_output_fits_the_view,
    error_texts,
    run_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-10"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-10"  # the instructor version's folder in the shared lab
LESSON = load_lesson("10_budget")
FITS = json.loads((LESSON.folder / "budget.json").read_text())["fits"]
H100 = json.loads((LESSON.folder / "hardware.json").read_text())["accelerators"]["H100 SXM"]
HOFFMANN, BESIROGLU = "Hoffmann et al. 2022", "Besiroglu et al. 2024"


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the instructor version
    of lesson 10."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def shown(page) -> dict[str, float]:
    """Every part the panel shows, by part: its exact value (data-value), read at once."""
    pairs = page.eval_on_selector_all(
        ".ctc-budget-plan [data-part]",
        "els => els.map(e => [e.dataset.part, (e.dataset.value === undefined ? "
        "e.querySelector('[data-value]') : e).dataset.value])")
    return {part: float(value) for part, value in pairs}


def wait_for(page, done, timeout: float = 30) -> dict[str, float]:
    """What the panel shows once ``done(shown)`` holds (the kernel recomputes, the page
    updates), or as it is when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    values = shown(page)
    while time.monotonic() < deadline and not done(values):
        time.sleep(0.2)
        values = shown(page)
    return values


def test_moving_the_explorers_controls_shows_the_reference_plan(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-10",
                   notebook=LESSON.notebook.name, viewport=(1280, 720))
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    panel = page.locator(".ctc-budget-plan")
    panel.wait_for(timeout=60_000)
    whole = assert_output_fits_the_view(page, panel)  # its controls and plan, at 1280x720

    # The first settings: Chinchilla's budget, Hoffmann et al.'s fit, no inference, $2, 0.4 kg
    first = budget_plan(START_FLOPS, FITS[HOFFMANN], 0.0, 2.0, 0.4, H100)
    assert shown(page) == first
    assert round(first["tokens_per_param"]) == 93

    handle = page.locator(".ctc-budget-flops .noUi-handle")  # the slider's knob: arrows step it
    handle.focus()
    handle.press("ArrowRight")
    budget = 6.31e23  # the next budget of the slider, 10^23.8 to three digits
    values = wait_for(page, lambda v: v["compute_flops"] == budget)
    assert values == budget_plan(budget, FITS[HOFFMANN], 0.0, 2.0, 0.4, H100)
    assert page.text_content(".ctc-budget-flops .widget-readout").strip() == "6.31e23"

    page.locator(".ctc-budget-fit select").select_option(BESIROGLU)  # as a person chooses
    refit = budget_plan(budget, FITS[BESIROGLU], 0.0, 2.0, 0.4, H100)
    values = wait_for(page, lambda v: v["n_params"] == refit["n_params"])
    assert values == refit
    assert round(values["tokens_per_param"]) == 18

    served = page.locator(".ctc-budget-inference .noUi-handle")
    served.focus()
    for _ in range(9):
        served.press("ArrowRight")  # none -> 1B -> 3B -> ... -> 10T tokens
    assert page.text_content(".ctc-budget-inference .widget-readout").strip() == "10T"
    lean = budget_plan(budget, FITS[BESIROGLU], 1e13, 2.0, 0.4, H100)
    values = wait_for(page, lambda v: v["lifetime_n_params"] == lean["lifetime_n_params"])
    assert values == lean
    assert values["lifetime_n_params"] < values["n_params"]

    price = page.locator(".ctc-budget-price input")  # a price typed in
    price.fill("3.5")
    price.press("Enter")
    dearer = budget_plan(budget, FITS[BESIROGLU], 1e13, 3.5, 0.4, H100)
    values = wait_for(page, lambda v: v["dollars"] == dearer["dollars"])
    assert values == dearer
    assert math.isclose(values["dollars"], values["gpu_hours"] * 3.5, rel_tol=1e-15)
    text = panel.text_content()
    assert "serving 10T tokens" in text and "saves" in text
    whole.screenshot(path=str(SCREENSHOTS / "widget-10-budget.png"))
