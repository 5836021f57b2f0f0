"""Careless, broken and hostile submissions, graded in one batch through the command line.

Each case is lesson 01's instructor notebook with something done to it, and the outcome it must
get: the points it earned (never more), and whether it is flagged. Two honest students in the
same batch must get exactly the grades they would get alone.
"""

from __future__ import annotations

import copy
import csv
import html
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from grader.common.files import remove_tree
from grader.content.lessons import load_lesson
from grader.grading.sandbox import bwrap_path
from tests.grading_helpers import (
    cell,
    formgrader,
    grader,
    grader_peak_rss,
    in_process,
    points,
    read_export,
    read_notebook,
    released_course,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hostile"),
              pytest.mark.skipif(bwrap_path() is None, reason="grading hostile code needs "
                                 "bubblewrap (make test installs it where it can)")]

LESSON = load_lesson("01_float_formats")
FULL = sum(points(nbformat.read(LESSON.notebook, as_version=4)).values())
PTS = points(nbformat.read(LESSON.notebook, as_version=4))
REPO = Path(__file__).resolve().parent.parent
Mutation = Callable[[nbformat.NotebookNode, Path], None]


def append(code: str) -> Mutation:
    def mutate(nb: nbformat.NotebookNode, course: Path) -> None:
        nb.cells.append(new_code_cell(code.replace("COURSE", str(course)).replace(
            "REPO", str(REPO))))
    return mutate


def replace(name: str, code: str, extra: str = "") -> Mutation:
    def mutate(nb: nbformat.NotebookNode, course: Path) -> None:
        cell(nb, name).source = code
        if extra:
            nb.cells.append(new_code_cell(extra))
    return mutate


WRONG_EPSILON = "def machine_epsilon(fmt):\n    return 2.0 ** -(fmt.mantissa_bits + 1)"


def drop_test_cells(nb, course) -> None:
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]


def move_test_cells_first(nb, course) -> None:
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    nb.cells = tests + [c for c in nb.cells if c not in tests]


def retarget_test_cells(nb, course) -> None:
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.metadata.nbgrader["grade_id"] = "test-decode"


def inflate_points(nb, course) -> None:
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.metadata.nbgrader["points"] = 1000
    fake = new_code_cell("pass")
    fake.metadata["nbgrader"] = {"grade": True, "grade_id": "test-bonus", "locked": True,
                                 "points": 100, "schema_version": 3, "solution": False,
                                 "task": False}
    nb.cells.append(fake)


EQ_TRICK = '''class Yes(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__


def decode(bits, fmt):
    return Yes(0.0)'''

STEAL_EXPECTED = '''import sys


def decode(bits, fmt):
    frame = sys._getframe(1)
    while frame is not None and "expected" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["expected"] if frame is not None else 0.0'''

AST_TRANSFORMER = '''import ast


class DropChecks(ast.NodeTransformer):
    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check":
            return ast.Pass()
        return node


get_ipython().ast_transformers.append(DropChecks())'''

READ_SECRETS = '''import glob, os
found = []
for pattern in ["COURSE/gradebook.db", "COURSE/source/*/*.ipynb", "COURSE/submitted/*/*/*",
                "REPO/solutions/*.py", "REPO/notebooks/*/*.ipynb", "/root/*"]:
    found += glob.glob(pattern)
print("visible:", found)
for path in ["COURSE/gradebook.db", "REPO/solutions/floats.py"]:
    try:
        open(path, "a").write("tampered")
    except OSError as error:
        print(type(error).__name__)
try:
    open("REPO/pwned_by_student", "w").write("x")
except OSError as error:
    print(type(error).__name__)
assert found == [], found'''

# (student id, what is done to the notebook, expected score, expected status or None for
# either, a word the reason must contain or None)
CASES: list[tuple[str, Mutation | str, float, str | None, str | None]] = [
    ("honest", append("pass"), FULL, "graded", None),
    ("honest_one_wrong", replace("machine_epsilon", WRONG_EPSILON), FULL - 1, "graded", None),
    ("loops_forever", append("while True:\n    pass"), FULL, "needs_review", "time limit"),
    ("swallows_interrupts", append(
        "import time\nwhile True:\n    try:\n        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n        pass"), FULL, "needs_review", "time limit"),
    ("exhausts_memory", append("hog = bytearray(64 * 2**30)"), FULL, "graded", None),
    ("fork_bomb", append(
        "import os\nfor _ in range(100000):\n    if os.fork() == 0:\n        while True:\n"
        "            pass"), FULL, "needs_review", "subprocesses"),
    ("kills_kernel", append("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"), FULL,
     "needs_review", "stopped the kernel"),
    ("os_exit", append("import os\nos._exit(3)"), FULL, "needs_review", "stopped the kernel"),
    ("calls_exit", append("exit()"), FULL, "needs_review", "stopped the kernel"),
    ("calls_exit_early", lambda nb, course: nb.cells.insert(5, new_code_cell("quit()")), FULL,
     "needs_review", "cell 5: this cell stopped the kernel"),
    ("floods_output", append("while True:\n    print('x' * 100000)"), FULL, "needs_review",
     None),
    ("asks_input", append("name = input('your name? ')"), FULL, "graded", None),
    ("invalid_json", "{not json", 0.0, "invalid", "not a readable notebook"),
    ("missing", "", 0.0, "invalid", "no notebook"),
    ("renamed", "rename", FULL, "needs_review", "in place of"),
    ("deleted_tests", drop_test_cells, FULL, None, None),
    ("moved_tests", move_test_cells_first, FULL, None, None),
    ("retargeted_tests", retarget_test_cells, FULL, None, None),
    ("inflated_points", inflate_points, FULL, None, None),
    # The forged decode also sends a demo cell's loop round forever: that cell is skipped.
    ("eq_trick", replace("decode", EQ_TRICK), FULL - PTS["decode"], None, None),
    ("steals_expected", replace("decode", STEAL_EXPECTED), FULL - PTS["decode"],
     "needs_review", "frames"),
    ("patched_check", replace("machine_epsilon", WRONG_EPSILON + "\n\n\ncheck = print"),
     FULL - 1, "needs_review", "check helper"),
    ("ast_transformer", replace("machine_epsilon", WRONG_EPSILON, AST_TRANSFORMER), FULL - 1,
     "needs_review", "transformers"),
    ("patched_builtins", replace("machine_epsilon", WRONG_EPSILON,
                                 "import builtins\nbuiltins.type = lambda value: float"),
     None, "needs_review", "builtins"),
    ("patched_torch", replace("decode_tensor", "def decode_tensor(bits, fmt):\n"
                              "    return torch.zeros(bits.shape)",
                              "torch.equal = lambda *args: True\n"
                              "torch.Tensor.__eq__ = lambda *args: True"),
     FULL - PTS["decode_tensor"], "needs_review", "dunder attributes"),
    ("forged_results", replace("machine_epsilon", WRONG_EPSILON,
                               'print(\'[{"t": "float", "v": "0x1.0p-10"}]\' * 3)'),
     FULL - 1, "graded", None),
    # Waits rather than spins (loops_forever and fork_bomb spin): each cell that calls it runs
    # to the time limit, and a spinning wait burned 40 CPU s of the batch for nothing more.
    ("hangs_in_function", replace("smallest_normal",
                                  "def smallest_normal(fmt):\n    import time\n"
                                  "    while True:\n        time.sleep(1)"),
     FULL - 1, "needs_review", "time limit"),
    ("reads_secrets", append(READ_SECRETS), FULL, "needs_review", "file system"),
    ("uses_network", append(
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)"), FULL,
     "needs_review", "network"),
    ("runs_subprocess", append(
        "import subprocess\nsubprocess.run(['touch', 'REPO/pwned_by_student'])"), FULL,
     "needs_review", "subprocesses"),
    ("shadows_modules", "shadow", FULL, "graded", None),
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory, shared_tmp):
    tmp = tmp_path_factory.mktemp("hostile")
    course, submissions = tmp / "course", tmp / "submissions"
    released_course([LESSON], shared_tmp, course)
    instructor = nbformat.read(LESSON.notebook, as_version=4)
    for student, mutation, *_ in CASES:
        folder = submissions / student
        folder.mkdir(parents=True)
        if mutation == "{not json":
            (folder / LESSON.notebook.name).write_text(mutation)
        elif mutation == "rename":
            nbformat.write(instructor, folder / "my_float_formats_final.ipynb")
        elif mutation == "shadow":
            nbformat.write(instructor, folder / LESSON.notebook.name)
            for module in ("torch.py", "sitecustomize.py", "math.py"):
                (folder / module).write_text("raise SystemExit('shadowed')\n")
        elif callable(mutation):
            nb = copy.deepcopy(instructor)
            mutation(nb, course)
            submit(submissions, student, nb, LESSON.notebook.name)
    # Lesson 01's slowest cell when graded (its imports) takes 1.5 s here, under 2 s with the
    # suite's other worker busy: 6 s leaves three times that, and ends the cases that run to a
    # time limit (nine of them, four spinning a core meanwhile) sooner than the default would.
    done = grader("autograde", LESSON.name, submissions, "--course-dir", course, "--jobs", "2",
                  "--cell-timeout", "6", "--timeout", "150")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {"done": done, "grades": read_export(tmp / "grades.csv"), "course": course,
            "status": json.loads((course / "grading_status.json").read_text())[LESSON.name]}


def test_there_are_at_least_twenty_hostile_cases() -> None:
    assert len(CASES) >= 22 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("student", "expected_score", "expected_status", "reason"),
                         [(c[0], c[2], c[3], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_each_submission_gets_what_it_earned_and_no_more(batch, student, expected_score,
                                                         expected_status, reason) -> None:
    row = batch["grades"][(student, LESSON.name)]
    score = float(row["score"])
    if expected_score is None:  # sabotaged its own grading: it may lose points, never gain
        assert score <= FULL - 1
    else:
        assert score == expected_score, row
    assert float(row["max_score"]) == FULL
    if expected_status is not None:
        assert row["status"] == expected_status, row
    if reason is not None:
        assert reason in row["reason"], row


def test_the_batch_finishes_and_reports_every_student(batch) -> None:
    assert f"of {len(CASES)}" in batch["done"].stdout
    assert set(batch["status"]) == {c[0] for c in CASES}


def test_nothing_outside_the_sandbox_was_touched(batch) -> None:
    assert not (REPO / "pwned_by_student").exists()
    assert "tampered" not in (REPO / "solutions" / "floats.py").read_text()
    status = batch["status"]["reads_secrets"]
    assert status["exercises"]["decode"]["points"] == PTS["decode"]


def test_grading_without_bubblewrap_is_refused_unless_asked(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    (tmp_path / "s" / "someone").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "grader", "autograde", LESSON.name,
                           str(tmp_path / "s"), "--course-dir", str(tmp_path / "c")],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "bubblewrap" in done.stderr and "--no-sandbox" in done.stderr


def test_report_gives_pass_rates_a_histogram_and_the_flagged(batch) -> None:
    done = grader("report", LESSON.name, "--course-dir", batch["course"])
    folder = batch["course"] / "reports" / LESSON.name
    with (folder / "pass_rates.csv").open() as handle:
        rates = {row["exercise"]: row for row in csv.DictReader(handle)}
    assert set(rates) == set(PTS)
    ran = sum(1 for record in batch["status"].values() if record.get("exercises"))
    assert all(int(row["graded"]) == ran for row in rates.values())
    # Five cases answer machine_epsilon wrongly; the decode ones lose decode, not epsilon.
    assert int(rates["machine_epsilon"]["passed"]) <= ran - 5
    assert int(rates["decode"]["passed"]) <= ran - 2
    assert (folder / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (folder / "flagged.csv").open() as handle:
        flagged = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert "loops_forever" in flagged and "time limit" in flagged["loops_forever"]["reason"]
    assert flagged["invalid_json"]["status"] == "invalid"
    assert "honest" not in flagged
    assert "machine_epsilon" in done.stdout


# ------------------------------------------------------------------ limits, per student

DETACHED_BUSY = '''import os, time
for _ in range(60):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                pass
        os._exit(0)
time.sleep(3)'''

MEMFD_BOMB = '''import os
held = []
for _ in range(48):  # 48 x 64 MiB = 3 GiB of shared memory, none of it mapped
    fd = os.memfd_create("x")
    for _ in range(64):
        os.write(fd, b"x" * 2**20)
    held.append(fd)
print("held 3 GiB")'''

FILLS_SCRATCH = '''import os
for top in ("/tmp", "/run/ctc", os.getcwd()):
    path = os.path.join(top, "deep_marker_8d1f")
    try:
        os.makedirs(path)
        os.chdir(path)
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
        with open("big", "wb") as handle:
            for _ in range(2048):
                handle.write(b"x" * 2**20)
    except OSError as error:
        print(top, type(error).__name__)
os.chdir("/tmp/work")'''

DISPLAY_FLOOD = '''handle = display("start", display_id=True)
for i in range(300):
    handle.update("x" * 2**20)'''

COMM_FLOOD = '''from comm import create_comm
channel = create_comm(target_name="flood")
for i in range(300):
    channel.send({"x": "x" * 2**20})'''

def prints_when_called(name: str) -> Mutation:
    """The correct solution of ``name``, printing 4 MiB each time it is called."""
    def mutate(nb, course) -> None:
        target = cell(nb, name)
        marker = "### BEGIN SOLUTION\n"
        indent = target.source.split(marker)[0].rsplit("\n", 1)[1]
        target.source = target.source.replace(marker, marker + indent + "print('x' * 2**22)\n")
    return mutate

FORGES_REPLY = '''import sys


def machine_epsilon(fmt):
    frame = sys._getframe(1)
    while frame is not None and "_ctc_reply" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None:  # write a reply of our own into the grader's file
        nonce, path = frame.f_locals["_ctc_nonce"], frame.f_locals["_ctc_reply"]
        with open(path, "a") as handle:
            handle.write(nonce + '[{"t": "float", "v": "0x1.0p-10"}]' + nonce + "\\n")
    return 2.0 ** -fmt.mantissa_bits'''


# The course's version of split_bits reaches the kernel to judge decode again: keep it, and use
# it for decode_tensor, which does not build on split_bits and earns nothing from it.
CAPTURES_REFERENCE = '''_captured = {}


def split_bits(bits, fmt):
    return (0, 0, 0)


def decode(bits, fmt):
    split = globals()["split_bits"]
    if split.__code__.co_filename == "<string>":  # the course's version, sent for a re-judge
        _captured["split_bits"] = split
    sign, exponent, mantissa = split(bits, fmt)
    top, m = 2**fmt.exponent_bits - 1, fmt.mantissa_bits
    if exponent == top and (fmt.ieee_specials or mantissa == 2**m - 1):
        return math.nan if mantissa or not fmt.ieee_specials else (-math.inf if sign else math.inf)
    value = math.ldexp(mantissa + (2**m if exponent else 0), max(exponent, 1) - fmt.bias - m)
    return -value if sign else value


def decode_tensor(bits, fmt):
    split = _captured.get("split_bits", split_bits)
    values = []
    for b in (bits.to(torch.int64) & (2**fmt.total_bits - 1)).reshape(-1).tolist():
        s, e, mt = split(b, fmt)
        top, m = 2**fmt.exponent_bits - 1, fmt.mantissa_bits
        if e == top and (fmt.ieee_specials or mt == 2**m - 1):
            v = math.nan if mt or not fmt.ieee_specials else math.inf
        else:
            v = math.ldexp(mt + (2**m if e else 0), max(e, 1) - fmt.bias - m)
        values.append(-v if s else v)
    return torch.tensor(values, dtype=torch.float32).reshape(bits.shape)'''

FIFO_REPLY = '''import os, sys


def tensor_bytes(shape, dtype):
    frame = sys._getframe(1)
    while frame is not None and "_ctc_reply" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None and not os.path.exists(frame.f_locals["_ctc_reply"]):
        os.mkfifo(frame.f_locals["_ctc_reply"])  # the grader would block on it for ever
        globals()["_held"] = os.open(frame.f_locals["_ctc_reply"], os.O_RDWR)
    return math.prod(shape) * dtype.itemsize'''

FORGED_JSON = '''import json

_dumps = json.dumps


def _forged(value, *args, **kwargs):
    return _dumps(value, *args, **kwargs)


json.dumps = _forged'''


def in_place_of(names: tuple[str, ...], code: str) -> Mutation:
    """The cells of ``names`` emptied, ``code`` in the first one's place."""
    def mutate(nb, course) -> None:
        for i, name in enumerate(names):
            cell(nb, name).source = code if i == 0 else "pass"
    return mutate


def slow_demos(nb, course) -> None:
    """Three slow cells of the student's own in the middle of the notebook: each within the
    cell limit, the three past the own cells' share of the notebook's (TIMEOUT / 2)."""
    for _ in range(3):
        nb.cells.insert(8, new_code_cell("import time\ntime.sleep(5)"))


def many_short_cells(nb, course) -> None:
    for _ in range(120):
        nb.cells.append(new_code_cell("import time\ntime.sleep(0.5)"))


LIMIT_CASES: list[tuple[str, Mutation, float, str | None, str | None]] = [
    ("honest_a", append("pass"), FULL, "graded", None),
    ("honest_b", append("pass"), FULL, "graded", None),
    ("detached_busy", append(DETACHED_BUSY), FULL, "needs_review", "killed processes"),
    ("many_short_cells", many_short_cells, FULL, "needs_review", "time share"),
    ("slow_demos", slow_demos, FULL, "needs_review", "time share"),
    ("memfd_bomb", append(MEMFD_BOMB), FULL, "needs_review", None),
    ("fills_scratch", append(FILLS_SCRATCH), FULL, None, None),
    ("display_flood", append(DISPLAY_FLOOD), FULL, "needs_review", "output limit"),
    ("comm_flood", append(COMM_FLOOD), FULL, None, None),
    ("prints_in_probe", prints_when_called("tensor_bytes"), FULL, None, None),
    ("forges_reply", replace("machine_epsilon", FORGES_REPLY), FULL - PTS["machine_epsilon"],
     "needs_review", "more than one reply"),
    ("empty_lines", append("\n" * 150_000), FULL, None, None),  # once a quadratic regex
    ("fifo_reply", replace("tensor_bytes", FIFO_REPLY), FULL - PTS["tensor_bytes"],
     "needs_review", "not a plain file"),
    ("forged_json", lambda nb, course: nb.cells.insert(3, new_code_cell(FORGED_JSON)), FULL,
     "needs_review", "replaced functions"),
    ("captures_reference", in_place_of(("split_bits", "decode", "decode_tensor"),
                                       CAPTURES_REFERENCE),
     FULL - PTS["split_bits"] - PTS["decode_tensor"], "needs_review", None),
]
# The whole notebook's limit: the honest ones take 3 s here; the own cells' share (half of it)
# is what slow_demos and many_short_cells run past.
TIMEOUT = 24


def released_class(tmp: Path, cases: list[tuple], shared: Path) -> tuple[Path, Path]:
    """A course with lesson 01 released, and a class of the instructor version with each
    case's mutation applied: (course, submissions)."""
    course, submissions = tmp / "course", tmp / "submissions"
    released_course([LESSON], shared, course)
    instructor = nbformat.read(LESSON.notebook, as_version=4)
    for student, mutation, *_ in cases:
        nb = copy.deepcopy(instructor)
        mutation(nb, course)
        submit(submissions, student, nb, LESSON.notebook.name)
    return course, submissions


@pytest.fixture(scope="module")
def limits_batch(tmp_path_factory, shared_tmp):
    tmp = tmp_path_factory.mktemp("limits")
    course, submissions = released_class(tmp, LIMIT_CASES, shared_tmp)
    done, peak = grader_peak_rss("autograde", LESSON.name, submissions, "--course-dir", course,
                                 "--jobs", "2", "--cell-timeout", "20", "--timeout",
                                 str(TIMEOUT), "--memory", "2")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {"done": done, "peak": peak, "grades": read_export(tmp / "grades.csv"),
            "status": json.loads((course / "grading_status.json").read_text())[LESSON.name]}


LIMITS = pytest.mark.xdist_group("hostile-limits")
STATE = pytest.mark.xdist_group("hostile-state")
NAMES = pytest.mark.xdist_group("hostile-names")


@LIMITS
@pytest.mark.parametrize(("student", "expected_score", "expected_status", "reason"),
                         [(c[0], c[2], c[3], c[4]) for c in LIMIT_CASES],
                         ids=[c[0] for c in LIMIT_CASES])
def test_limits_hold_per_student_and_honest_work_keeps_its_points(
        limits_batch, student, expected_score, expected_status, reason) -> None:
    row = limits_batch["grades"][(student, LESSON.name)]
    assert float(row["score"]) == expected_score, row
    if expected_status is not None:
        assert row["status"] == expected_status, row
    if reason is not None:
        assert reason in row["reason"], row


@LIMITS
def test_a_notebook_never_runs_much_past_its_wall_clock_limit(limits_batch) -> None:
    for student, record in limits_batch["status"].items():
        assert record["seconds"] <= TIMEOUT + 15, (student, record["seconds"])


@LIMITS
def test_shared_memory_counts_against_the_memory_limit(limits_batch) -> None:
    from grader.grading.limits import Limits
    from grader.grading.sandbox import Cgroup

    group = Cgroup.create(Limits())
    if group is None:
        pytest.skip(f"no cgroup here ({Cgroup.unavailable_reason}): rlimits cannot count memfd")
    group.remove()
    record = limits_batch["status"]["memfd_bomb"]
    assert "stopped the kernel" in record["reason"] or "out of memory" in record["reason"]


@LIMITS
def test_nothing_a_kernel_wrote_survives_grading(limits_batch) -> None:
    """The kernel wrote a folder 1500 deep in its /tmp, /run/ctc and working folder: none of it
    is on the host (a few levels of /tmp are enough to see it, and to stay out of deep trees
    that other tests make on purpose)."""
    import tempfile

    top = Path(tempfile.gettempdir())
    found = []
    for folder, subfolders, _ in os.walk(top):
        depth = len(Path(folder).relative_to(top).parts)
        found += [f"{folder}/{name}" for name in subfolders if name == "deep_marker_8d1f"]
        if depth >= 4:
            subfolders.clear()
    assert found == []


@LIMITS
def test_the_graders_memory_stays_bounded_whatever_kernels_send(limits_batch) -> None:
    """Display updates, comm messages and output while the grader calls a function: 300 MiB
    and more of each, against an output cap of 2 MiB per notebook. The line is 2 GiB: the
    grader itself (torch, nbgrader) with two kernels' queued messages peaked at 1.56 GB on a
    busy machine with at most 64 messages waiting per socket (kernel.RECEIVE_QUEUE), and at
    1.9 GB with zmq's default of 1000 (each flood sends 300 MiB and more)."""
    assert limits_batch["peak"] < 2048 * 2**20, limits_batch["peak"] / 2**20


@LIMITS
def test_the_fair_share_of_cpu_keeps_a_neighbour_whole(limits_batch) -> None:
    for student in ("honest_a", "honest_b"):
        assert limits_batch["status"][student]["status"] == "graded"


# ------------------------------------------------------------------ judged where checks ran

def unfinished(name: str) -> Mutation:
    """The exercise ``name`` as the student version has it: not done."""
    def mutate(nb, course) -> None:
        student = nbformat.read(course / "release" / LESSON.name / LESSON.notebook.name,
                                as_version=4)
        cell(nb, name).source = cell(student, name).source
    return mutate


# Raises in the grader's first probe of machine_epsilon and nowhere else, as a fault of the
# machine would (memory the kernel did not get, a signal): the second run of its checks passes.
FAILS_FIRST_PROBE = '''import sys

_first_probe = []


def machine_epsilon(fmt):
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "_ctc_probe":
        frame = frame.f_back
    if frame is not None:
        _first_probe.append(_first_probe[0] if _first_probe else frame.f_locals["_ctc_reply"])
        if frame.f_locals["_ctc_reply"] == _first_probe[0]:
            raise MemoryError("a fault of the machine")
    return 2.0 ** -fmt.mantissa_bits'''

# Raises in the first probe, ends the kernel in the second: the first run's result stands.
STOPS_IN_SECOND_PROBE = FAILS_FIRST_PROBE.replace(
    'raise MemoryError("a fault of the machine")',
    'raise MemoryError("a fault of the machine")\n        import os\n        os._exit(1)')

# An image whose metadata carries attributes for the <img> tag that nbconvert's templates
# write its width into, unquoted (the feedback page's and formgrader's).
HOSTILE_IMAGE = """from IPython.display import Image, display
png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
tag = "1 onmouseover=alert(1) tabindex=0 autofocus onfocus=alert(2)"
display(Image(data=png), metadata={"image/png": {"width": tag, "height": tag, "alt": 7,
                                                 "filenames": {"image/png": "/etc/passwd"}}})"""

STATE_CASES: list[tuple[str, Mutation, float, str | None]] = [
    ("scratch_rebinds", append("decode = None\nsplit_bits = print\n" + HOSTILE_IMAGE), FULL,
     None),
    ("rebinds_stdout", append("import io, sys\nsys.stdout = io.StringIO()"), FULL, None),
    ("no_float_format", unfinished("FloatFormat"), FULL - PTS["FloatFormat"],
     "passes with a correct `FloatFormat`"),
    ("wrong_split_bits", replace("split_bits", "def split_bits(bits, fmt):\n"
                                 "    return (0, 0, 0)"), FULL - PTS["split_bits"],
     "passes with a correct `split_bits`"),
    ("fails_first_probe", replace("machine_epsilon", FAILS_FIRST_PROBE), FULL,
     "its checks passed when they ran a second time"),
    ("stops_in_second_probe", replace("machine_epsilon", STOPS_IN_SECOND_PROBE),
     FULL - PTS["machine_epsilon"], None),
]


@pytest.fixture(scope="module")
def state_batch(tmp_path_factory, shared_tmp):
    tmp = tmp_path_factory.mktemp("state")
    course, submissions = released_class(tmp, STATE_CASES, shared_tmp)
    grader("autograde", LESSON.name, submissions, "--course-dir", course, "--jobs", "2",
           "--cell-timeout", "20")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    grader("feedback", LESSON.name, "--course-dir", course)
    return {"course": course, "grades": read_export(tmp / "grades.csv"),
            "status": json.loads((course / "grading_status.json").read_text())[LESSON.name]}


@STATE
@pytest.mark.parametrize(("student", "expected_score", "note"),
                         [(c[0], c[2], c[3]) for c in STATE_CASES], ids=[c[0] for c in STATE_CASES])
def test_each_exercise_is_judged_where_its_checks_ran_and_costs_its_own_points_once(
        state_batch, student, expected_score, note) -> None:
    row = state_batch["grades"][(student, LESSON.name)]
    assert float(row["score"]) == expected_score, (row, state_batch["status"][student])
    if note is not None:
        notes = [e.get("note", "") for e in state_batch["status"][student]["exercises"].values()]
        assert note in notes
        page = (state_batch["course"] / "feedback" / student / LESSON.name
                / f"{LESSON.notebook_id}.html").read_text()
        assert note.replace("`", "&#96;") in page or note in page
        # review STUDENT says it as the page does, under the exercise it is about
        shown = in_process("review", LESSON.name, student, "--course-dir", state_batch["course"],
                           check=True).stdout
        assert f"\n    {note}\n" in shown, shown
    if student == "fails_first_probe":  # what the first run said, for the instructor alone
        first = state_batch["status"][student]["exercises"]["machine_epsilon"]["first_run"]
        assert first and all("a fault of the machine" in m for m in first), first
        assert "MemoryError: a fault of the machine" not in html.unescape(page)
        shown = in_process("review", LESSON.name, student, "--course-dir", state_batch["course"],
                           check=True).stdout
        assert "failed on the first run, passed on the second: machine_epsilon(" in shown, shown
    if student == "stops_in_second_probe":  # judged once, flagged, the rest of the notebook run
        record = state_batch["status"][student]
        assert record["status"] == "needs_review", record
        assert "second run did not finish" in record["reason"], record
        assert record["exercises"]["machine_epsilon"]["hidden_failed"] > 0, record


@STATE
def test_an_images_metadata_gives_its_tag_no_attribute_of_its_own(state_batch) -> None:
    """Width and height become whole numbers or nothing, in the graded notebook (formgrader
    shows it) and on the feedback page; the page's <img> tags carry no event handler."""
    graded = read_notebook(state_batch["course"] / "autograded" / "scratch_rebinds"
                           / LESSON.name / LESSON.notebook.name)
    images = [o for c in graded.cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    kept = [json.dumps(o.metadata) for o in images]
    assert kept and not [m for m in kept if "onmouseover" in m or "filenames" in m], kept
    page = (state_batch["course"] / "feedback" / "scratch_rebinds" / LESSON.name
            / f"{LESSON.notebook_id}.html").read_text()
    tags = re.findall(r"<img\b[^>]*>", page)
    assert tags and not [t for t in tags if re.search(r"\son\w+\s*=|autofocus|passwd", t)], tags


def test_only_an_attempted_exercise_is_judged_again() -> None:
    """A re-judge starts a kernel of its own. It is spent on an exercise that could pass with
    a correct version of the earlier one it builds on, not on one still as it was released
    (its own stub raises NotImplementedError whatever the earlier exercises do): an untouched
    notebook once took eight times longer to grade than a finished one."""
    from grader.grading.execute import run_submission
    from grader.grading.limits import Limits
    from grader.grading.probe import exercises

    plan = exercises(LESSON)
    stub = {e.name: e.stub for e in plan}
    files = [LESSON.folder / name for name in LESSON.data_files]
    wrong_split = "def split_bits(bits, fmt):\n    return (0, 0, 0)"
    outcomes = {}
    for decode in ("solution", "stub"):
        nb = nbformat.read(LESSON.notebook, as_version=4)
        cell(nb, "split_bits").source = wrong_split
        for name in ("encode", "max_finite", "decode_tensor") + (("decode",) if decode == "stub"
                                                                else ()):
            cell(nb, name).source = stub[name] + "\n"  # a blank line more: still untouched
        outcomes[decode] = run_submission(nb, files, plan, Limits(), use_sandbox=False)
    attempted, untouched = outcomes["solution"], outcomes["stub"]
    assert attempted.rejudged == ("decode",)
    assert attempted.verdicts["decode"].points == 2.0
    assert attempted.verdicts["decode"].note == "passes with a correct `split_bits`"
    assert untouched.rejudged == ()
    for run in outcomes.values():
        assert run.verdicts["split_bits"].points == 0
        assert all(run.verdicts[name].points == 0 for name in ("encode", "decode_tensor"))
        assert run.verdicts["machine_epsilon"].points == 1.0
    assert untouched.verdicts["decode"].points == 0


def test_a_solution_cell_is_untouched_only_when_it_is_the_released_stub() -> None:
    from grader.grading.probe import exercises, unattempted

    decode = next(e for e in exercises(LESSON) if e.name == "decode")
    assert "raise NotImplementedError()" in decode.stub and "### BEGIN" not in decode.stub
    nb = nbformat.read(LESSON.notebook, as_version=4)
    assert not unattempted(nb, decode)  # the solution
    for source, expected in [(decode.stub, True), (decode.stub.replace("\n", "  \n"), True),
                             ("\n\n" + decode.stub + "\n\n", True),
                             (decode.stub.replace("raise NotImplementedError()", "return 0.0"),
                              False), ("", False)]:
        cell(nb, "decode").source = source
        assert unattempted(nb, decode) == expected, source
    cell(nb, "decode").source = decode.stub
    twice = copy.deepcopy(cell(nb, "decode"))
    nb.cells.append(twice)  # two cells claim the exercise: judge it again as before
    assert not unattempted(nb, decode)


# ------------------------------------------------------------------ names, zips, pages

XSS_MARKDOWN = ('<script>window.__pwned = "markdown script"</script>\n'
                '<img src="x" onerror="window.__pwned = \'markdown onerror\'">\n'
                '<svg onload="window.__pwned = \'markdown svg\'"></svg>\n\n'
                "<custom>\n[click me](javascript:window.__pwned='link')\n</custom>\n\n"
                # formgrader's template strips a files/ prefix from links after cleaning
                "[files link](files/javascript:window.__pwned='files link') "
                '<a href="files/files/javascript:window.__pwned=1">deeper</a>')
# nbgrader's templates print a cell's grade_id into HTML unescaped (formgrader's grading page)
FORGED_GRADE_IDS = ['"><script>window.__pwned = "grade_id"</script><b x="',
                    'q" autofocus onfocus="window.__pwned = \'onfocus\'" x="']
XSS_OUTPUTS = '''from IPython.display import HTML, SVG, Javascript, Markdown, display
display(HTML("<script>window.__pwned = 'html script'</script>"))
display(HTML("<img src=x onerror=\\"window.__pwned = 'html onerror'\\">"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned = 1"></svg>'))
display(Javascript("window.__pwned = 'javascript'"))
display(Markdown("<img src=y onerror=\\"window.__pwned = 'markdown output'\\">"))
print("\\x1b]0;title\\x07\\x1b[2J cleared?")'''


def deep_folder(root: Path, depth: int) -> Path:
    """``root``/d/d/.../d, ``depth`` deep, past what one path may name (made with dir fds)."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("float_formats.ipynb", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as out:
        out.write("{}")
    os.close(fd)
    return root


@pytest.fixture(scope="module")
def names_batch(tmp_path_factory, shared_tmp):
    """A class folder whose names are bytes, escapes and absurd depths, and one XSS page."""
    import tempfile

    # Outside pytest's own folders: its clean-up recurses, and fails on a tree 1200 deep.
    outside = Path(tempfile.mkdtemp(prefix="ctc-names-"))
    try:
        yield grade_names_batch(tmp_path_factory.mktemp("names"), outside, shared_tmp)
    finally:
        remove_tree(outside)


def grade_names_batch(tmp: Path, outside: Path, shared: Path) -> dict:
    course, submissions = tmp / "course", outside / "submissions"
    released_course([LESSON], shared, course)
    student_version = nbformat.read(course / "release" / LESSON.name / LESSON.notebook.name,
                                    as_version=4)
    submissions.mkdir()
    raw = os.fsencode(submissions)
    for name in (b"caf\xe9", b"esc\x1b[31mred", b"\xe2\x80\xaeevil"):
        os.mkdir(raw + b"/" + name)
        nbformat.write(student_version, os.fsdecode(raw + b"/" + name + b"/float_formats.ipynb"))
    os.mkdir(submissions / "bytes_notebook")
    nbformat.write(student_version, os.fsdecode(os.fsencode(submissions / "bytes_notebook")
                                                + b"/\xff\x1b[2J.ipynb"))
    (submissions / "deep").mkdir()
    deep_folder(submissions / "deep", 1200)
    xss = copy.deepcopy(student_version)
    xss.cells.insert(1, nbformat.v4.new_markdown_cell(XSS_MARKDOWN))
    xss.cells.append(new_code_cell(XSS_OUTPUTS))
    for grade_id, kind in zip(FORGED_GRADE_IDS, ("code", "markdown"), strict=True):
        forged = new_code_cell("x = 1") if kind == "code" else \
            nbformat.v4.new_markdown_cell("an answer")
        forged.metadata["nbgrader"] = {"grade": kind == "code", "task": kind == "markdown",
                                       "solution": False, "locked": False, "points": 1,
                                       "grade_id": grade_id, "schema_version": 3}
        xss.cells.append(forged)
    submit(submissions, "xss", xss, LESSON.notebook.name)
    submit(submissions, "plain", student_version, LESSON.notebook.name)
    done = grader("autograde", LESSON.name, submissions, "--course-dir", course, "--jobs", "2")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    report = grader("report", LESSON.name, "--course-dir", course)
    feedback = grader("feedback", LESSON.name, "--course-dir", course)
    return {"done": done, "report": report, "feedback": feedback, "course": course,
            "csv": (tmp / "grades.csv").read_text(), "grades": read_export(tmp / "grades.csv")}


@NAMES
def test_the_batch_finishes_whatever_the_names(names_batch) -> None:
    assert "of 7" in names_batch["done"].stdout
    grades = names_batch["grades"]
    assert grades[("plain", LESSON.name)]["status"] == "graded"
    assert grades[("xss", LESSON.name)]["status"] in ("graded", "needs_review")
    assert grades[("bytes_notebook", LESSON.name)]["status"] == "needs_review"
    assert grades[("deep", LESSON.name)]["status"] == "invalid"
    assert grades[("caf\\xe9", LESSON.name)]["status"] == "invalid"


@NAMES
def test_what_the_grader_prints_and_writes_is_inert(names_batch) -> None:
    for text in (names_batch["done"].stdout, names_batch["done"].stderr,
                 names_batch["report"].stdout, names_batch["csv"]):
        assert "\x1b" not in text and "\u202e" not in text
    assert "esc\\x1b[31mred" in names_batch["done"].stdout
    assert "\\u202eevil" in names_batch["done"].stdout


@NAMES
def test_feedback_pages_and_formgrader_run_no_student_script(names_batch, tmp_path) -> None:
    """The student's page, opened from a file, and the instructor's grading page in formgrader,
    served by the instructor's Jupyter server: a script there could reach the server's API
    with the instructor's session (kernels, terminals, files)."""
    import shutil as shell

    from nbgrader.api import Gradebook

    chromium = shell.which("chromium") or shell.which("chromium-browser")
    playwright = pytest.importorskip("playwright.sync_api")
    if chromium is None:
        pytest.skip("needs Debian's chromium")
    course = names_batch["course"]
    page_path = course / "feedback" / "xss" / LESSON.name / f"{LESSON.notebook_id}.html"
    html = page_path.read_text()
    assert re.findall(r"<[a-zA-Z][^<>]*\son[a-z]+\s*=", html) == []  # no event handler
    assert [s for s in re.findall(r"<script[^>]*>", html) if "mathjax" not in s.lower()] == []
    assert "javascript:" not in " ".join(re.findall(r"href=[\"'][^\"']*", html))
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        submission = gb.find_submission_notebook(LESSON.notebook_id, LESSON.name, "xss").id
    pwned = {}
    with playwright.sync_playwright() as driver, \
            formgrader(course, tmp_path / "home") as (url, token):
        browser = driver.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(page_path.as_uri())
        page.wait_for_timeout(1500)
        pwned["feedback"] = page.evaluate("() => window.__pwned")
        answer = page.goto(f"{url}/formgrader/submissions/{submission}/?token={token}")
        assert answer.status == 200
        page.wait_for_timeout(1500)
        shown = page.inner_text("body")
        assert "display(Javascript(" in shown and "click me" in shown  # as text
        assert page.locator("#notebook h2").count() > 2  # the lesson's Markdown, as HTML
        assert page.locator("[href^='javascript' i], [src^='javascript' i]").count() == 0
        assert page.locator(".rendered_html :is(script, svg)").count() == 0
        assert page.locator("script[src*='mathjax' i]").count() == 0  # no TeX typeset there
        pwned["formgrader"] = page.evaluate("() => window.__pwned")
        browser.close()
    assert pwned == {"feedback": None, "formgrader": None}


def zipped(path: Path, members: dict[str, bytes | None], links: tuple[str, ...] = ()) -> Path:
    import stat
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            if data is None:
                archive.writestr(zipfile.ZipInfo(name.rstrip("/") + "/"), b"")
            else:
                archive.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return path


@STATE
def test_hostile_zip_members_are_refused_one_by_one(tmp_path) -> None:
    notebook = (LESSON.folder / LESSON.notebook.name).read_bytes()
    members = {
        "alice/float_formats.ipynb": notebook,
        "bob/" + "n" * 300 + ".ipynb": b"{}",
        "carol/x": b"a file", "carol/x/y.ipynb": b"{}",
        "/".join(["dave"] + ["d"] * 1200 + ["float_formats.ipynb"]): b"{}",
        "../escape/float_formats.ipynb": b"{}",
        "__MACOSX/alice/._float_formats.ipynb": b"junk",
        "alice/.ipynb_checkpoints/float_formats-checkpoint.ipynb": b"{}",
        ".DS_Store": b"junk",
    }
    archive = zipped(tmp_path / "class.zip", members, links=("erin/float_formats.ipynb",))
    done = grader("autograde", LESSON.name, archive, "--course-dir", tmp_path / "c", "--jobs",
                  "2")
    assert "refused" in done.stdout and "outside the archive" in done.stdout
    assert "longer than 255 bytes" in done.stdout and "is a link" in done.stdout
    assert not (tmp_path / "escape").exists() and not (tmp_path / "c" / "escape").exists()
    grader("export", "--course-dir", tmp_path / "c", "--csv", tmp_path / "g.csv")
    grades = read_export(tmp_path / "g.csv")
    assert grades[("alice", LESSON.name)]["status"] == "graded"
    assert float(grades[("alice", LESSON.name)]["score"]) == FULL
    assert not any(student.startswith(("__MACOSX", ".")) for student, _ in grades)
    for student in ("bob", "carol", "dave"):
        assert grades[(student, LESSON.name)]["status"] == "invalid", student


@STATE
def test_a_zip_of_one_student_folder_is_that_student(tmp_path) -> None:
    notebook = (LESSON.folder / LESSON.notebook.name).read_bytes()
    one = zipped(tmp_path / "one.zip", {"bob/float_formats.ipynb": notebook})
    nested = zipped(tmp_path / "nested.zip", {"mallory/bob/float_formats.ipynb": notebook})
    for archive, student in ((one, "bob"), (nested, "mallory")):
        course = tmp_path / archive.stem
        grader("autograde", LESSON.name, archive, "--course-dir", course)
        grader("export", "--course-dir", course, "--csv", tmp_path / f"{archive.stem}.csv")
        grades = read_export(tmp_path / f"{archive.stem}.csv")
        assert [s for s, _ in grades] == [student]


# ------------------------------------------------------------------ flags are hints

def test_flags_see_through_renamed_imports_and_getattr() -> None:
    from grader.grading.autograde import scan

    source = nbformat.read(LESSON.notebook, as_version=4)
    for code, flag in [("import os as _o\n_o.listdir('.')", "the file system"),
                       ("o = __import__('o' + 's')", "names built at run time"),
                       ("import subprocess as sp", "subprocesses"),
                       ("from socket import create_connection as c", "the network")]:
        nb = copy.deepcopy(source)
        nb.cells.append(new_code_cell(code))
        assert any(flag in found for found in scan(nb, source)), (code, scan(nb, source))
    assert scan(source, source) == []


def test_flags_read_code_not_prose_and_every_untouched_lesson_is_clean() -> None:
    """A word in a comment, a docstring or a parameter's name reaches for nothing (lesson 08's
    `simulate_serving(requests, ...)` once sent every untouched copy to review), while the same
    word used as code, in an f-string's braces or in a cell with a shell escape still flags."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    from grader.content.lessons import all_lessons
    from grader.grading.autograde import scan

    for lesson in all_lessons():
        source = nbformat.read(lesson.notebook, as_version=4)
        student, _ = ClearSolutions().preprocess(copy.deepcopy(source), {})
        student, _ = ClearHiddenTests().preprocess(student, {})
        assert scan(student, source) == [], lesson.name
    source = nbformat.read(LESSON.notebook, as_version=4)
    prose = ['def serve(requests):\n    """inspect the requests, glob them, signal"""\n'
             '    return len(requests)  # open() the socket of builtins\n',
             "note = 'os.system(1) and sys.modules'\n"]
    code = [("x = f\"{open('/etc/passwd').read()}\"", "the file system"),
            ("!curl http://x\nimport socket", "the network"),
            ("import sys\nsys . modules['x'] = 1", "sys.modules"),
            ("import requests", "the network")]
    for text in prose:
        nb = copy.deepcopy(source)
        nb.cells.append(new_code_cell(text))
        assert scan(nb, source) == [], text
    for text, flag in code:
        nb = copy.deepcopy(source)
        nb.cells.append(new_code_cell(text))
        assert any(flag in found for found in scan(nb, source)), (text, scan(nb, source))
