"""Lesson 05's memory explorer in a real browser: the instructor version runs in JupyterLab in
headless Chromium, a control is moved as a person would move it (a click on a checkbox, the
arrow key on a slider), and the total the panel shows becomes the reference's
``memory_budget``. Reuses tests/test_browser.py's helpers; the screenshot goes to
build/screenshots/."""

from __future__ import annotations

import json
import re
import time

import pytest

from grader.content.lessons import load_lesson
from solutions.backprop import gated_mlp_d_ff, transformer_params
from solutions.memory_explorer import _gb, memory_budget
from tests.test_browser import CHROMIUM, SCREENSHOTS, error_texts, run_all

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-05"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-05"  # the instructor version's folder in the shared lab
LESSON = load_lesson("05_adamw_memory")
MODELS = json.loads((LESSON.folder / "models.json").read_text())["models"]


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the instructor version
    of lesson 05."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def reference_total(**changes) -> int:
    """One GPU's total as ``memory_budget`` gives it, for the explorer's first settings (Llama 2
    7B, mixed bf16, 4096 tokens, one sequence per GPU, one GPU) changed by ``changes``."""
    shape = MODELS["Llama 2 7B"]
    n_params = transformer_params(shape["n_layers"], shape["d_model"], shape["vocab_size"],
                                  gated_mlp_d_ff(shape["d_ff"], shape["mlp_matrices"]))
    settings = {"n_params": n_params, "n_layers": shape["n_layers"],
                "d_model": shape["d_model"], "n_heads": shape["n_heads"],
                "recipe": "mixed_bf16", "seq_len": 4096, "batch": 1, "checkpointing": False,
                "n_gpus": 1, "dropout": shape["dropout"], **changes}
    return sum(memory_budget(**settings).values())


def shown_total(page) -> tuple[int, str]:
    """The total per GPU the panel shows: its exact bytes (data-bytes) and its text."""
    cell = page.locator(".ctc-budget [data-part='total'] [data-bytes]")
    return int(cell.get_attribute("data-bytes")), cell.text_content().strip()


def wait_for_total(page, before: int, timeout: float = 30) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        total = shown_total(page)
        if total[0] != before:
            return total
        time.sleep(0.2)
    return shown_total(page)


def test_moving_the_explorers_controls_shows_the_reference_budget(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-05",
                   notebook=LESSON.notebook.name)
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    panel = page.locator(".ctc-budget")
    panel.wait_for(timeout=60_000)
    panel.scroll_into_view_if_needed()

    first = reference_total()
    assert shown_total(page) == (first, _gb(first))
    assert page.locator(".ctc-budget [data-fits]").get_attribute("data-fits") == "false"

    page.locator(".ctc-checkpointing input[type='checkbox']").click()  # a click, as a person
    checkpointed = reference_total(checkpointing=True)
    assert checkpointed < first
    assert wait_for_total(page, first) == (checkpointed, _gb(checkpointed))

    handle = page.locator(".ctc-gpus .noUi-handle")  # the slider's knob: arrows step it
    handle.focus()
    handle.press("ArrowRight")  # 1 -> 2 GPUs
    handle.press("ArrowRight")  # 2 -> 4 GPUs
    four = reference_total(checkpointing=True, n_gpus=4)
    deadline = time.monotonic() + 30
    while shown_total(page)[0] != four and time.monotonic() < deadline:
        time.sleep(0.2)
    assert shown_total(page) == (four, _gb(four))
    assert page.locator(".ctc-budget [data-fits]").get_attribute("data-fits") == "true"
    text = page.locator(".ctc-budget").text_content()
    assert re.search(r"fits on one H100 SXM", text), text
    whole = page.locator(".jp-OutputArea-output").filter(has=page.locator(".ctc-budget"))
    whole.screenshot(path=str(SCREENSHOTS / "widget-05-memory-budget.png"))
