"""Lesson 09's explorer in a real browser: the instructor version runs in JupyterLab in
headless Chromium, controls are moved as a person would move them (the arrow key on a slider, a
choice in a drop-down), and the values the panel shows become the reference's ``moe_plan``.
Reuses tests/test_browser.py's helpers; the screenshot goes to build/screenshots/."""

from __future__ import annotations

import json
import time

import pytest

from grader.content.lessons import load_lesson
from solutions.experts_explorer import moe_plan
from tests.test_browser import CHROMIUM, SCREENSHOTS, error_texts, run_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-09"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-09"  # the instructor version's folder in the shared lab
LESSON = load_lesson("09_experts")
MODELS = json.loads((LESSON.folder / "models.json").read_text())["moe_models"]
H100 = json.loads((LESSON.folder / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((LESSON.folder / "interconnects.json").read_text())["H100 SXM node"]


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the instructor version
    of lesson 09."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def shown(page, part: str) -> str:
    """A row of the panel: its exact value (data-value)."""
    return page.locator(f".ctc-moe [data-part='{part}'] [data-value]").get_attribute(
        "data-value")


def wait_for(page, part: str, value: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and shown(page, part) != value:
        time.sleep(0.2)
    return shown(page, part)


def test_moving_the_explorers_controls_shows_the_reference_plan(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-09",
                   notebook=LESSON.notebook.name)
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    panel = page.locator(".ctc-moe")
    panel.wait_for(timeout=60_000)
    panel.scroll_into_view_if_needed()

    first = moe_plan(MODELS["Mixtral 8x7B"], 8, 2, 1, 2, H100, NODE)  # the first settings
    assert int(shown(page, "total")) == first["total"] == 46_702_526_464
    assert float(shown(page, "touched")) == first["touched"] == 2.0

    handle = page.locator(".ctc-batch .noUi-handle")  # the slider's knob: arrows step it
    handle.focus()
    for _ in range(2):
        handle.press("ArrowRight")  # 1 -> 2 -> 4 sequences
    batch4 = moe_plan(MODELS["Mixtral 8x7B"], 8, 2, 4, 2, H100, NODE)
    assert wait_for(page, "touched", repr(batch4["touched"])) == "5.46875"
    assert float(shown(page, "moe_tokens")) == batch4["moe_tokens"]

    page.locator(".ctc-model select").select_option("Qwen3-30B-A3B")  # as a person chooses
    qwen = moe_plan(MODELS["Qwen3-30B-A3B"], 128, 8, 4, 2, H100, NODE)
    assert wait_for(page, "total", repr(qwen["total"])) == repr(qwen["total"])
    assert float(shown(page, "touched")) == qwen["touched"]
    assert float(shown(page, "moe_tokens")) == qwen["moe_tokens"]  # still on 2 GPUs
    whole = page.locator(".jp-OutputArea-output").filter(has=page.locator(".ctc-moe"))
    whole.screenshot(path=str(SCREENSHOTS / "widget-09-experts.png"))
