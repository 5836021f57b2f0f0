"""Building submissions and running the grader's command line, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import copy
import csv
import fcntl
import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat

from tests.servers import free_port

REPO = Path(__file__).resolve().parent.parent


def grader_env() -> dict[str, str]:
    """The environment an instructor's shell has: this Python's bin folder first on PATH."""
    return {**os.environ,
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def grader_process(*args: str | Path, **popen) -> subprocess.Popen:
    """``python -m grader ARGS`` started in the background (a worker, a coordinator)."""
    return subprocess.Popen([sys.executable, "-m", "grader", *map(str, args)],
                            **{"cwd": REPO, "env": grader_env(), **popen})


# ``grader`` runs a command in the test's own process (``main``, as ``python -m grader`` calls
# it, with the instructor's PATH), so that a test worker pays the grader's imports once (torch
# and nbgrader: about 2.5 CPU s a process) rather than once per command, a few hundred CPU
# seconds a run. Kernels, sandboxes and servers are processes of their own either way. These
# run as an instructor runs them, in a process of their own: the commands that serve or watch
# (lab, progress, demo, a worker) and grading on workers (``--broker``). Grading in a process of
# its own stays tested too: tests/test_faults.py (killed at its worst moments),
# tests/test_distributed.py (graders and workers side by side), test_hostile.py's peak memory
# and refusal without bubblewrap, and test_layers' imports.
OWN_PROCESS = ("lab", "progress", "demo", "worker")


def _checked(done: subprocess.CompletedProcess[str],
             check: bool) -> subprocess.CompletedProcess[str]:
    if check and done.returncode != 0:
        raise AssertionError(f"grader {done.args} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def in_process(*args: str | Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m grader ARGS`` in this process: its exit code, what it printed (with
    ``check``, a non-zero exit fails the test)."""
    from grader.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)  # main() sets its own: the worker's comes back
    path = os.environ.get("PATH")
    os.environ["PATH"] = grader_env()["PATH"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as stopped:
                code = stopped.code if isinstance(stopped.code, int) else (
                    0 if stopped.code is None else 1)
            except Exception:  # as the interpreter would: a traceback, exit status 1
                traceback.print_exc()
                code = 1
    finally:
        signal.signal(signal.SIGTERM, handler)
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path
    return _checked(subprocess.CompletedProcess([str(a) for a in args], code or 0,
                                                out.getvalue(), err.getvalue()), check)


def grader(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m grader ARGS`` as an instructor would, from the repository root: in this
    process, but for the commands of ``OWN_PROCESS`` and grading on workers."""
    words = [str(a) for a in args]
    if words and not set(words) & {*OWN_PROCESS, "--broker"}:
        return in_process(*words, check=check)
    return _checked(subprocess.run([sys.executable, "-m", "grader", *words], cwd=REPO,
                                   env=grader_env(), capture_output=True, text=True,
                                   timeout=1200), check)


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def cell(nb: nbformat.NotebookNode, grade_id: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def points(nb: nbformat.NotebookNode) -> dict[str, float]:
    """Points of each test cell, by the name of the function it grades."""
    graded = [c.metadata.nbgrader for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    return {meta["grade_id"].removeprefix("test-"): float(meta["points"]) for meta in graded}


def submit(folder: Path, student_id: str, nb: nbformat.NotebookNode, name: str) -> None:
    (folder / student_id).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / student_id / name)


def read_export(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open(newline="") as handle:
        return {(row["student_id"], row["lesson"]): row for row in csv.DictReader(handle)}


PEAK_RSS = """
import resource, runpy, sys
sys.argv = ["grader", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("grader", run_name="__main__")
except SystemExit as done:
    code = done.code
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def grader_peak_rss(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """``grader(*args)``, and the grading process's own peak resident memory in bytes (its
    kernels, in their own processes, are not counted)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *map(str, args)], cwd=REPO,
                          env=grader_env(), capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise AssertionError(f"grader {args} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    peak = int(done.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) * 1024
    return done, peak


# For each lesson: a graded function whose wrong answer fails its visible checks and breaks no
# other exercise, and the wrong cell source (tests/test_grading.py checks every lesson has one).
WRONG_ANSWERS = {
    "01_float_formats": ("machine_epsilon",
                         "def machine_epsilon(fmt):\n    return 2.0 ** -(fmt.mantissa_bits + 1)"),
    "02_tensors_and_strides": ("broadcast_shapes",
                               "def broadcast_shapes(a, b):\n    return tuple(a)"),
    "03_matmul_flops": ("mfu", "def mfu(flops, seconds, peak_flops):\n    return flops / seconds"),
    "04_backprop_flops": ("training_days",
                          "def training_days(total_flops, n_gpus, peak_flops, mfu):"
                          "\n    return total_flops / (n_gpus * peak_flops)"),
    "05_adamw_memory": ("largest_trainable_params",
                        "def largest_trainable_params(n_gpus, gpu_bytes, bytes_per_param):"
                        "\n    return n_gpus * gpu_bytes"),
    "06_training_step": ("loss_scale_update",
                         "def loss_scale_update(scale, growth_tracker, found_inf,"
                         " growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):"
                         "\n    return scale, growth_tracker"),
    "07_many_devices": ("pipeline_bubble_fraction",
                        "def pipeline_bubble_fraction(n_stages, n_microbatches):"
                        "\n    return (n_stages - 1) / n_microbatches"),
    "08_inference": ("max_batch_size",
                     "def max_batch_size(gpu_bytes, n_params, context_len, kv_bytes_per_token,"
                     " bytes_per_param=2):"
                     "\n    return int(gpu_bytes // (context_len * kv_bytes_per_token))"),
    # the capacity factor forgotten: every expert takes the even share
    "09_experts": ("dropped_tokens",
                   "def dropped_tokens(expert_counts, capacity_factor):"
                   "\n    capacity = math.ceil(sum(expert_counts) / len(expert_counts))"
                   "\n    return sum(max(0, c - capacity) for c in expert_counts)"),
    # the PUE forgotten: energy as the GPUs alone draw it
    "10_budget": ("run_cost",
                  "def run_cost(gpu_hours, dollars_per_gpu_hour, gpu_watts, pue=1.0,"
                  " kg_co2_per_kwh=0.0):"
                  "\n    kwh = gpu_hours * gpu_watts / 1000"
                  "\n    return (gpu_hours * dollars_per_gpu_hour, kwh,"
                  " kwh * kg_co2_per_kwh / 1000)"),
}


def make_once(marker: Path, make: Callable[[], None]) -> None:
    """Call ``make`` once per test session, whichever xdist worker asks first (the others wait
    on a file lock beside ``marker``): ``make`` writes ``marker`` last, when all is made."""
    with marker.with_name(marker.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            make()


def released(lesson, shared: Path) -> Path:
    """The student version of ``lesson``, released once per test session under ``shared`` (a
    folder every xdist worker sees) by the instructor's command, ``python -m grader release``,
    and reused: a file lock lets one worker release it while the others wait. What the command
    printed is kept beside it (``released_output``). Read it, never write it: copy it first
    (``released_course``)."""
    course = shared / "release-courses" / lesson.name
    printed = shared / f"release-{lesson.name}.out"

    def release() -> None:
        shutil.rmtree(course, ignore_errors=True)
        printed.write_text(grader("release", lesson.name, "--course-dir", course).stdout)

    make_once(printed, release)
    return course / "release" / lesson.name


def released_output(lesson, shared: Path) -> str:
    """What ``python -m grader release`` printed when it released ``lesson`` for the session."""
    released(lesson, shared)
    return (shared / f"release-{lesson.name}.out").read_text()


def released_course(lessons, shared: Path, target: Path) -> Path:
    """A course directory at ``target`` with ``lessons`` released, as ``python -m grader
    release`` leaves it, copied from the releases made once per test session under ``shared``
    (a release costs seconds of nbgrader; a copy, milliseconds). One lesson: the whole course
    directory, its gradebook included. Several: their release/ folders only (what the lab
    needs), the gradebook made anew by the first command that needs one."""
    lessons = list(lessons)
    for lesson in lessons:
        released(lesson, shared)
    if len(lessons) == 1:
        shutil.copytree(shared / "release-courses" / lessons[0].name, target, symlinks=True)
    else:
        for lesson in lessons:
            shutil.copytree(released(lesson, shared), target / "release" / lesson.name)
    return target


def graded_class(lesson, shared: Path) -> dict:
    """A class of ``lesson`` graded once per test session under ``shared`` (whichever xdist
    worker asks first grades it; the others wait on a file lock): s1 the instructor's
    answers, s2 one exercise wrong (``WRONG_ANSWERS``), s3 flagged (that exercise's code
    reaches for the file system, its answers right), s4 the student version untouched;
    graded by ``python -m grader autograde --jobs 2`` on a copy of the session's release.
    Returns the course directory (``course``), the hand-ins (``class``) and what autograde
    printed (``printed``). Read them, never write them: copy the course directory first
    (``shutil.copytree``, symlinks kept)."""
    folder = shared / f"graded-class-{lesson.name}"
    printed = shared / f"graded-class-{lesson.name}.out"

    def grade() -> None:
        shutil.rmtree(folder / "course", ignore_errors=True)
        shutil.rmtree(folder / "class", ignore_errors=True)
        course = released_course([lesson], shared, folder / "course")
        for student, nb in class_notebooks(lesson, course).items():
            submit(folder / "class", student, nb, lesson.notebook.name)
        done = grader("autograde", lesson.name, folder / "class", "--course-dir", course,
                      "--jobs", "2")
        printed.write_text(done.stdout)

    make_once(printed, grade)
    return {"course": folder / "course", "class": folder / "class",
            "printed": printed.read_text()}


def class_notebooks(lesson, course: Path) -> dict[str, nbformat.NotebookNode]:
    """The notebooks of ``graded_class``, by student: full, wrong, flagged, untouched (the
    student version released in ``course``)."""
    wrong = read_notebook(lesson.notebook)
    name, source = WRONG_ANSWERS[lesson.name]
    cell(wrong, name).source = source
    flagged = read_notebook(lesson.notebook)  # the same exercise, right, and flagged
    cell(flagged, name).source += "\nimport os  # reaches for the file system"
    untouched = read_notebook(course / "release" / lesson.name / lesson.notebook.name)
    return {"s1": read_notebook(lesson.notebook), "s2": wrong, "s3": flagged, "s4": untouched}


def answered(student: nbformat.NotebookNode, lesson) -> nbformat.NotebookNode:
    """A copy of the student version with every answer cell filled in from the instructor's."""
    reference = {c.metadata.nbgrader.grade_id: c.source
                 for c in read_notebook(lesson.notebook).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    nb = copy.deepcopy(student)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("solution"):
            c.source = reference[c.metadata.nbgrader.grade_id]
    return nb


BEGIN_SOLUTION = "### BEGIN SOLUTION\n"


def at_solution_top(source: str, *lines: str) -> str:
    """An answer cell's ``source`` with ``lines`` of the student's own first in its solution,
    at the solution's indentation (a function's body, a class's)."""
    head, body = source.split(BEGIN_SOLUTION, 1)
    indent = head.rsplit("\n", 1)[-1]
    return head + BEGIN_SOLUTION + "".join(f"{indent}{line}\n" for line in lines) + body


def graded_prediction(lesson) -> str:
    """The name of the lesson's graded prediction (each lesson has one)."""
    [name] = [c.metadata.nbgrader.grade_id for c in read_notebook(lesson.notebook).cells
              if c.metadata.get("nbgrader", {}).get("solution")
              and c.metadata.nbgrader.grade_id.startswith("predicted_")]
    return name


def mixed(student: nbformat.NotebookNode, lesson) -> tuple[nbformat.NotebookNode, list[str]]:
    """Every answer in, but the graded prediction outside its band (a thousand times the
    answer) and one exercise wrong; the two names."""
    import importlib

    nb = answered(student, lesson)
    prediction = graded_prediction(lesson)
    answer = getattr(importlib.import_module(lesson.module), prediction)
    cell(nb, prediction).source = f"{prediction} = {float(answer) * 1000!r}"
    wrong, source = WRONG_ANSWERS[lesson.name]
    cell(nb, wrong).source = source
    return nb, [prediction, wrong]


def assert_alternatives_pass_hidden_checks(alternatives: dict, module, cases: dict) -> None:
    """Each other correct answer of ``alternatives`` (exercise name: functions written another
    way) passes every hidden check of its exercise in ``cases`` that expects a value: put in
    place of ``module``'s reference, it gives what the reference gives, compared as the
    notebook's check compares (its type too)."""
    from grader.content.cases import as_case, reference_value
    from grader.content.notebook_checks import _difference

    for name, variants in alternatives.items():
        for case in map(as_case, cases[name]):
            if case.raises:
                continue
            expected = reference_value(case, vars(module))
            for variant in variants:
                got = eval(case.expression, {**vars(module), name: variant})
                assert _difference(got, expected, case.rel_tol, 0.0) is None, (case, variant)


def drawn_calls(draw: Callable, seeds: range = range(3)) -> list[list]:
    """The hidden cases ``draw`` (a cases module's ``DRAWN`` function) gives each of ``seeds``,
    checked to be three a student, another three for another seed and the same for one."""
    import random

    draws = [draw(random.Random(seed)) for seed in seeds]
    assert all(len(calls) == 3 for calls in draws)
    assert len({tuple(map(str, calls)) for calls in draws}) == len(draws)
    assert draws[0] == draw(random.Random(seeds[0]))  # a seed gives one draw
    return draws


def arguments_of(function: Callable, expression: str) -> dict:
    """What ``expression``, a call of ``function`` (``math`` in scope), passes it, by
    parameter, defaults filled in."""
    import inspect
    import math

    signature, bound = inspect.signature(function), {}

    def record(*args, **kwargs) -> None:
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        bound.update(call.arguments)

    eval(expression, {"math": math, function.__name__: record})
    return bound


def with_edits(reference: Callable, *edits: tuple[str, str]) -> Callable:
    """The reference function (or class) ``reference`` with its source edited by ``(old, new)``
    pairs, each ``old`` found exactly once: the reference with a bug put in on purpose, defined
    afresh in a copy of its module's namespace."""
    import __future__

    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(reference))
    for old, new in edits:
        assert source.count(old) == 1, f"{reference.__name__}: {old!r} is not in it once"
        source = source.replace(old, new)
    namespace = dict(vars(inspect.getmodule(reference)))
    code = compile(source, f"<{reference.__name__} with a bug>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace[reference.__name__]


def judged_with(lesson_name: str, exercise: str, **replacements: object):
    """How grading judges the checks of ``exercise``, visible and hidden, run on the reference
    code with some of its names replaced (by a bug a hint names, say): a ``probe.Verdict``,
    whose ``visible_failures`` are what Validate shows."""
    import importlib
    import math

    import torch

    from grader.common import syntax
    from grader.content.lessons import load_lesson
    from grader.grading import probe

    lesson = load_lesson(lesson_name)
    checked = next(e for e in probe.exercises(lesson) if e.name == exercise)
    namespace = {**vars(importlib.import_module(lesson.module)), "math": math, "torch": torch,
                 **replacements}
    results: list[object] = []
    for check in checked.checks:
        try:
            results.append(syntax.evaluate(check.expression, dict(namespace)))
        except Exception as error:
            builtin = next(c for c in type(error).__mro__ if c.__module__ == "builtins")
            results.append(probe.Failure(f"{type(error).__name__}: {error}", builtin.__name__))
    return probe.judge(checked, results)


# ------------------------------------------------------------------ workers on a Redis broker


def start_worker(broker: str, log: Path, key: Path, cwd: Path = REPO) -> subprocess.Popen:
    """``python -m grader worker`` on ``broker`` (one submission at a time) with a copy of the
    queue key ``key`` (a course's ``queue.key``, made now if it is not there yet, as the
    coordinator's first ``autograde --broker`` would), its output in ``log``; the grader
    package in ``cwd`` (another checkout's). A session of its own: ``stop`` kills it with its
    pool."""
    from grader.grading.distributed import queue_key

    queue_key(key, create=True)
    copy_of = log.with_suffix(".key")
    copy_of.write_bytes(key.read_bytes())
    copy_of.chmod(0o600)
    return grader_process("worker", "--broker", broker, "--concurrency", "1",
                          "--queue-key", copy_of, stdout=log.open("w"),
                          stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def stop(worker: subprocess.Popen) -> None:
    """kill -9 a worker and every process of its pool."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def formgrader(root: Path, home: Path) -> Iterator[tuple[str, str]]:
    """nbgrader's formgrader: a Jupyter server with its server extension, over the course
    directory (its nbgrader_config.py read from there, as an instructor starts it), on
    loopback; yields the base URL and the token."""
    port, token = free_port(), secrets.token_hex(16)
    home.mkdir(parents=True, exist_ok=True)
    env = {**grader_env(), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "run"),
           "HOME": str(home)}
    argv = [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
            "--ServerApp.jpserver_extensions={'nbgrader.server_extensions.formgrader': True}",
            *(["--allow-root"] if os.geteuid() == 0 else [])]
    with (home / "server.log").open("wb") as log:
        server = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("formgrader did not start:\n"
                                         + (home / "server.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)
