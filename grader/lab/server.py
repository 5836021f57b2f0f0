"""The student's way in: their own copies of the lessons, opened in JupyterLab.

``workspace/LESSON/`` holds the student version of each lesson. A lesson is copied there once;
after that the student's edits are never overwritten. ``--smoke`` starts the same server
headless, checks that it lists every lesson, that nbgrader's Validate extension is loaded and
answers, and stops it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.text import valid_student_id
from grader.content.lessons import REPO, Lesson, all_lessons
from grader.content.notebook_checks import SET_YOUR_ID
from grader.content.variants import ENV, code_variants, kernel_variants, lab_variants
from grader.course import Course
from grader.lab.numbers import saved_numbers_problem

DEFAULT_WORKSPACE = REPO / "workspace"
START_TIMEOUT_SECONDS = 90
# Students get the course's Validate button (grader/lab/labextension/, in place of nbgrader's,
# whose dialog fails when everything passes) and nothing of nbgrader's instructor side (the
# Create Assignment panel edits cell types; formgrader, course and assignment lists need an
# exchange folder the course does not use), and no news pop-up.
HIDDEN_LAB_PLUGINS = ["@jupyter/nbgrader:menu", "@jupyter/nbgrader:course-list",
                      "@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:validate-assignment",
                      "@jupyterlab/apputils-extension:announcements"]
# The course's Validate button, built (grader/lab/labextension/README.md) and committed.
LAB_EXTENSIONS = Path(__file__).resolve().parent / "labextension" / "share" / "labextensions"
VALIDATE_PLUGIN = "counting-the-cost-validate"
# Validate is answered by grader/lab/validate.py: nbgrader's validator, the summary first.
SERVER_EXTENSIONS = {"nbgrader.server_extensions.formgrader": False,
                     "nbgrader.server_extensions.course_list": False,
                     "nbgrader.server_extensions.assignment_list": False,
                     "nbgrader.server_extensions.validate_assignment": False,
                     "grader.lab.validate": True}
BUTTON_SOURCES = ["index.js", "style/index.css", "package.json", "package-lock.json"]
# Run by the lab's kernels before any cell: the notebooks' one-line messages survive a restart.
KERNEL_STARTUP = Path(__file__).resolve().parent / "kernel_startup.py"


def button_sources() -> str:
    """The SHA-256 of the Validate button's sources, as ``make labextension`` records it beside
    the build it made (``built-from.txt``): a test compares, so a change to the sources without
    a new build fails."""
    folder = LAB_EXTENSIONS.parent.parent
    digest = hashlib.sha256()
    for name in BUTTON_SOURCES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


STUDENT_FILE = ".student"  # in the workspace: the id the student's numbers are drawn for
VERSIONS = ".course-versions.json"  # in the workspace: which release each copy was made from
AS_COPIED = "#as-copied"  # a VERSIONS key's suffix: the digest of the copy the lab wrote


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def student_copy(file: Path) -> bytes:
    """The bytes of the student's copy of a released file: a notebook's ``language_info`` set
    to what this lab's kernels report (ipykernel's, for this Python), or JupyterLab sets it when
    the kernel starts and shows the notebook as changed, unsaved, before the student did
    anything; any other file as it is."""
    if file.suffix != ".ipynb":
        return file.read_bytes()
    import nbformat
    from ipykernel.ipkernel import IPythonKernel

    nb = nbformat.reads(file.read_text(), as_version=4)
    nb.metadata["language_info"] = dict(IPythonKernel.language_info)
    return (nbformat.writes(nb) + "\n").encode()


def prepare_workspace(course: Course, workspace: Path, lessons: list[Lesson]) -> None:
    """Release what changed, then copy each lesson's student files the student does not have.

    The workspace remembers which release each copy came from, so that a student hears of a
    newer version of the course's file only when the course really changed it."""
    workspace.mkdir(parents=True, exist_ok=True)
    record_path = workspace / VERSIONS
    try:
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
    except ValueError:
        record = {}
    for lesson in lessons:
        released = course.root / "release" / lesson.name / lesson.notebook.name
        if not released.exists() or released.stat().st_mtime < lesson.notebook.stat().st_mtime:
            course.log(f"releasing {lesson.name}")
            course.release(lesson)
        source = course.root / "release" / lesson.name
        for file in sorted(source.rglob("*")):
            if not file.is_file():
                continue
            name = str(file.relative_to(source.parent))
            target = workspace / name
            digest, copy = _digest(file), student_copy(file)
            copied = f"{name}{AS_COPIED}"  # the digest of the copy as written, beside the release's
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(copy)
                course.log(f"new: {name}")
            elif record.get(name, digest) != digest:  # the course changed it since the copy
                if _digest(target) in (record[name], record.get(copied)):  # the student did not:
                    target.write_bytes(copy)  # take the new one
                    course.log(f"updated: {name}")
                elif target.read_bytes() not in (file.read_bytes(), copy):
                    course.log(f"kept your {name}; the course has a newer version of it "
                               f"(`python -m grader lab --reset {lesson.name}` takes it, and "
                               "keeps yours beside it)")
                    continue
            if _digest(target) == hashlib.sha256(copy).hexdigest():
                record[copied] = _digest(target)
            record[name] = digest
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True))


def reset_lessons(course: Course, workspace: Path, lessons: list[Lesson]) -> None:
    """Set the student's copy of each lesson aside and start again from the course's."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record_path = workspace / VERSIONS
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for lesson in lessons:
        mine = workspace / lesson.name
        if mine.exists():
            kept = workspace / f"{lesson.name}.before-reset-{stamp}"
            mine.rename(kept)
            course.log(f"your copy of {lesson.name} is now {kept.relative_to(workspace)}")
        record = {k: v for k, v in record.items() if not k.startswith(f"{lesson.name}/")}
    if workspace.exists():
        record_path.write_text(json.dumps(record, indent=1, sort_keys=True))


def lab_command(workspace: Path, *options: str) -> list[str]:
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}", *options]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI run as root
        command.append("--allow-root")
    return command


def lab_environment(course: Course) -> dict[str, str]:
    """The environment for the lab server: our config folder first on JUPYTER_CONFIG_PATH."""
    config = course.root / "lab-config"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": dict.fromkeys(HIDDEN_LAB_PLUGINS, True)}, indent=1))
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": SERVER_EXTENSIONS},
         "LabApp": {"extra_labextensions_path": [str(LAB_EXTENSIONS)]}}, indent=1))
    env = dict(os.environ)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in (str(config), env.get("JUPYTER_CONFIG_PATH", "")) if p)
    env["PYTHONSTARTUP"] = str(KERNEL_STARTUP)  # every kernel, at its start and each restart
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, token: str, data: dict | None = None) -> bytes:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


@contextlib.contextmanager
def running_lab(root: Path, env: dict[str, str], port: int = 0,
                *options: str) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on loopback over ``root`` while in the block: (base url, token)."""
    port = port or _free_port()
    token = secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        lab_command(root, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                    f"--IdentityProvider.token={token}", *options),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                json.loads(_request(f"{base}/api/status", token))
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise CourseError("JupyterLab did not start:\n"
                                      + (server.stdout.read() if server.poll() is not None
                                         else "no answer within the time limit")) from None
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def smoke_test(workspace: Path, lessons: list[Lesson], port: int, env: dict[str, str]) -> int:
    """Start JupyterLab headless on loopback, check it serves the course, stop it."""
    with running_lab(workspace, env, port) as (base, token):
        listed = {item["name"] for item in json.loads(_request(f"{base}/api/contents", token))
                  ["content"]}
        missing = [lesson.name for lesson in lessons if lesson.name not in listed]
        if missing:
            raise CourseError(f"JupyterLab does not list {', '.join(missing)}")
        print(f"lab server answered on {base}; lessons listed: {', '.join(sorted(listed))}")
        page = _request(f"{base}/lab", token).decode()
        if f'"name": "{VALIDATE_PLUGIN}"' not in page:
            raise CourseError("the course's Validate button (grader/labextension) is not loaded")
        first = lessons[0]
        path = f"{first.name}/{first.notebook.name}"
        answer = json.loads(_request(f"{base}/counting-the-cost/validate", token,
                                     {"path": path}))
        if not answer.get("success"):
            raise CourseError(f"Validate did not run on {path}: {answer}")
        print(f"Validate button loaded; Validate ran on {path}: {answer['value']['headline']}"
              + (f" {answer['value']['numbers']}" if answer["value"].get("numbers") else ""))
        return 0


def workspace_variants(course: Course, workspace: Path, student: str | None = None,
                       code: str | None = None) -> dict[str, str]:
    """``CTC_VARIANTS`` for the lab's kernels: the student's own numbers in every lesson, for
    the id the student gave (``--student``, remembered in the workspace's ``.student``: set
    once). With the ``code`` an instructor gave them, the numbers it carries (a machine of the
    student's own, without the course's key); without one, drawn with the key of the lab's own
    course directory (the course's machine, or self-study). No id: nothing, and the lessons
    use their defaults."""
    remembered = workspace / STUDENT_FILE
    if student is not None or code is not None:
        if student is None and remembered.is_file():
            student = json.loads(remembered.read_text()).get("student")
        if student is None or not valid_student_id(student):
            raise CourseError(f"{student!r} is not a student id: letters, digits and ._@+- "
                              "(at most 100), as your course gave it to you"
                              if student is not None else "--code goes with --student ID")
        if code is not None:
            code_variants(code, student)  # refused now, before it is remembered
        workspace.mkdir(parents=True, exist_ok=True)
        remembered.write_text(json.dumps({"student": student, "code": code}) + "\n")
    elif remembered.is_file():
        try:
            given = json.loads(remembered.read_text())
            student, code = given.get("student"), given.get("code")
        except (ValueError, AttributeError):
            return {}
    if not isinstance(student, str) or not valid_student_id(student):
        return {}
    if isinstance(code, str):
        return {ENV: code_variants(code, student)}
    key = course.key(create=True)  # checked against the course's gradebook, where it has one
    return {ENV: lab_variants(key, student) if key else kernel_variants(student, {})}


def lab(course: Course, workspace: Path | None, smoke: bool = False, port: int = 0,
        reset: list[Lesson] = (), student: str | None = None, code: str | None = None) -> int:
    workspace = (workspace or DEFAULT_WORKSPACE).resolve()
    lessons = all_lessons()
    if reset:
        reset_lessons(course, workspace, list(reset))
    prepare_workspace(course, workspace, lessons)
    env = {**lab_environment(course), **workspace_variants(course, workspace, student, code)}
    if ENV in env:
        given = json.loads(env[ENV])
        if json.loads((workspace / STUDENT_FILE).read_text()).get("code"):
            print(f"your own numbers for student id {given['student']}: from your code")
        else:
            print(f"your own numbers are drawn for student id {given['student']} with this "
                  f"machine's course key ({given['course']}): your class's numbers only where "
                  "this is your course's machine. On a machine of your own, use the code your "
                  "instructor gives you (--code CODE); without one, these are for self-study.")
    else:
        print(f"No student id is set: the lessons use the course's default numbers. {SET_YOUR_ID}")
    for line in saved_numbers_lines(workspace, lessons, env.get(ENV)):
        print(line)
    if smoke:
        return smoke_test(workspace, lessons, port, env)
    print(f"opening JupyterLab in {workspace} (Ctrl-C twice to stop)")
    command = lab_command(workspace, *_workspace_options(course, "student"),
                          *([f"--port={port}"] if port else []))
    os.execve(sys.executable, command, env)
    return 0  # not reached


def saved_numbers_lines(workspace: Path, lessons: list[Lesson], variants: str | None) -> list[str]:
    """A line for each of the student's copies whose saved numbers are not the ones this lab
    gives them (``variants``, its ``CTC_VARIANTS``), saying what to re-run."""
    import nbformat

    lines = []
    for lesson in lessons:
        mine = workspace / lesson.name / lesson.notebook.name
        try:
            problem = saved_numbers_problem(nbformat.read(mine, as_version=4), variants)
        except Exception:  # not started, or not a notebook: Validate says what is wrong
            continue
        if problem:
            lines.append(f"{lesson.name}: {problem}")
    return lines


def _workspace_options(course: Course, name: str) -> list[str]:
    """JupyterLab's remembered layout (open tabs, panels) kept apart per use: the student's lab
    and each lesson's demo, so that one never reopens the other's notebooks."""
    folder = course.root / "lab-workspaces" / name
    folder.mkdir(parents=True, exist_ok=True)
    return [f"--LabApp.workspaces_dir={folder}"]


def prepare_demo(course: Course, lesson: Lesson, fresh: bool = False) -> Path:
    """The instructor version of ``lesson`` (solutions filled in) in ``<course>/demo/LESSON``.

    A copy, so that running it in class never touches notebooks/; kept between runs (with
    whatever was changed in class) unless ``fresh``.
    """
    target = course.root / "demo" / lesson.name
    if target.exists() and fresh:
        shutil.rmtree(target)
    if not target.exists():
        shutil.copytree(lesson.folder, target,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        course.log(f"instructor version of {lesson.name} copied to {target}")
    else:
        course.log(f"reopening {target} (pass --fresh for a new copy)")
    return target


def demo_command(course: Course, lesson: Lesson, target: Path, port: int = 0) -> list[str]:
    """JupyterLab over the lesson's demo copy alone, in a workspace of the lesson's own: a demo
    never reopens another lesson's notebooks, or starts their kernels."""
    return lab_command(target, f"--LabApp.default_url=/lab/tree/{lesson.notebook.name}",
                       *_workspace_options(course, f"demo-{lesson.name}"),
                       *([f"--port={port}"] if port else []))


def demo(course: Course, lesson: Lesson, fresh: bool = False, port: int = 0) -> int:
    """Open the instructor version of a lesson in JupyterLab, ready to run top to bottom."""
    target = prepare_demo(course, lesson, fresh)
    print(f"opening {lesson.name}/{lesson.notebook.name} in JupyterLab (Run > Run All Cells; "
          "Ctrl-C twice to stop)")
    os.execve(sys.executable, demo_command(course, lesson, target, port),
              lab_environment(course))
    return 0  # not reached
