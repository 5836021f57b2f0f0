"""The course on a real JupyterHub (deploy/hub/), end to end, with real system users.

A hub started from deploy/hub/jupyterhub_config.py (only its authenticator, ports and paths
changed) serves two students and an instructor, each a system user created for this test. The
instructor releases lesson 01 to nbgrader's exchange with ``python -m grader``. Each student, in
headless Chromium, logs in, opens the Assignment List from the Nbgrader menu, fetches the lesson,
answers one exercise (one correctly, one wrongly; the first presses Validate), and submits.
The instructor collects,
autogrades and releases feedback; each student fetches their feedback and sees their own score.
This proves that the per-role config folders give students the Assignment List, that the
exchange's permissions let submissions in as the students and out to the instructor, and that
feedback goes back to the right student. Screenshots: build/screenshots/hub-*.png.

Needs root (to create users), Debian's chromium, ``make setup``'s .venv/hub/ and
configurable-http-proxy, and a repository other users can read.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from grader.content.lessons import load_lesson
from tests.grading_helpers import graded_prediction, grader, points, read_notebook
from tests.servers import free_port

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "build" / "screenshots"
HUB_CONFIG = REPO / "deploy" / "hub" / "jupyterhub_config.py"
HUB_VENV = REPO / ".venv" / "hub"  # on Debian's Python, which other users can run
PROXY = REPO / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
JUPYTERHUB = Path(sys.executable).parent / "jupyterhub"
LESSON, NOTEBOOK = "01_float_formats", "float_formats.ipynb"
EXERCISE = "machine_epsilon"  # one short function, graded alone
ANSWERS = {  # the exercise's whole cell, as each student writes it
    "right": 'def machine_epsilon(fmt: FloatFormat) -> float:\n'
             '    return math.ldexp(1.0, -fmt.mantissa_bits)\n',
    "wrong": 'def machine_epsilon(fmt: FloatFormat) -> float:\n'
             '    return 2.0 ** -fmt.exponent_bits\n',
}
SPAWN_TIMEOUT_MS = 180_000  # the first start of a lab server on a busy 2-core machine

pytestmark = [
    pytest.mark.slow, pytest.mark.xdist_group("hub"),
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="creates system users: needs root"),
    pytest.mark.skipif(not all(shutil.which(tool) for tool in ("useradd", "userdel", "runuser")),
                       reason="needs useradd, userdel and runuser"),
    pytest.mark.skipif(not PROXY.exists(), reason=f"needs configurable-http-proxy at {PROXY} "
                       "(make setup installs it where npm is)"),
    pytest.mark.skipif(not (HUB_VENV / "bin" / "jupyterhub-singleuser").exists(),
                       reason=f"needs {HUB_VENV} (make setup builds it when run as root)"),
]


@pytest.fixture(scope="module")
def users():
    """Two students and an instructor, system users with names of this run; removed after."""
    prefix = "ctc" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
    names = {"right": prefix + "s1", "wrong": prefix + "s2", "instructor": prefix + "in"}
    created = []
    try:
        for name in names.values():
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True,
                           capture_output=True)
            created.append(name)
        needed = [("-r", HUB_CONFIG.parent / "student" / "nbgrader_config.py"),
                  ("-x", HUB_VENV / "bin" / "jupyterhub-singleuser"),
                  ("-x", (HUB_VENV / "bin" / "python").resolve())]
        for test, path in needed:
            if subprocess.run(["runuser", "-u", names["right"], "--", "test", test, str(path)],
                              cwd="/").returncode != 0:
                pytest.skip(f"other users cannot read or run {path}: the hub's users cannot "
                            "run the course's server from this checkout")
        yield names
    finally:
        for name in created:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            subprocess.run(["userdel", "-r", name], capture_output=True)


@contextlib.contextmanager
def running_hub(folder: Path, users: dict[str, str], exchange: Path):
    """JupyterHub from deploy/hub/ on loopback, for the block; yields its URL and password."""
    password = secrets.token_urlsafe(12)
    port, hub_port, api_port = free_port(), free_port(), free_port()
    users_file = folder / "users.txt"
    users_file.write_text("".join(f"{'instructor' if role == 'instructor' else 'student'} "
                                  f"{name}\n" for role, name in users.items()))
    config = folder / "test_config.py"
    # Only what a test needs differs from deploy/hub/: a password every user shares, ports,
    # where state goes, and window.jupyterapp exposed for the test to drive the lab.
    config.write_text(f"""\
c = get_config()  # noqa: F821
load_subconfig({str(HUB_CONFIG)!r})  # noqa: F821
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.ConfigurableHTTPProxy.pid_file = {str(folder / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{folder / 'hub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(folder / "cookie_secret")!r}
c.JupyterHub.pid_file = {str(folder / "hub.pid")!r}
c.Spawner.args = ["--LabApp.expose_app_in_browser=True"]
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
""")
    env = {**os.environ, "CTC_VENV": str(HUB_VENV), "CTC_EXCHANGE": str(exchange),
           "CTC_USERS_FILE": str(users_file), "CTC_COURSE_DIR": str(folder / "course"),
           "PATH": f"{JUPYTERHUB.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = folder / "hub.log"
    with log.open("w") as out:
        hub = subprocess.Popen([str(JUPYTERHUB), "-f", str(config)], cwd=folder, env=env,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with (contextlib.suppress(OSError),
                  urllib.request.urlopen(f"{base}/hub/health", timeout=2) as answer):
                if answer.status == 200:
                    break
            if hub.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the hub did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield base, password
    except Exception:
        print(f"--- hub log ({log}) ---\n{log.read_text()}")
        raise
    finally:
        hub.send_signal(signal.SIGTERM)  # stops the users' servers and the proxy too
        try:
            hub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((folder / "proxy.pid").read_text()), signal.SIGKILL)


@pytest.fixture(scope="module")
def hub(users):
    """A hub, its exchange and the instructor's course folder, all under a fresh /tmp folder:
    pytest's own tmp folders are closed to other users."""
    folder = Path(tempfile.mkdtemp(prefix="ctc-hub-"))
    folder.chmod(0o755)
    exchange = folder / "exchange"
    exchange.mkdir()
    exchange.chmod(0o1777)  # as deploy/hub/README.md says: every user writes, none renames
    try:
        with running_hub(folder, users, exchange) as (base, password):
            yield base, password, exchange, folder / "course"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def server_environment(user: str) -> dict[str, str]:
    """The environment of ``user``'s single-user server, as its process holds it."""
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and proc.stat().st_uid == uid \
                    and b"jupyterhub-singleuser" in (proc / "cmdline").read_bytes():
                pairs = (proc / "environ").read_bytes().split(b"\0")
                return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
    raise AssertionError(f"no server of {user} is running")


def log_in(browser, base: str, name: str, password: str):
    """A page in a browser context of the user's own, logged in, with JupyterLab loaded."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{base}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{name}/lab**", timeout=SPAWN_TIMEOUT_MS)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell",
                           timeout=SPAWN_TIMEOUT_MS)
    page.evaluate("() => window.jupyterapp.restored")
    return page


NBGRADER_COMMANDS = """() => Object.fromEntries(
    ["assignment-list", "formgrader", "create-assignment", "course-list"].map(
        name => [name, window.jupyterapp.commands.hasCommand(`nbgrader:open-${name}`)]))"""
STUDENT_PANELS = {"assignment-list": True, "formgrader": False, "create-assignment": False,
                  "course-list": False}


def open_assignment_list(page, answer: str) -> list[str]:
    """As a student finds it: the Nbgrader menu, then Assignment List. Returns the menu's
    visible items."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    items = page.locator(".lm-Menu-content .lm-Menu-item:visible .lm-Menu-itemLabel")
    items.first.wait_for()
    page.screenshot(path=SCREENSHOTS / f"hub-student-{answer}-menu.png")
    labels = items.all_inner_texts()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    page.wait_for_selector("#released_assignments_list")
    return labels


def assignment_row(page, section: str):
    """The lesson's row in a section of the Assignment List (released, fetched, submitted)."""
    return page.locator(f"#{section}_assignments_list .list_item", has_text=LESSON).first


ANSWER_JS = """async ({path, exercise, source}) => {
    const app = window.jupyterapp;
    const panel = await app.commands.execute("docmanager:open", {path});
    await panel.context.ready;
    const cell = panel.content.model.sharedModel.cells.find(
        c => c.getSource().includes(`def ${exercise}(`)
             && c.getSource().includes("raise NotImplementedError"));
    cell.setSource(source);
    app.shell.activateById(panel.id);
    await app.commands.execute("docmanager:save");
    const saved = await app.serviceManager.contents.get(path, {content: true});
    return saved.content.cells.some(c => c.source === source);
}"""

FEEDBACK_JS = """async (folder) => {
    const contents = window.jupyterapp.serviceManager.contents;
    const stamps = (await contents.get(folder)).content.filter(f => f.type === "directory");
    const files = (await contents.get(stamps[0].path)).content;
    return files.find(f => f.name.endsWith(".html")).path;
}"""


def validate(page) -> None:
    """The notebook's Validate button: the course's summary, one exercise done."""
    page.locator(".jp-NotebookPanel:visible").first.wait_for()
    assert page.get_by_role("button", name="Validate").count() == 1  # the course's alone
    page.get_by_role("button", name="Validate").first.click()
    page.wait_for_selector(".jp-Dialog .ctc-validate-headline", timeout=180_000)
    dialog = page.wait_for_selector(".jp-Dialog")
    page.screenshot(path=SCREENSHOTS / "hub-student-right-validate.png")
    exercises = points(read_notebook(REPO / "notebooks" / LESSON / NOTEBOOK))
    prediction = graded_prediction(load_lesson(LESSON))  # counted apart: graded at hand-in
    checked = {k: v for k, v in exercises.items() if k != prediction}
    text = dialog.text_content()
    assert (f"1 of {len(checked)} exercises pass their visible checks "
            f"(1 of {sum(checked.values()):g} points). Your graded prediction, {prediction}, "
            "is still to do") in text, text
    page.keyboard.press("Escape")
    page.wait_for_selector(".jp-Dialog", state="detached")


def fetch_answer_submit(page, answer: str) -> None:
    """Fetch the lesson, answer the exercise (``answer``: right or wrong), submit."""
    assert page.evaluate(NBGRADER_COMMANDS) == STUDENT_PANELS
    assert open_assignment_list(page, answer) == ["Assignment List"]
    row = assignment_row(page, "released")
    row.locator("button", has_text="Fetch").click()
    assignment_row(page, "fetched").wait_for(timeout=60_000)
    page.screenshot(path=SCREENSHOTS / f"hub-student-{answer}-fetched.png")
    saved = page.evaluate(ANSWER_JS, {"path": f"{LESSON}/{NOTEBOOK}", "exercise": EXERCISE,
                                      "source": ANSWERS[answer]})
    assert saved, "the answer did not reach the saved notebook"
    if answer == "right":  # Validate runs in the student's own server, with the course's env
        validate(page)
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrader-assignment-list')")
    assignment_row(page, "fetched").locator("button", has_text="Submit").click()
    assignment_row(page, "submitted").wait_for(timeout=60_000)
    page.screenshot(path=SCREENSHOTS / f"hub-student-{answer}-submitted.png")


def fetch_feedback(page, base: str, name: str, answer: str) -> str:
    """Fetch Feedback in the Assignment List; the fetched page's text, read in the browser."""
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrader-assignment-list')")
    page.click("#refresh_assignments_list")
    row = assignment_row(page, "submitted")
    row.locator("button", has_text="Fetch Feedback").click()
    row.get_by_text("view feedback").wait_for(timeout=60_000)
    page.screenshot(path=SCREENSHOTS / f"hub-student-{answer}-feedback-fetched.png")
    html = page.evaluate(FEEDBACK_JS, f"{LESSON}/feedback")
    feedback = page.context.new_page()
    feedback.goto(f"{base}/user/{name}/files/{html}")
    feedback.screenshot(path=SCREENSHOTS / f"hub-student-{answer}-feedback.png", full_page=False)
    text = feedback.inner_text("body")
    feedback.close()
    return text


def test_students_fetch_submit_and_get_their_own_feedback_through_the_hub(browser, users, hub):
    base, password, exchange, course = hub
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    grader("--course-dir", course, "release", LESSON, "--exchange", exchange)

    students = {answer: users[answer] for answer in ("right", "wrong")}
    instructor = log_in(browser, base, users["instructor"], password)
    assert all(instructor.evaluate(NBGRADER_COMMANDS).values())  # every nbgrader panel
    instructor.context.close()
    pages = {}
    for answer, name in students.items():
        pages[answer] = log_in(browser, base, name, password)
        # The user's server holds their own draws, for their hub user name, and no key.
        from grader.content.variants import course_key, lab_variants

        given = server_environment(name).get("CTC_VARIANTS", "")
        assert json.loads(given) == json.loads(lab_variants(course_key(course), name)), given
        assert json.loads(given)["student"] == name
        fetch_answer_submit(pages[answer], answer)

    # Each submission in the exchange belongs to the student who made it: what lets collect
    # check that a submission's owner is the student it names.
    inbound = exchange / "counting-the-cost" / "inbound"
    owners = {path.name.split("+")[0]: path.owner() for path in inbound.iterdir()}
    assert owners == {name: name for name in students.values()}, owners

    grader("--course-dir", course, "collect", LESSON)
    grader("--course-dir", course, "autograde", LESSON, "--collected")
    grader("--course-dir", course, "feedback", LESSON, "--exchange")
    grader("--course-dir", course, "export", "--csv", course / "grades.csv")
    with (course / "grades.csv").open(newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)
                if row["lesson"] == LESSON}
    assert set(rows) == set(students.values()), rows
    full = points(read_notebook(REPO / "notebooks" / LESSON / NOTEBOOK))[EXERCISE]
    exercise = {a: float(rows[students[a]][f"{LESSON}/{EXERCISE}"]) for a in students}
    assert exercise == {"right": full, "wrong": 0.0}, rows
    totals = {a: float(rows[students[a]]["score"]) for a in students}
    assert totals["right"] - totals["wrong"] == full, rows  # nothing else differs

    for answer, name in students.items():
        text = fetch_feedback(pages[answer], base, name, answer)
        other = "wrong" if answer == "right" else "right"
        max_score = float(rows[name]["max_score"])
        total_line = f"{Path(NOTEBOOK).stem} (Score: {{:.1f}} / {max_score:.1f})"
        assert total_line.format(totals[answer]) in text, text[:2000]
        assert total_line.format(totals[other]) not in text
        assert ANSWERS[answer].splitlines()[1].strip() in text  # their own code, not the other's
        assert ANSWERS[other].splitlines()[1].strip() not in text
        pages[answer].context.close()
    print(f"hub test: {time.monotonic() - started:.0f} s from release to feedback")
