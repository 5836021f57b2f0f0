"""Lesson 07's explorer in a real browser: the instructor version runs in JupyterLab in headless
Chromium, controls are moved as a person would move them (a ZeRO stage chosen from its list, a
click on a checkbox, the arrow key on a slider), and what the panel shows becomes the
reference's ``parallel_plan``; the whole panel fits the notebook's view in a 1280x720 window,
the controls' labels line up, and the memory bar carries the GPU's 80 GB as a line. Reuses
tests/test_browser.py's helpers; the screenshot goes to build/screenshots/."""

from __future__ import annotations

import json
import time

import pytest

from grader.content.lessons import load_lesson
from solutions.parallel_plan import parallel_plan
from tests.test_browser import (
    CHROMIUM,
    SCREENSHOTS,
    assert_every_plot_fits,
    assert_output_fits_the_view,
    error_texts,
    run_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("widget-07"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

FOLDER = "widget-07"  # the instructor version's folder in the shared lab
LESSON = load_lesson("07_many_devices")
MODELS = json.loads((LESSON.folder / "models.json").read_text())["models"]
H100 = json.loads((LESSON.folder / "hardware.json").read_text())["accelerators"]["H100 SXM"]
NODE = json.loads((LESSON.folder / "interconnects.json").read_text())["H100 SXM node"]


@pytest.fixture(scope="module")
def lab(shared_lab, browser):
    """The worker's lab server (conftest's ``shared_lab``) over the instructor version
    of lesson 07."""
    with shared_lab.serving({FOLDER: LESSON.folder}) as (base, token):
        yield base, token, browser


def reference(**changes) -> dict:
    """``parallel_plan`` for the explorer's first settings (Llama 3 70B, 32 copies with ZeRO-1,
    tensor 8, pipeline 4, 64 micro-batches of one sequence of 8192, 40% MFU) changed."""
    settings = {"dp": 32, "tp": 8, "pp": 4, "zero_stage": 1, "microbatches": 64,
                "micro_batch_size": 1, "seq_len": 8192, "mfu": 0.4, "checkpointing": False,
                **changes}
    return parallel_plan(MODELS["Llama 3 70B"], **settings, peak_flops=H100["peak_flops"]["bf16"],
                         gpu_bytes=H100["memory_bytes"], node=NODE)


def shown_total(page) -> int:
    return int(page.locator(".ctc-plan [data-part='total'] [data-bytes]").get_attribute(
        "data-bytes"))


def wait_for(page, expected: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while shown_total(page) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return shown_total(page)


@pytest.fixture(scope="module")
def page(lab):
    """The instructor version, run top to bottom in a 1280×720 window: no error on the page."""
    base, token, browser = lab
    page = run_all(browser, base, token, FOLDER, "widget-07",
                   notebook=LESSON.notebook.name, viewport=(1280, 720))
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    return page


def test_every_plot_fits_a_1280_by_720_window(page) -> None:
    """The lesson's plots as JupyterLab shows them (see tests/test_browser.py)."""
    assert_every_plot_fits(page, LESSON)


def test_moving_the_explorers_controls_shows_the_reference_plan(page) -> None:
    panel = page.locator(".ctc-plan")
    panel.wait_for(timeout=60_000)
    whole = assert_output_fits_the_view(page, panel)  # its controls and readout, at 1280x720
    # (the controls in two columns, side by side, with the file browser open)
    model, zero = (page.locator(f".ctc-{name}").bounding_box() for name in ("model", "zero"))
    assert model["y"] == zero["y"] and model["x"] + model["width"] < zero["x"], (model, zero)

    first = reference()
    assert shown_total(page) == first["memory_total"]
    assert page.locator(".ctc-plan [data-fits]").get_attribute("data-fits") == "true"
    assert page.locator(".ctc-plan [data-gpus]").get_attribute("data-gpus") == "1024"

    # the controls' labels line up in each of the two columns: each label's box starts and
    # ends at the same x, give or take the 2 pixels by which ipywidgets sets a slider's margin
    # apart from a dropdown's; no label is cut short
    for column in (("model", "dp", "tp", "pp", "micro", "micro-size", "seq"),
                   ("zero", "keep", "gather", "grads", "mfu")):
        labels = [page.locator(f".ctc-{name} .widget-label").first for name in column]
        boxes = [label.bounding_box() for label in labels]
        for edge in (lambda b: b["x"], lambda b: b["x"] + b["width"]):
            assert max(map(edge, boxes)) - min(map(edge, boxes)) <= 3, boxes
        for label in labels:
            assert label.evaluate("e => e.scrollWidth <= e.clientWidth"), label.inner_text()
    line = page.locator(".ctc-plan [data-line]")
    assert line.count() == 1 and float(line.get_attribute("data-line")) == H100["memory_bytes"]

    page.locator(".ctc-zero select").select_option(label="3: and weights")  # as a person
    stage_3 = reference(zero_stage=3)
    assert stage_3["memory_total"] < first["memory_total"]
    assert wait_for(page, stage_3["memory_total"]) == stage_3["memory_total"]

    handle = page.locator(".ctc-pp .noUi-handle")  # the slider's knob: arrows step it
    handle.focus()
    for _ in range(2):
        handle.press("ArrowLeft")  # 4 -> 2 -> 1 stage
    one_stage = reference(zero_stage=3, pp=1)
    assert wait_for(page, one_stage["memory_total"]) == one_stage["memory_total"]
    assert one_stage["memory_total"] > stage_3["memory_total"]  # 80 layers' activations, not 20

    page.locator(".ctc-checkpointing input[type='checkbox']").click()
    checkpointed = reference(zero_stage=3, pp=1, checkpointing=True)
    assert wait_for(page, checkpointed["memory_total"]) == checkpointed["memory_total"]
    assert checkpointed["memory_total"] < one_stage["memory_total"]
    assert page.locator(".ctc-plan [data-fits]").get_attribute("data-fits") == str(
        checkpointed["fits"]).lower()
    step = float(page.locator(".ctc-plan [data-step]").get_attribute("data-step"))
    assert step == checkpointed["step_seconds"]

    # ZeRO-1 with its all-gather of the updated weights behind the next forward pass (issue 44)
    page.locator(".ctc-zero select").select_option(label="1: optimizer state")
    zero_1 = reference(zero_stage=1, pp=1, checkpointing=True)
    assert wait_for(page, zero_1["memory_total"]) == zero_1["memory_total"]
    page.locator(".ctc-gather select").select_option(index=1)
    overlapped = reference(zero_stage=1, pp=1, checkpointing=True, overlap_param_gather=True)
    assert overlapped["step_seconds"] < zero_1["step_seconds"]
    deadline = time.monotonic() + 30
    while float(page.locator(".ctc-plan [data-step]").get_attribute("data-step")) != \
            overlapped["step_seconds"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert float(page.locator(".ctc-plan [data-step]").get_attribute("data-step")) == \
        overlapped["step_seconds"]
    assert "overlap_param_gather" in page.locator(".ctc-plan").inner_text()

    # the arrow keys of a focused dropdown are the dropdown's: the course's lab extension keeps
    # them from the notebook, which otherwise moved to the next cell, the value unchanged
    # (jupyter-widgets/ipywidgets#3912)
    def active_cell() -> int:
        return page.evaluate("[...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-"
                             "hidden) .jp-Cell')].findIndex(c => c.classList.contains("
                             "'jp-mod-active'))")

    zero = page.locator(".ctc-zero select")
    zero.focus()
    before = active_cell()
    zero.press("ArrowDown")  # 1: optimizer state -> 2: and gradients
    stage_2 = reference(zero_stage=2, pp=1, checkpointing=True, overlap_param_gather=True)
    assert stage_2["memory_total"] < overlapped["memory_total"]
    assert wait_for(page, stage_2["memory_total"]) == stage_2["memory_total"]
    assert active_cell() == before and zero.evaluate("e => e === document.activeElement")
    whole.screenshot(path=str(SCREENSHOTS / "widget-07-parallel-plan.png"))
