"""The course in a real browser: JupyterLab in headless Chromium, driven by Playwright.

A student opens the released lesson, runs all cells and sees the course's Validate button; the
only errors on the page are the "not implemented yet" of unanswered exercises. In every lesson
a student who has answered everything, their graded prediction far off, gets a summary that
counts the prediction apart and its point in no total (only grading knows its answer), and one
whose prediction is far off and one exercise wrong a summary that counts neither and lists
neither as passing (lesson 01 in the dialog, the others from the button's address on the same
server, a lab with a student id); a notebook worked on the default numbers, opened with an id,
is said to be so first. In lesson 01 Validate also answers a notebook partly done, with a cell
that raises, a SyntaxError and a kernel the student interrupted. An instructor runs the
instructor version top to bottom: no error, plots drawn; lesson 01's explorer shows what the
reference decodes as bits are switched; a cell run after Kernel > Restart says so in one line.
Screenshots are saved in build/screenshots/ for the test log.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from grader.content.lessons import all_lessons, load_lesson
from grader.course import Course
from grader.lab.server import lab_environment, running_lab
from solutions.float_explorer import bit_readout
from solutions.floats import FP8_E4M3, FP16, decode
from tests.grading_helpers import (
    WRONG_ANSWERS,
    answered,
    cell,
    graded_prediction,
    mixed,
    points,
    read_notebook,
    released,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                 "(make test installs it where it can)")]

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "build" / "screenshots"
LESSON = load_lesson("01_float_formats")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def lab(shared_lab, browser, shared_tmp):
    """The worker's lab server (conftest's ``shared_lab``: no student id) over copies of two
    folders: the student version (the session's release) and the instructor version."""
    folders = {"student": released(LESSON, shared_tmp), "instructor": LESSON.folder}
    with shared_lab.serving(folders) as (base, token):
        yield base, token, browser


KERNEL_STATUS = """() => {
    const widget = window.jupyterapp.shell.currentWidget;
    const kernel = widget && widget.sessionContext && widget.sessionContext.session
        && widget.sessionContext.session.kernel;
    return kernel ? kernel.status : "none";
}"""


def run_all(browser, base: str, token: str, folder: str, name: str,
            notebook: str = LESSON.notebook.name, viewport: tuple[int, int] = (1600, 1000)):
    """Open a notebook, run all its cells, wait until the kernel is idle again."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    # A workspace of its own, so that no tab of an earlier page is restored.
    page.goto(f"{base}/lab/workspaces/{name}/tree/{folder}/{notebook}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function(f"() => ({KERNEL_STATUS})() === 'idle'", timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # done: idle, something ran, nothing waits ("[*]")
        time.sleep(1)
        prompts = page.eval_on_selector_all(".jp-InputPrompt", "els => els.map(e => e.textContent)")
        ran = any(any(ch.isdigit() for ch in p) for p in prompts)
        if ran and not any("*" in p for p in prompts) and page.evaluate(KERNEL_STATUS) == "idle":
            break
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
    return page


def error_texts(page) -> list[str]:
    """Every error and stderr output on the page (textContent: cells off screen count too)."""
    return page.eval_on_selector_all(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
        "els => els.map(e => e.textContent)")


def validate(page, shot: str) -> dict:
    """Press the notebook's Validate button; what its dialog shows: the whole ``text``, its
    ``paragraphs`` and ``items`` in order, and the widths that would cut a line (``cut``)."""
    buttons = page.get_by_role("button", name="Validate")
    assert buttons.count() == 1, "one Validate button: the course's, not nbgrader's as well"
    buttons.first.click()
    page.wait_for_selector(".jp-Dialog .ctc-validate", timeout=180_000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(SCREENSHOTS / f"{shot}.png"))
    shown = page.evaluate("""() => {
        const body = document.querySelector('.jp-Dialog .ctc-validate');
        const content = document.querySelector('.jp-Dialog-content');
        const box = content.getBoundingClientRect();
        const cut = [...body.querySelectorAll('p, li')].filter(e =>
            e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > box.right)
            .map(e => e.textContent);
        return {text: document.querySelector('.jp-Dialog').innerText,
                title: document.querySelector('.jp-Dialog-header').innerText,
                paragraphs: [...body.children].map(e => e.innerText),
                items: [...body.querySelectorAll('li')].map(e => e.innerText),
                cut, onScreen: box.right <= window.innerWidth && box.left >= 0};
    }""")
    page.keyboard.press("Escape")
    page.wait_for_selector(".jp-Dialog", state="detached")
    assert shown["cut"] == [] and shown["onScreen"], shown  # every line fits the dialog
    assert "The following cell failed" not in shown["text"] and "Traceback" not in shown["text"]
    return shown


def open_notebook(browser, base: str, token: str, path: str, name: str,
                  viewport: tuple[int, int] = (1280, 720)):
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.goto(f"{base}/lab/workspaces/{name}/tree/{path}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    return page


def test_student_runs_all_and_sees_validate_and_only_not_implemented_errors(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, "student", "student-run-all")
    assert page.get_by_role("button", name="Validate").first.is_visible()
    errors = [e for e in error_texts(page) if "CheckFailed" in e or "Error" in e]
    assert errors, "the unanswered exercises should report themselves"
    assert all("not implemented yet" in e or "not done yet" in e for e in errors), errors[:2]
    assert all(len(e.strip().splitlines()) == 1 for e in errors), errors[:2]  # one line each
    # A printed line too long for the output area wraps between words, not inside one (the
    # course's style over JupyterLab's "break-all").
    assert page.eval_on_selector(".jp-OutputArea-output pre",
                                 "e => getComputedStyle(e).wordBreak") == "normal"
    shown = validate(page, "student-validate")
    exercises = points(nbformat.read(LESSON.notebook, as_version=4))
    prediction = graded_prediction(LESSON)
    checked = {k: v for k, v in exercises.items() if k != prediction}
    assert shown["paragraphs"][0] == (  # the summary first
        f"0 of {len(checked)} exercises pass their visible checks "
        f"(0 of {sum(checked.values()):g} points). Your graded prediction, {prediction}, is "
        f"still to do ({exercises[prediction]:g} point).")
    assert shown["items"] == [f"to do {name} ({n:g} point{'s' * (n != 1)})"
                              for name, n in exercises.items()]
    assert "Hidden checks also run" in shown["paragraphs"][-1]


STUDENT = "s-42"  # the id of the student whose lab serves lab_validate


def far_off(student: nbformat.NotebookNode, lesson) -> nbformat.NotebookNode:
    """Every answer in, the graded prediction a thousand times its answer (for any variant)."""
    nb, (_prediction, wrong) = mixed(student, lesson)
    cell(nb, wrong).source = cell(answered(student, lesson), wrong).source
    return nb


def worked_on_the_defaults(nb: nbformat.NotebookNode, lesson) -> nbformat.NotebookNode:
    """``nb`` as a lab without a student id saved it: its variant cell's record of the
    default numbers, drawn for no one."""
    from nbformat.v4 import new_output

    prediction = graded_prediction(lesson)
    cell(nb, f"variant-{prediction}").outputs = [new_output(
        "display_data", data={"text/plain": "Your numbers: ..."},
        metadata={"counting_the_cost": {"variant": {"exercise": f"{lesson.name}/{prediction}",
                                                    "student": None, "index": 0,
                                                    "course": ""}}})]
    return nb


@pytest.fixture(scope="module")
def lab_validate(tmp_path_factory, browser, shared_tmp):
    """A lab server, with a student id (``STUDENT``), over every lesson's student version with
    every answer filled in from the instructor's but the graded prediction far off
    (``done-LESSON``); lesson 01 also with one exercise wrong besides (``mixed-LESSON``: that
    each lesson's wrong answer fails a visible check, tests/test_grading.py reads from its
    grading), worked on the defaults (``defaults-LESSON``), and at three other stages."""
    from grader.content.variants import ENV, course_key, lab_variants

    tmp = tmp_path_factory.mktemp("validate")
    root = tmp / "root"
    for lesson in all_lessons():
        student_version = released(lesson, shared_tmp)
        student = read_notebook(student_version / lesson.notebook.name)
        kinds = [("done", far_off(student, lesson))]
        if lesson.name == LESSON.name:
            kinds.append(("mixed", mixed(student, lesson)[0]))
            kinds.append(("defaults", worked_on_the_defaults(far_off(student, lesson), lesson)))
        for kind, nb in kinds:
            shutil.copytree(student_version, root / f"{kind}-{lesson.name}")
            nbformat.write(nb, root / f"{kind}-{lesson.name}" / lesson.notebook.name)
    first = released(LESSON, shared_tmp)
    student = read_notebook(first / LESSON.notebook.name)
    partly = answered(student, LESSON)  # split_bits done, decode with a SyntaxError, the rest
    for mine, untouched in zip(partly.cells, student.cells, strict=True):  # to do
        meta = mine.metadata.get("nbgrader", {})
        if meta.get("solution") and meta["grade_id"] not in ("FloatFormat", "split_bits"):
            mine.source = untouched.source
    cell(partly, "decode").source = "def decode(bits, fmt):\n    return (bits +\n"
    partly.cells.insert(4, nbformat.v4.new_code_cell("1 / 0  # a scratch cell of my own"))
    shutil.copytree(first, root / "partly")
    nbformat.write(partly, root / "partly" / LESSON.notebook.name)
    course = Course(tmp / "course", log=lambda _: None)
    environment = {**lab_environment(course),
                   ENV: lab_variants(course_key(course.root, create=True), STUDENT)}
    with running_lab(root, environment, 0,
                     "--LabApp.expose_app_in_browser=True") as (base, token):
        yield base, token, browser


def summary_of(lesson, exclude: dict[str, float] | None = None) -> str:
    """The headline of a lesson whose graded prediction is in and whose other exercises pass
    but those of ``exclude``: the prediction apart, its point in no total."""
    exercises = points(read_notebook(lesson.notebook))
    prediction = graded_prediction(lesson)
    apart = exercises.pop(prediction)
    total = sum(exercises.values())
    if not exclude:
        counted = (f"All {len(exercises)} exercises pass their visible checks ({total:g} of "
                   f"{total:g} points).")
    else:
        counted = (f"{len(exercises) - len(exclude)} of {len(exercises)} exercises pass their "
                   f"visible checks ({total - sum(exclude.values()):g} of {total:g} points).")
    return (f"{counted} Your graded prediction, {prediction}, is in: it is graded when you hand "
            f"in ({apart:g} point)." + ("" if exclude else " Hand in the notebook as your "
                                        "course asks."))


def validate_by_address(base: str, token: str, path: str) -> dict:
    """What the Validate dialog would show for ``path``, asked of the same server at the
    button's address (``paragraphs``: the headline first; ``items``: each exercise not passing,
    worded as grader/lab/labextension/index.js words it)."""
    request = urllib.request.Request(
        f"{base}/counting-the-cost/validate", data=json.dumps({"path": path}).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.load(response)
    assert reply["success"], reply
    answer = reply["value"]
    items = [f"{e['status']} {e['name']} ({e['points']:g} point{'s' * (e['points'] != 1)})"
             + (f": {e['message']}" if e["message"] else "")
             for e in answer["exercises"] if e["status"] not in ("passes", "in")]
    return {"paragraphs": [answer["headline"], answer["note"]], "items": items,
            "graded": [e["name"] for e in answer["exercises"] if e["status"] == "in"]}


@pytest.mark.parametrize("lesson", all_lessons(), ids=lambda lesson: lesson.name)
def test_validate_shows_the_success_summary_and_counts_no_unearned_point(
        lab_validate, lesson) -> None:
    """Every answer in, the graded prediction a thousand times its answer: the success
    summary, first, with the prediction apart, "in", its point in no total and not among the
    passing (Validate cannot know its band). Lesson 01 in the browser, where the dialog is
    drawn (and the tests below draw it at every stage), then with one exercise wrong besides:
    the wrong one on a line, the prediction in no list of passing exercises; then worked on the
    default numbers and opened in a lab with an id: said first, with what to re-run. The other
    lessons by the button's own address on the same server, which answers what the dialog
    shows: a page load each would cost seconds and check the same drawing again."""
    base, token, browser = lab_validate
    in_browser = lesson.name == LESSON.name

    def shown_for(kind: str) -> dict:
        path = f"{kind}-{lesson.name}/{lesson.notebook.name}"
        if not in_browser:
            return validate_by_address(base, token, path)
        page = open_notebook(browser, base, token, path, f"validate-{kind}-{lesson.name}")
        shown = validate(page, f"validate-{kind}-{lesson.name}")
        assert shown["title"] == f"Validate: {lesson.notebook.name}"
        page.close()
        return shown

    prediction = graded_prediction(lesson)
    shown = shown_for("done")
    assert shown["paragraphs"][0] == summary_of(lesson), shown["paragraphs"]
    assert shown["items"] == []
    assert "Hidden checks also run" in shown["paragraphs"][-1]
    assert f"drawn for {STUDENT}" in shown["paragraphs"][-1]  # the lab's id reached the run
    if not in_browser:
        assert shown["graded"] == [prediction]
        return
    assert (f"Graded when you hand in: {prediction} (1 point). Your number is in; only grading "
            "knows the answer for your numbers.") in shown["paragraphs"]
    shown = shown_for("mixed")
    exercises = points(read_notebook(lesson.notebook))
    _prediction, wrong = mixed(read_notebook(lesson.notebook), lesson)[1]
    assert wrong == WRONG_ANSWERS[lesson.name][0]
    # The lab never holds a graded prediction's answer: a number far off is "in", as any
    # number is, until grading compares it with the answer for the student's own numbers.
    assert shown["paragraphs"][0] == summary_of(lesson, {wrong: exercises[wrong]})
    assert [i for i in shown["items"] if not i.startswith(f"fails {wrong} (")] == []
    assert len(shown["items"]) == 1
    [passing] = [p for p in shown["paragraphs"] if p.startswith("Passing: ")]
    assert prediction not in passing and wrong not in passing
    shown = shown_for("defaults")
    assert shown["paragraphs"][0].startswith(
        "This notebook was worked on other numbers than yours: its numbers are the course's "
        f"default ones (it was worked without a student id), not the ones drawn for {STUDENT}."
        ), shown["paragraphs"]
    assert 'Run the cell that prints "Your numbers" again' in shown["paragraphs"][0]


def test_validate_answers_at_every_stage_of_a_lesson(lab_validate) -> None:
    """Partly done, with a SyntaxError in one answer and a scratch cell that raises; then the
    same after the student's own kernel was interrupted in the middle of a cell."""
    base, token, browser = lab_validate
    page = open_notebook(browser, base, token, f"partly/{LESSON.notebook.name}", "partly")
    shown = validate(page, "validate-partly")
    exercises = points(read_notebook(LESSON.notebook))
    prediction = graded_prediction(LESSON)
    checked = {k: v for k, v in exercises.items() if k != prediction}
    assert shown["paragraphs"][0] == (
        f"2 of {len(checked)} exercises pass their visible checks "
        f"({exercises['FloatFormat'] + exercises['split_bits']:g} of {sum(checked.values()):g} "
        f"points). Your graded prediction, {prediction}, is still to do (1 point).")
    decode = next(i for i in shown["items"] if " decode " in i)
    assert decode.startswith("fails decode (2 points): ") and "not defined" in decode, decode
    # The student starts a long cell and interrupts it: Validate runs a kernel of its own.
    page.wait_for_function(f"() => ({KERNEL_STATUS})() === 'idle'", timeout=90_000)
    page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        const future = panel.sessionContext.session.kernel.requestExecute(
            {code: 'import time\\ntime.sleep(600)'});
        await new Promise(r => setTimeout(r, 1500));
        await panel.sessionContext.session.kernel.interrupt();
        await future.done.catch(() => null);
    }""")
    again = validate(page, "validate-after-interrupt")
    assert again["paragraphs"][0] == shown["paragraphs"][0]


def test_students_see_no_instructor_tools_and_no_news(lab) -> None:
    base, token, browser = lab
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"{base}/lab/workspaces/tools/tree/student/{LESSON.notebook.name}"
              f"?reset&token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_timeout(3000)  # the news pop-up would have shown by now
    disabled = page.evaluate("() => JSON.parse(document.getElementById("
                             "'jupyter-config-data').textContent).disabledExtensions")
    assert "@jupyter/nbgrader:create-assignment" in disabled
    assert "@jupyterlab/apputils-extension:announcements" in disabled
    sidebar = page.eval_on_selector_all(".jp-SideBar .lm-TabBar-tab",
                                        "els => els.map(e => e.getAttribute('title') || "
                                        "e.textContent)")
    assert not any("assignment" in (t or "").lower() for t in sidebar), sidebar
    assert page.locator(".jp-Notification-Toast").count() == 0
    assert page.get_by_role("button", name="Validate").first.is_visible()
    page.screenshot(path=str(SCREENSHOTS / "student-tools.png"))


# tests/test_plots.py measures every figure of every lesson as it is drawn, and holds it to
# tighter bounds (840 by 560 pixels, text at least 11) on a model of how JupyterLab shows a
# figure: at its own size, or scaled down to the output area's width. That model is checked
# where JupyterLab really draws, on the two lessons with the most and the largest figures
# (03 and 07), by their explorers' tests (tests/test_widget_03_*.py, tests/test_widget_07_*.py),
# on the page where they ran the instructor version.
def assert_output_fits_the_view(page, inside):
    """The output that holds ``inside`` (an explorer's panel), scrolled to its top, fits the
    notebook's view: in a 1280x720 window a student sees its readout change as a control
    moves. Returns that output."""
    whole = page.locator(".jp-OutputArea-output").filter(has=inside)
    whole.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = whole.bounding_box()
    view = page.locator(".jp-NotebookPanel:visible .jp-WindowedPanel-outer").bounding_box()
    assert view["y"] - 1 <= box["y"] and box["y"] + box["height"] <= view["y"] + view["height"] \
        + 1, (box, view)
    return whole


def assert_every_plot_fits(page, lesson) -> None:
    """Each plot of a notebook run on ``page`` (a 1280×720 window with the file browser open):
    no wider than the output area, and a whole figure on screen."""
    images = page.locator(".jp-OutputArea-output img")
    assert images.count() >= 1
    folder = SCREENSHOTS / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    area = page.eval_on_selector(".jp-NotebookPanel-notebook", "e => e.clientHeight")
    for i in range(images.count()):
        image = images.nth(i)
        image.scroll_into_view_if_needed()
        box = image.bounding_box()
        image.screenshot(path=str(folder / f"{lesson.name}-{i}.png"))
        assert box["width"] <= 850 and box["height"] <= min(area, 580), (lesson.name, i, box)


RESTART_AND_RUN = """async (index) => {
    const app = window.jupyterapp;
    const panel = app.shell.currentWidget;
    await panel.sessionContext.session.kernel.restart();
    await panel.sessionContext.ready;
    panel.content.activeCellIndex = index;
    await app.commands.execute('notebook:run-cell');
    const cell = panel.content.widgets[index];
    for (let i = 0; i < 600 && !cell.node.querySelector(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"); i++) {
        await new Promise(r => setTimeout(r, 100));
    }
    return [...cell.node.querySelectorAll(".jp-OutputArea-output")].map(e => e.innerText);
}"""


@pytest.fixture(scope="module")
def instructor_page(lab):
    """Lesson 01's instructor version, run top to bottom once, for the two tests below (its
    explorer driven first, then Kernel > Restart)."""
    base, token, browser = lab
    return run_all(browser, base, token, "instructor", "instructor-run-all")


def readout(page) -> dict[str, str]:
    """The explorer's readout as shown on the page: label -> text."""
    cells = page.eval_on_selector_all(".ctc-float-readout td",
                                      "els => els.map(e => e.textContent)")
    return dict(zip(cells[::2], cells[1::2], strict=True))


def shows(page, bits: int, fmt, timeout: float = 30) -> dict[str, str]:
    """Wait until the readout is the reference's for ``bits``; return what is shown."""
    want = bit_readout(bits, fmt)
    deadline = time.monotonic() + timeout
    while (shown := readout(page)) != want and time.monotonic() < deadline:
        time.sleep(0.2)  # the kernel answers each click
    assert shown == want
    return shown


def test_switching_bits_shows_what_decode_gives(instructor_page) -> None:
    """Lesson 01's explorer, on the instructor version's page: a bit switched with a click (and
    one with the keyboard), and the explorer shows what the lesson's reference ``decode`` and
    ``split_bits`` give for the new pattern. Before the test below restarts the kernel."""
    page = instructor_page
    page.locator(".ctc-float-readout").scroll_into_view_if_needed()
    assert shows(page, 0x3C00, FP16)["value"] == repr(decode(0x3C00, FP16)) == "1.0"

    page.locator(".ctc-bit-6").click()  # the first mantissa bit: 1.5
    assert shows(page, 0x3E00, FP16)["value"] == repr(decode(0x3E00, FP16)) == "1.5"
    page.locator(".ctc-bit-0").focus()  # the sign bit, from the keyboard
    page.keyboard.press("Space")
    assert shows(page, 0xBE00, FP16)["category"].startswith("normal")
    page.locator(".ctc-bit-1").click()  # 01111 -> 11111: all ones, with a mantissa: NaN
    assert shows(page, 0xFE00, FP16)["category"].startswith("NaN")

    page.locator(".widget-dropdown select").select_option("fp8 E4M3")
    shows(page, 0x38, FP8_E4M3)  # 1.0 in the format picked
    assert page.locator("[class*='ctc-bit-']").count() == 8
    for bit in (1, 5, 6):  # 0 0111 000 -> 0 1111 110, the largest E4M3 number
        page.locator(f".ctc-bit-{bit}").click()
    assert shows(page, 0x7E, FP8_E4M3)["value"] == repr(decode(0x7E, FP8_E4M3)) == "448.0"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    explorer = page.locator(".ctc-float-readout").locator("xpath=..")  # menu, bits, readout
    explorer.screenshot(path=str(SCREENSHOTS / "float-explorer.png"))


def test_instructor_version_runs_top_to_bottom_without_error_with_plots(instructor_page) -> None:
    """And then Kernel > Restart, and one cell run again before the cells above it: one line
    that says the kernel restarted (the lab's kernels install the course's messages at their
    start: grader/lab/kernel_startup.py)."""
    page = instructor_page
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    said = page.eval_on_selector_all(".jp-OutputArea-output", "els => els.map(e => "
                                     "e.textContent)")
    passed = [text for text in said if "all visible checks passed" in text]
    recorded = [text for text in said if "recorded; graded when you hand in" in text]
    assert len(recorded) == 1  # the graded prediction: recorded, never said to pass
    assert len(passed) + len(recorded) == len(points(nbformat.read(LESSON.notebook,
                                                                   as_version=4)))
    assert page.locator(".jp-RenderedImage img").count() >= 2
    nb = read_notebook(LESSON.notebook)
    index = next(i for i, c in enumerate(nb.cells)
                 if c.metadata.get("nbgrader", {}).get("grade_id") == "test-decode")
    [shown] = page.evaluate(RESTART_AND_RUN, index)
    page.screenshot(path=str(SCREENSHOTS / "after-restart.png"))
    assert shown.strip() == (
        "NameError: `check` is not defined: the kernel restarted (or has just started), so the "
        "cells above have not run in it. Run the cells above first (Run > Run All Above "
        "Selected Cell), then this one"), shown
