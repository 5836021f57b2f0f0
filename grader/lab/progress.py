"""``python -m grader progress``: which exercises of the student's own copies pass their checks.

Each lesson of the workspace runs as Validate runs it (grader/lab/validate.py: nbgrader's
validator in a process of its own, the demos shrunk), two lessons at a time on a machine with
two cores or more, and each exercise is listed: passes, fails (with the one line that says
why), to do, or, for a graded prediction, in (graded when handed in: its point is in no
total), and a lesson whose saved numbers are not the student's says what to re-run. A lesson's
lines are
printed as soon as it and the lessons before it are done. The student's files are read, never
written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from grader.common.machine import usable_cores
from grader.grading.sandbox import NO_FIGURE_FORMATS
from grader.lab.validate import HIDDEN_NOTE, REPLY_MARK, Exercise

LESSON_LIMIT_SECONDS = 10 * 60


def execute(nb: nbformat.NotebookNode, folder: Path, mode: str | None, timeout: int,
            env: dict[str, str] | None = None, **options) -> None:
    """Run ``nb`` top to bottom in a fresh kernel working in ``folder``, its outputs kept in
    ``nb``. NBGRADER_EXECUTION is ``mode`` meanwhile, as nbgrader sets it ("validate",
    "autograde": the lessons' demos then do less work, and figures are made but not drawn, as
    Validate and the grader make them), or unset for None; ``env`` is added to the kernel's
    environment (a student's ``CTC_VARIANTS``). ``options`` go to nbclient's
    ``NotebookClient``."""
    if mode is not None:
        options.setdefault("extra_arguments", [NO_FIGURE_FORMATS])
    previous = os.environ.pop("NBGRADER_EXECUTION", None)
    if mode is not None:
        os.environ["NBGRADER_EXECUTION"] = mode
    try:
        with tempfile.TemporaryDirectory(prefix="ctc-kernel-") as sockets:
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                    resources={"metadata": {"path": str(folder)}}, **options)
            # The kernel's sockets as files of our own rather than TCP ports on loopback: no
            # other local user can connect, and ipykernel has no "unencrypted TCP" to warn of.
            client.km = client.create_kernel_manager()
            client.km.transport, client.km.ip = "ipc", os.path.join(sockets, "kernel")
            client.execute(**({"env": {**os.environ, **env}} if env else {}))
    finally:
        os.environ.pop("NBGRADER_EXECUTION", None)
        if previous is not None:
            os.environ["NBGRADER_EXECUTION"] = previous


def validate_reply(notebook: Path, env: dict[str, str] | None = None) -> dict:
    """Validate's reply for one notebook (grader/lab/validate.py's ``main``, in a child
    process with ``env`` added to its environment: its kernel's messages stay out of the
    student's terminal)."""
    try:
        done = subprocess.run([sys.executable, "-m", "grader.lab.validate", str(notebook)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=LESSON_LIMIT_SECONDS, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"success": False, "value": f"stopped after {LESSON_LIMIT_SECONDS // 60} "
                                           "minutes: a cell does not finish"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(REPLY_MARK):
            return json.loads(line.removeprefix(REPLY_MARK))
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return {"success": False, "value": f"could not run the notebook ({last[:300]})"}


def report(reply: dict) -> list[str]:
    """A lesson's lines: the headline, then each exercise."""
    if not reply["success"]:
        return [reply["value"]]
    answer = reply["value"]
    lines = [answer["headline"].split(" Hand in ")[0]
             + (f" {answer['numbers']}" if answer.get("numbers") else "")]
    if answer.get("saved_numbers"):
        lines.append(answer["saved_numbers"])
    if answer["changed"]:
        lines.append("locked cells you changed (grading uses the course's): "
                     + "; ".join(answer["changed"]))
    return lines + [Exercise(**e).line().strip() for e in answer["exercises"]]


def progress(workspace: Path, lessons: list, log=print, jobs: int | None = None,
             env: dict[str, str] | None = None) -> int:
    """Print each lesson's progress as it comes, each run with ``env`` (the student's
    variants); exit status 0 (it reports, it does not judge)."""
    jobs = jobs or min(2, usable_cores())
    started = [(lesson, workspace / lesson.name / lesson.notebook.name) for lesson in lessons]
    say = (lambda line: log(line, flush=True)) if log is print else log
    say(f"Running your copies in {workspace} as Validate does, {jobs} at a time "
        f"(each takes a few seconds)...\n")
    with ThreadPoolExecutor(jobs) as pool:
        replies = [(lesson, notebook, pool.submit(_timed, notebook, env) if notebook.exists()
                    else None) for lesson, notebook in started]
        for lesson, _notebook, future in replies:
            if future is None:
                say(f"{lesson.name}: not started (`make lab` makes your copy)\n")
                continue
            reply, seconds = future.result()
            lines = report(reply)
            say(f"{lesson.name} ({seconds:.0f} s): {lines[0]}")
            for line in lines[1:]:
                say(f"  {line}")
            say("")
    say(HIDDEN_NOTE)
    return 0


def _timed(notebook: Path, env: dict[str, str] | None) -> tuple[dict, float]:
    start = time.perf_counter()
    return validate_reply(notebook, env), time.perf_counter() - start
