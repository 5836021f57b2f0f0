"""Lesson 08's serving explorer in a real browser: the instructor version runs in JupyterLab in
headless Chromium, controls are moved as a person would move them (the arrow key on a slider, a
choice in a drop-down), and the values the panel shows become the reference's
``serving_plan``. Reuses tests/test_browser.py's helpers; the screenshot goes to
build/screenshots/."""

from __future__ import annotations

import json
import time

import pytest

from grader.content.lessons import load_lesson
from solutions.inference_explorer import _gb, serving_plan
from tests.test_browser import CHROMIUM, SCREENSHOTS, error_texts, run_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-08"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-08"  # the instructor version's folder in the shared lab
LESSON = load_lesson("08_inference")
MODELS = json.loads((LESSON.folder / "models.json").read_text())["models"]
ACCELERATORS = json.loads((LESSON.folder / "hardware.json").read_text())["accelerators"]


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the instructor version
    of lesson 08."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def reference(**changes) -> dict:
    """``serving_plan`` for the explorer's first settings (Llama 2 7B on one H100 SXM, one
    sequence of 4096 tokens, bf16 weights and cache) changed by ``changes``."""
    settings = {"shape": MODELS["Llama 2 7B"], "gpu": ACCELERATORS["H100 SXM"], "n_gpus": 1,
                "batch_size": 1, "context_len": 4096, "weight_format": "bf16",
                "cache_dtype": "bf16", **changes}
    return serving_plan(**settings)


def shown(page, part: str) -> tuple[str, str]:
    """A row of the panel: its exact value (data-value) and its text."""
    cell = page.locator(f".ctc-serving [data-part='{part}'] [data-value]")
    return cell.get_attribute("data-value"), cell.text_content().strip()


def wait_for(page, part: str, value: str, timeout: float = 30) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and shown(page, part)[0] != value:
        time.sleep(0.2)
    return shown(page, part)


def test_moving_the_explorers_controls_shows_the_reference_plan(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-08",
                   notebook=LESSON.notebook.name)
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    panel = page.locator(".ctc-serving")
    panel.wait_for(timeout=60_000)
    panel.scroll_into_view_if_needed()

    first = reference()
    assert shown(page, "cache") == (repr(first["cache"]), _gb(first["cache"]))
    assert shown(page, "max_batch") == (repr(first["max_batch"]), "27")
    assert float(shown(page, "tokens_per_second")[0]) == first["tokens_per_second"]
    assert page.locator(".ctc-serving [data-bound]").get_attribute("data-bound") == "memory"

    handle = page.locator(".ctc-batch .noUi-handle")  # the slider's knob: arrows step it
    handle.focus()
    for _ in range(5):
        handle.press("ArrowRight")  # 1 -> 2 -> 4 -> 8 -> 16 -> 32 sequences
    batch32 = reference(batch_size=32)
    assert wait_for(page, "cache", repr(batch32["cache"])) == (repr(batch32["cache"]),
                                                               _gb(batch32["cache"]))
    # 32 sequences do not fit: no tokens per second, and the panel says why
    assert batch32["tokens_per_second"] is None
    assert shown(page, "tokens_per_second") == ("None", "none: the batch does not fit")
    assert page.locator(".ctc-serving [data-fits]").get_attribute("data-fits") == "false"

    page.locator(".ctc-cache select").select_option("fp8")  # a choice, as a person makes it
    fp8 = reference(batch_size=32, cache_dtype="fp8")
    assert wait_for(page, "max_batch", "54") == ("54", "54")
    assert shown(page, "cache")[0] == repr(fp8["cache"])
    assert page.locator(".ctc-serving [data-fits]").get_attribute("data-fits") == "true"
    assert float(shown(page, "tokens_per_second")[0]) == fp8["tokens_per_second"]
    # The batch slider's readout shows its choice and takes no typing (it ignored what was
    # typed); the lines and "fits" take the theme's colours (the dark theme's too).
    readout = page.locator(".ctc-batch.ctc-choice-slider .widget-readout")
    assert readout.inner_text() == "32"
    assert readout.evaluate("e => [getComputedStyle(e).pointerEvents, "
                            "getComputedStyle(e).webkitUserModify]") == ["none", "read-only"]
    assert "--jp-success-color1" in page.locator(".ctc-serving [data-fits]").get_attribute(
        "style")
    whole = page.locator(".jp-OutputArea-output").filter(has=page.locator(".ctc-serving"))
    whole.screenshot(path=str(SCREENSHOTS / "widget-08-serving.png"))
