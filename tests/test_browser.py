"""The course in a real browser: JupyterLab in headless Chromium, driven by Playwright.

A student opens the released lesson, runs all cells and sees nbgrader's Validate button; the
only errors on the page are the "not implemented yet" of unanswered exercises. An instructor
runs the instructor version top to bottom: no error, plots drawn. Screenshots are saved in
build/screenshots/ for the test log.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from grader.course import Course
from grader.lab import lab_environment, running_lab
from grader.lessons import all_lessons, load_lesson
from tests.grading_helpers import points

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


@contextlib.contextmanager
def lab_over(tmp: Path, folders: dict[str, Path], course: Course | None = None):
    """A lab server (for the length of the block) over copies of ``folders`` (name: folder)
    in ``tmp``/root, with the course's lab settings; yields its base URL and token."""
    course = course or Course(tmp / "course", log=lambda _: None)
    for name, folder in folders.items():
        shutil.copytree(folder, tmp / "root" / name)
    with running_lab(tmp / "root", lab_environment(course), 0,
                     "--LabApp.expose_app_in_browser=True") as (base, token):
        yield base, token


@pytest.fixture(scope="module")
def lab_all(tmp_path_factory, browser):
    """A lab server over every lesson's instructor version."""
    folders = {lesson.name: lesson.folder for lesson in all_lessons()}
    with lab_over(tmp_path_factory.mktemp("browser-all"), folders) as (base, token):
        yield base, token, browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory, browser):
    """A lab server over two folders: the student version and the instructor version."""
    tmp = tmp_path_factory.mktemp("browser")
    course = Course(tmp / "course", log=lambda _: None)
    folders = {"student": course.release(LESSON), "instructor": LESSON.folder}
    with lab_over(tmp, folders, course) as (base, token):
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


def test_student_runs_all_and_sees_validate_and_only_not_implemented_errors(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, "student", "student-run-all")
    assert page.get_by_role("button", name="Validate").first.is_visible()
    errors = [e for e in error_texts(page) if "CheckFailed" in e or "Error" in e]
    assert errors, "the unanswered exercises should report themselves"
    assert all("not implemented yet" in e for e in errors), errors[:2]
    assert all(len(e.strip().splitlines()) == 1 for e in errors), errors[:2]  # one line each
    page.get_by_role("button", name="Validate").first.click()
    dialog = page.wait_for_selector(".jp-Dialog", timeout=120_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "student-validate.png"))
    text = dialog.text_content()
    exercises = points(nbformat.read(LESSON.notebook, as_version=4))
    assert (f"0 of {len(exercises)} exercises pass their visible checks "
            f"(0 of {sum(exercises.values()):g} points)") in text
    assert "not done yet" in text and "Hidden checks also run" in text
    assert "Traceback" not in text  # one line per exercise, no scroll of tracebacks


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


@pytest.mark.parametrize("lesson", all_lessons(), ids=lambda lesson: lesson.name)
def test_every_plot_fits_a_1280_by_720_window(lab_all, lesson) -> None:
    """Each plot of the instructor version, as JupyterLab shows it in a 1280×720 window with
    the file browser open: no wider than the output area, and a whole figure on screen
    (tests/test_plots.py checks the same from the figures themselves, and their text)."""
    base, token, browser = lab_all
    page = run_all(browser, base, token, lesson.name, f"plots-{lesson.name}",
                   notebook=lesson.notebook.name, viewport=(1280, 720))
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


def test_instructor_version_runs_top_to_bottom_without_error_with_plots(lab) -> None:
    base, token, browser = lab
    page = run_all(browser, base, token, "instructor", "instructor-run-all")
    assert [e for e in error_texts(page) if "Traceback" in e or "Error" in e] == []
    passed = page.eval_on_selector_all(".jp-OutputArea-output", "els => els.filter(e => "
                                       "e.textContent.includes('all visible checks passed'))"
                                       ".length")
    assert passed == len(points(nbformat.read(LESSON.notebook, as_version=4)))
    assert page.locator(".jp-RenderedImage img").count() >= 2
