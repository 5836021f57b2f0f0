"""The sandbox that student code runs in: what it can see, write and reach."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.grading.limits import Limits
from grader.grading.sandbox import sandbox_argv, sandbox_uid

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not any(
        (Path(d) / "bwrap").exists() for d in os.environ.get("PATH", "").split(os.pathsep)),
    reason="the sandbox needs bubblewrap (make test installs it where it can)")

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, os, socket, sys
report = {"uid": os.getuid(), "env": sorted(os.environ)}
for path in [REPO, REPO + "/solutions", REPO + "/notebooks", COURSE, COURSE + "/gradebook.db",
             "/root", os.getcwd()]:
    try:
        report[path] = sorted(os.listdir(path))
    except OSError as error:
        report[path] = type(error).__name__
for path in ["/usr/pwned", sys.prefix + "/pwned", REPO + "/pwned", COURSE + "/pwned",
             "/tmp/ok", os.getcwd() + "/ok", "/run/ctc/ok", "/run/pwned"]:
    try:
        with open(path, "w") as handle:
            handle.write("x")
        report["write " + path] = "written"
    except OSError as error:
        report["write " + path] = type(error).__name__
try:
    with open("/tmp/big", "wb") as handle:
        handle.write(b"x" * (FILE_LIMIT + 1))
    report["big file"] = "written"
except OSError as error:
    report["big file"] = type(error).__name__
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    report["network"] = "reached"
except OSError as error:
    report["network"] = type(error).__name__
children = 0
try:
    for _ in range(2000):
        pid = os.fork()
        if pid == 0:
            import time
            time.sleep(3)
            os._exit(0)
        children += 1
except OSError as error:
    report["forks"] = [children, type(error).__name__]
try:
    hog = bytearray(MEMORY_LIMIT)
    report["memory"] = "allocated"
except MemoryError:
    report["memory"] = "MemoryError"
print(json.dumps(report))
"""


def run_in_sandbox(tmp_path: Path, code: str) -> dict:
    course = tmp_path / "course"
    course.mkdir()
    (course / "gradebook.db").write_text("secret")
    data = tmp_path / "hardware.json"
    data.write_text("{}")
    limits = Limits(memory_bytes=2 * 2**30, file_bytes=2**20, processes=64)
    code = (code.replace("REPO", repr(str(REPO))).replace("COURSE", repr(str(course)))
            .replace("FILE_LIMIT", str(limits.file_bytes))
            .replace("MEMORY_LIMIT", str(limits.memory_bytes)))
    with sandbox_uid() as uid:
        argv = sandbox_argv([sys.executable, "-c", code], [], Path("/tmp/work"), [data],
                            uid, limits)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "JPY_PARENT_PID": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_student_code_sees_no_course_files_and_writes_only_its_scratch(tmp_path) -> None:
    report = run_in_sandbox(tmp_path, PROBE)
    assert report[str(REPO)] == [".venv"]  # the environment, and nothing else of the repo
    for hidden in ("/solutions", "/notebooks"):
        assert report[str(REPO) + hidden] == "FileNotFoundError"
    course = str(tmp_path / "course")
    assert report[course] == "FileNotFoundError"
    assert report[course + "/gradebook.db"] == "FileNotFoundError"
    assert report["/tmp/work"] == ["hardware.json"]  # only the lesson's own data files
    for path, outcome in report.items():
        if path.startswith("write "):
            writable = path.endswith(("/tmp/ok", "/tmp/work/ok", "/run/ctc/ok"))
            assert (outcome == "written") == writable, (path, outcome)
    assert not (REPO / "pwned").exists() and not (tmp_path / "course" / "pwned").exists()


def test_student_code_is_limited_and_offline(tmp_path) -> None:
    report = run_in_sandbox(tmp_path, PROBE)
    assert report["network"] == "OSError" or report["network"].endswith("Error")
    assert report["network"] != "reached"
    assert report["big file"] != "written"
    assert report["memory"] == "MemoryError"
    assert "JPY_PARENT_PID" not in report["env"]
    if os.geteuid() == 0:  # processes are limited per uid, and only a root grader owns one
        assert report["uid"] >= 64000
        assert report["forks"][0] < 64 and report["forks"][1] == "BlockingIOError"


FONTS = r"""
import json, os, subprocess
ran = []
real_run = subprocess.run
def watched(*args, **kwargs):
    ran.append(str(args[0][0] if args and args[0] else ""))
    return real_run(*args, **kwargs)
subprocess.run = watched
subprocess.check_output = lambda *args, **kwargs: ran.append(str(args[0][0])) or b""
import matplotlib.font_manager as fm
folder = os.environ["MPLCONFIGDIR"]
report = {"fonts": len(fm.fontManager.ttflist), "ran": ran, "listed": sorted(os.listdir(folder))}
for name in report["listed"]:
    try:
        open(os.path.join(folder, name), "a").close()
        report["change " + name] = "changed"
    except OSError as error:
        report["change " + name] = type(error).__name__
with open(os.path.join(folder, "mine"), "w") as handle:
    handle.write("x")
report["own file"] = "written"
print(json.dumps(report))
"""


def test_matplotlib_finds_the_machines_font_list_ready_and_cannot_change_it(tmp_path) -> None:
    """The list is made once by the grader (grader/grading/sandbox.py, matplotlib_fonts): a
    kernel neither runs fc-list nor reads every font file again, its MPLCONFIGDIR stays its own
    to write in, and the shared list is read-only."""
    from grader.grading.sandbox import matplotlib_fonts

    if not matplotlib_fonts():
        pytest.skip("matplotlib could not list this machine's fonts")
    report = run_in_sandbox(tmp_path, FONTS)
    assert report["fonts"] > 0 and report["ran"] == [], report
    lists = [name for name in report["listed"] if name.startswith("fontlist-")]
    assert lists and all(report["change " + name] != "changed" for name in lists), report
    assert report["own file"] == "written"


def test_a_process_that_grades_many_keeps_no_kernels_resources() -> None:
    """Each kernel's zmq context (an I/O thread, sockets and a dozen descriptors) is closed
    with the kernel: a grader that kept them ran out of file descriptors a few hundred
    submissions into a class (13 descriptors and a thread a kernel)."""
    import asyncio
    import threading

    import nbformat

    from grader.grading.kernel import Clock, Kernels

    limits = Limits(cell_seconds=60, notebook_seconds=120)

    async def run_a_cell(uid: int | None) -> None:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 6 * 7\nx")])
        kernels = Kernels([], uid, limits, True, Clock(limits), lambda _: None)
        async with kernels.open(nb, first=True) as (client, _, _):
            await client.async_execute_cell(nb.cells[0], 0)
        assert nb.cells[0].outputs[0]["data"]["text/plain"] == "42"

    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/fd")), threading.active_count()

    with sandbox_uid() as uid:
        asyncio.run(run_a_cell(uid))  # the first loads what stays (modules, zmq's own)
        before = counts()
        for _ in range(3):
            asyncio.run(run_a_cell(uid))
        after = counts()
    assert after[0] <= before[0] + 2 and after[1] <= before[1], (before, after)
