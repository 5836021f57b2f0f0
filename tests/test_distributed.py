"""Grading past one machine: a PostgreSQL gradebook shared by two graders, Celery workers on a
Redis broker (one killed mid-batch), LMS exports, partial credit, feedback zips.

Real servers (Debian's postgresql and redis-server: the test run's one of each, tests/conftest.py,
each test on a database of its own), real workers as separate processes, everything through the
instructors' command line. Two workers serve every test that needs live workers beside each
other (started once for the module); the tests whose worker is killed or must start late start
their own.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from grader.content.lessons import load_lesson
from grader.grading.sandbox import bwrap_path
from tests import servers
from tests.grading_helpers import (
    REPO,
    cell,
    graded_class,
    grader,
    grader_env,
    grader_process,
    in_process,
    points,
    read_export,
    released_course,
    start_worker,
    stop,
    submit,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(bwrap_path() is None, reason="grading needs bubblewrap")]

FLOATS = load_lesson("01_float_formats")
BACKPROP = load_lesson("04_backprop_flops")
WRONG = {"01_float_formats": ("machine_epsilon", "def machine_epsilon(fmt):\n"
                              "    return 2.0 ** -(fmt.mantissa_bits + 1)"),
         "04_backprop_flops": ("training_days", "def training_days(total_flops, n_gpus, "
                               "peak_flops, mfu):\n    return total_flops / (n_gpus * peak_flops)")}


def class_of(lesson, folder: Path, students: int = 3) -> dict[str, float]:
    """A small class for ``lesson``: the instructor version, the untouched student version (when
    released into ``folder / 'course'``) and one wrong answer; returns each student's score."""
    instructor = nbformat.read(lesson.notebook, as_version=4)
    full = sum(points(instructor).values())
    name, source = WRONG[lesson.name]
    wrong = copy.deepcopy(instructor)
    cell(wrong, name).source = source
    expected = {}
    for i in range(students):
        nb, score = (instructor, full) if i % 2 == 0 else (wrong, full - points(instructor)[name])
        submit(folder, f"s{i:02d}", nb, lesson.notebook.name)
        expected[f"s{i:02d}"] = score
    return expected


def test_two_graders_at_once_share_one_postgres_gradebook(postgres_database, tmp_path) -> None:
    """Two autograde commands, two lessons, one course, at the same time: no grade lost, none
    duplicated, every student graded with the score their notebook earns (what grading one
    after the other gives: tests/test_grading.py grades each lesson's instructor version and
    one wrong answer alone). One runs in a process of its own, the other in this one meanwhile
    (it has paid the grader's imports already)."""
    classes = {lesson.name: tmp_path / lesson.name for lesson in (FLOATS, BACKPROP)}
    expected = {lesson.name: class_of(lesson, classes[lesson.name])  # full, wrong, full
                for lesson in (FLOATS, BACKPROP)}
    full = {lesson.name: sum(points(nbformat.read(lesson.notebook, as_version=4)).values())
            for lesson in (FLOATS, BACKPROP)}
    together = postgres_database
    course = tmp_path / "course"
    grader("release", FLOATS.name, BACKPROP.name, "--course-dir", course, "--db-url", together)
    running = grader_process("autograde", FLOATS.name, classes[FLOATS.name], "--jobs", "1",
                             "--course-dir", course, "--db-url", together,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        here = in_process("autograde", BACKPROP.name, classes[BACKPROP.name], "--jobs", "1",
                          "--course-dir", course, "--db-url", together)
        _, err = running.communicate(timeout=900)
    finally:
        if running.poll() is None:
            running.kill()
    assert here.returncode == 0, here.stderr
    assert running.returncode == 0, err
    grader("export", "--course-dir", course, "--db-url", together, "--csv", tmp_path / "1.csv")
    got = read_export(tmp_path / "1.csv")
    assert len(got) == sum(len(e) for e in expected.values())  # nothing lost, nothing twice
    for lesson, scores in expected.items():
        for student, score in scores.items():
            row = got[(student, lesson)]
            assert (float(row["score"]), float(row["max_score"]), row["status"]) == \
                (score, full[lesson], "graded"), (student, lesson)


def test_graders_of_two_lessons_adding_one_student_at_once_both_keep_their_grades(
        postgres_database, tmp_path) -> None:
    """Two graders of different lessons reach a new student at the same instant: both insert
    the student, one insert loses to the other's key, and that grader tries again instead of
    recording a failure (once, two graders at once lost grades this way)."""
    import threading

    from grader.course import Course

    url = postgres_database
    courses = [(Course(tmp_path / lesson.name, log=lambda _: None, database=url), lesson)
               for lesson in (FLOATS, BACKPROP)]
    from grader.content.variants import KEY_FILE

    for number, (course, lesson) in enumerate(courses):
        if number:  # two coordinators of one database share the course's key (docs say how)
            (course.root / KEY_FILE).write_bytes((courses[0][0].root / KEY_FILE).read_bytes())
            (course.root / KEY_FILE).chmod(0o600)
        course.release(lesson)
    errors = []

    def zero(course, lesson, student: str, barrier: threading.Barrier) -> None:
        from grader.grading.autograde import Graded

        barrier.wait()
        try:  # stored with no points, as a hand-in with no notebook is
            course.store(lesson, Graded(student, "invalid", ["no notebook"]))
        except Exception as error:  # what the race raised, to report
            errors.append(f"{student}: {error!r}"[:200])

    for i in range(20):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=zero, args=(course, lesson, f"race{i}", barrier))
                   for course, lesson in courses]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    with courses[0][0].gradebook() as gb:
        for i in range(20):
            assert {s.assignment.name for s in gb.find_student(f"race{i}").submissions} == {
                FLOATS.name, BACKPROP.name}


def start_coordinator(broker: str, tmp_path: Path) -> subprocess.Popen:
    """``autograde`` of tmp_path/class on the workers of ``broker``, in the background."""
    return grader_process("autograde", FLOATS.name, tmp_path / "class", "--course-dir",
                          tmp_path / "course", "--broker", broker, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def course_at(tmp_path: Path, shared_tmp: Path) -> Path:
    """tmp_path/course: lesson 01 released (a copy of the test run's release)."""
    return released_course([FLOATS], shared_tmp, tmp_path / "course")


def queue_key_of(course: Path) -> Path:
    from grader.grading.distributed import QUEUE_KEY

    return course / QUEUE_KEY


@dataclass
class Workers:
    """Workers that serve several tests: their broker, the queue key each was given (a copy
    goes into each test's course directory, as to a second coordinator), their logs."""

    broker: str
    key: Path
    logs: list[Path]

    def course(self, tmp_path: Path, shared_tmp: Path) -> Path:
        course = course_at(tmp_path, shared_tmp)
        shutil.copyfile(self.key, queue_key_of(course))
        queue_key_of(course).chmod(0o600)
        return course


@pytest.fixture(scope="module")
def workers(redis_server, shared_tmp, tmp_path_factory):
    """Two workers on a broker database of their own, ready, for the tests that grade on
    workers beside each other (each pays the grader's imports once, not once a test). A test
    that kills a worker starts its own beside them; one that needs no worker running while it
    queues (forged results) or a single worker whose process keeps dying (the poisoned
    submission) starts its own on a database of its own."""
    broker = redis_server.url.format(db=servers.next_number(shared_tmp / "redis-databases"))
    folder = tmp_path_factory.mktemp("workers")
    logs = [folder / "worker-a.log", folder / "worker-b.log"]
    started = [start_worker(broker, log, folder / "queue.key") for log in logs]
    try:
        wait_for(lambda: all("ready" in log.read_text() for log in logs), 60, "workers")
        yield Workers(broker, folder / "queue.key", logs)
    finally:
        for worker in started:
            stop(worker)


def test_workers_grade_a_class_and_a_worker_killed_mid_batch_loses_nothing(workers, tmp_path,
                                                                           shared_tmp) -> None:
    """The module's two workers and one of this test's own, killed as soon as it is on a
    submission: the coordinator sends that submission again, and the others grade it."""
    course = workers.course(tmp_path, shared_tmp)
    expected = class_of(FLOATS, tmp_path / "class")  # full, wrong, full
    # decode fails through a wrong split_bits: the coordinator judges it again, in its sandbox.
    instructor = nbformat.read(FLOATS.notebook, as_version=4)
    cell(instructor, "split_bits").source = "def split_bits(bits, fmt):\n    return (0, 0, 0)"
    submit(tmp_path / "class", "s_dep", instructor, FLOATS.notebook.name)
    expected["s_dep"] = sum(points(instructor).values()) - points(instructor)["split_bits"]
    log = tmp_path / "worker-killed.log"
    killed = start_worker(workers.broker, log, queue_key_of(course))
    try:
        wait_for(lambda: "ready" in log.read_text(), 60, "the worker to kill")
        coordinator = start_coordinator(workers.broker, tmp_path)
        wait_for(lambda: "received" in log.read_text(), 120, "its first task")
        time.sleep(1.0)  # mid-submission
        stop(killed)
        out, err = coordinator.communicate(timeout=900)
        assert coordinator.returncode == 0, err
        assert "the worker running it stopped answering; sending it again" in out
        assert "4 graded, 0 needs_review, 0 invalid of 4" in out
    finally:
        stop(killed)
    grader("export", "--course-dir", course, "--csv", tmp_path / "g.csv")
    got = read_export(tmp_path / "g.csv")
    assert {s: float(r["score"]) for (s, _), r in got.items()} == expected
    status = json.loads((course / "grading_status.json").read_text())
    assert len(status[FLOATS.name]) == 4
    decode = status[FLOATS.name]["s_dep"]["exercises"]["decode"]
    assert decode.get("note") == "passes with a correct `split_bits`", decode


def test_two_workers_on_one_machine_each_keep_their_long_submission(workers, tmp_path,
                                                                     shared_tmp) -> None:
    """Two workers beside each other, each on a submission that runs for many of the
    coordinator's looks: neither is taken for lost and sent again (workers that shared one
    name once did, the look keeping one answer per name)."""
    workers.course(tmp_path, shared_tmp)
    instructor = nbformat.read(FLOATS.notebook, as_version=4)
    from grader.grading.distributed import MISSED_LOOKS
    from grader.grading.watch import LOOK_SECONDS

    # 8 s and the notebook's own 3: five looks, past the missed looks in a row that send a
    # task again
    assert MISSED_LOOKS * LOOK_SECONDS < 8
    instructor.cells.append(nbformat.v4.new_code_cell("import time\ntime.sleep(8)"))
    for student in ("slow_a", "slow_b"):
        submit(tmp_path / "class", student, instructor, FLOATS.notebook.name)
    names = {re.search(r"(ctc-\S+@\S+) ready", log.read_text()).group(1)
             for log in workers.logs}
    assert len(names) == 2  # each worker answers under a name of its own
    out, err = start_coordinator(workers.broker, tmp_path).communicate(timeout=600)
    assert "sending it again" not in out, out
    assert "2 graded, 0 needs_review, 0 invalid of 2" in out, (out, err)


def test_a_batch_with_no_worker_says_so_with_the_command_then_a_worker_grades_it(
        broker, tmp_path, shared_tmp) -> None:
    """A coordinator started before any worker of its own (or whose workers all failed to
    start) says, within its wait (a minute; 3 s here), that no worker has answered and the
    exact command that starts one, says it again while none comes, and waits on. A worker
    given another course's queue key listens on that course's queue: it never takes this
    course's tasks (once, it took them and answered "refused", and two of three students
    ended needs_review as if forged), and the notice counts it. So is a worker with this
    course's key left on another version of the grader (a machine not upgraded: its sandbox,
    probes and replies may not be what the coordinator judges). The queue is bounded
    (CTC_QUEUE_WINDOW, 1 here): while none grades, one of the class's two is on it. The
    worker started with the printed command grades the class (the second sent as the first
    is done), and the coordinator says that one answers now."""
    import shlex

    from grader.grading.distributed import grader_version, make_app, queue_key, queue_name

    course = course_at(tmp_path, shared_tmp)
    expected = class_of(FLOATS, tmp_path / "class", students=2)
    queue_key(tmp_path / "other-course.key", create=True)
    stranger = start_worker(broker, tmp_path / "stranger.log", tmp_path / "other-course.key")
    old = tmp_path / "old-checkout"  # the grader as it was before a change to one module
    shutil.copytree(REPO / "grader", old / "grader",
                    ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    with (old / "grader" / "grading" / "probe.py").open("a") as module:
        module.write("\n# (as it was before the change)\n")
    unchanged = start_worker(broker, tmp_path / "old.log", queue_key_of(course), cwd=old)
    for log in ("stranger.log", "old.log"):
        wait_for(lambda log=log: "ready" in (tmp_path / log).read_text(), 60, log)
    [old_version] = re.findall(r"grader version (\w+):", (tmp_path / "old.log").read_text())
    assert old_version != grader_version()
    log = tmp_path / "coordinator.log"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "grader", "autograde", FLOATS.name, str(tmp_path / "class"),
         "--course-dir", str(course), "--broker", broker], cwd=REPO,
        env={**grader_env(), "CTC_NO_WORKER_SECONDS": "3", "CTC_QUEUE_WINDOW": "1"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT, text=True)
    worker = None
    try:
        # said again while none comes; the stranger and the old one counted once the
        # coordinator has looked
        wait_for(lambda: log.read_text().count("no worker has answered") >= 2
                 and "(1 worker(s) answer with another queue key: is their --queue-key this "
                     "course's queue.key?) (1 worker(s) of this course run another version of "
                     f"the grader: install this one (version {grader_version()}) on their "
                     "machines and start them again)" in log.read_text(), 60,
                 "the coordinator to say twice that no worker of its own answers")
        said = log.read_text()
        assert f"no worker has answered on the broker ({broker})" in said
        [command] = {line.strip() for line in said.splitlines()
                     if line.strip().startswith("python -m grader worker ")}
        argv = shlex.split(command)
        assert argv[4:6] == ["--broker", broker] and argv[6] == "--queue-key"
        assert Path(argv[7]) == (course / "queue.key").resolve()
        assert "still waiting (Ctrl-C stops the batch; --resume" in said
        queued = make_app(broker).backend.client.llen(queue_name(queue_key(course /
                                                                           "queue.key")))
        assert queued == 1, queued  # the window's one, not the whole class
        worker = subprocess.Popen([sys.executable, *argv[1:], "--concurrency", "1"], cwd=REPO,
                                  env=grader_env(), stdout=(tmp_path / "worker.log").open("w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        assert coordinator.wait(timeout=300) == 0, log.read_text()
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        if worker is not None:
            stop(worker)
        stop(stranger)
        stop(unchanged)
    said = log.read_text()
    assert "a worker answers now (" in said and "2 graded, 0 needs_review" in said, said
    assert "sending it again" not in said
    for other in ("stranger.log", "old.log"):
        other_said = (tmp_path / other).read_text()
        assert "refused task" not in other_said and "received" not in other_said, other_said
    grader("export", "--course-dir", course, "--csv", tmp_path / "g.csv")
    got = read_export(tmp_path / "g.csv")
    assert {s: float(r["score"]) for (s, _), r in got.items()} == expected


def test_a_forged_result_on_the_broker_is_refused_and_the_submission_sent_again(
        broker, tmp_path, shared_tmp) -> None:
    """Someone who reaches the broker reads each queued task and writes a result of their own
    under its id before any worker runs it: an unsigned one in the form of a worker's reply,
    one with a made-up signature, a failure whose exception is a function of their choosing,
    bytes that are not JSON (two of these for each of two students: their first tasks, then
    the tasks sent again). The coordinator refuses each, says so, sends the submission again,
    and stores the grade a real worker's signed result gives."""
    from grader.grading.distributed import make_app

    course = course_at(tmp_path, shared_tmp)
    expected = class_of(FLOATS, tmp_path / "class", students=2)  # full, wrong
    app = make_app(broker)
    client = app.backend.client
    forgeries = [
        lambda task: app.backend.store_result(task, {
            "notebook": {}, "replies": {}, "lost": {}, "events": [], "seconds": 1.0,
            "attempts": 1, "skipped": {}, "worker": "mallory"}, "SUCCESS"),
        lambda task: app.backend.store_result(task, {"body": json.dumps({"error": "x"}),
                                                     "mac": "0" * 64}, "SUCCESS"),
        lambda task: client.set(f"celery-task-meta-{task}", json.dumps({
            "status": "FAILURE", "task_id": task, "traceback": None, "children": [],
            "result": {"exc_type": "system", "exc_module": "os", "exc_message": ["true"]}})),
        lambda task: client.set(f"celery-task-meta-{task}", b"\x80not json"),
    ]
    coordinator = start_coordinator(broker, tmp_path)
    forged: list[str] = []
    log = tmp_path / "worker.log"
    worker = None
    try:
        from grader.grading.distributed import queue_key, queue_name

        deadline = time.monotonic() + 300
        wait_for(lambda: queue_key_of(course).exists(), 120, "the coordinator's queue key")
        name = queue_name(queue_key(queue_key_of(course)))  # the course's own queue
        while len(forged) < len(forgeries) and time.monotonic() < deadline:
            for raw in client.lrange(name, 0, -1):
                task = json.loads(raw)["headers"]["id"]
                if task not in forged:
                    forgeries[len(forged)](task)
                    forged.append(task)
            time.sleep(0.1)
        assert len(forged) == len(forgeries), "no task to forge a result for"
        worker = start_worker(broker, log, queue_key_of(course))  # none ran before the forgeries
        out, err = coordinator.communicate(timeout=600)
    finally:
        if worker is not None:
            stop(worker)
        if coordinator.poll() is None:
            coordinator.kill()
    assert coordinator.returncode == 0, err
    assert out.count("is not signed with this course's queue key") == 4, out
    assert "2 graded, 0 needs_review, 0 invalid of 2" in out, out
    grader("export", "--course-dir", tmp_path / "course", "--csv", tmp_path / "g.csv")
    got = read_export(tmp_path / "g.csv")
    assert {s: float(r["score"]) for (s, _), r in got.items()} == expected


def test_a_worker_refuses_a_task_not_signed_with_its_key(tmp_path) -> None:
    """A task signed with another key (a worker given the wrong --queue-key, or a task put on
    the queue by someone else) is not run: the worker's reply says so, signed with its own
    key, which the coordinator in turn refuses."""
    from types import SimpleNamespace

    from grader.grading.distributed import _run_task, sign

    ours, theirs = bytes(32), bytes(range(32))
    task = SimpleNamespace(request=SimpleNamespace(id="ctc-x"),
                           app=SimpleNamespace(conf=SimpleNamespace(ctc_queue_key=ours)))
    body = json.dumps({"notebook": {}})
    reply = _run_task(task, body, sign(theirs, "task", "ctc-x", body))
    assert json.loads(reply["body"])["error"].startswith("refused by a worker")
    digest = __import__("hashlib").sha256(body.encode()).hexdigest()
    assert reply["mac"] == sign(ours, "result", "ctc-x", digest, reply["body"])
    assert reply["mac"] != sign(theirs, "result", "ctc-x", digest, reply["body"])


def running_pid(app, key: bytes) -> int | None:
    """The pid of the worker process running the task stored under ``key``, if it runs."""
    meta = json.loads(app.backend.client.get(key) or "{}")
    result = meta.get("result")
    if meta.get("status") == "STARTED" and isinstance(result, dict):
        return result.get("pid")
    return None


def is_worker(pid: int) -> bool:
    """Whether ``pid`` is (still) a grading worker's process: never kill a reused pid."""
    try:
        return b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_a_submission_that_keeps_killing_worker_processes_is_given_up(broker, tmp_path,
                                                                      shared_tmp) -> None:
    """Each time a worker's process takes the poisoned submission, it is killed (as a grader bug
    or the machine's OOM killer would): after three tries it is needs_review, not a loop. One
    worker of its own, one submission at a time: with two, a try sent again and a try handed
    back by the broker would run at once, and the kills would no longer count the tries."""
    from grader.grading.distributed import make_app

    course = course_at(tmp_path, shared_tmp)
    class_of(FLOATS, tmp_path / "class", students=1)
    log = tmp_path / "worker.log"
    worker = start_worker(broker, log, queue_key_of(course))
    app = make_app(broker)
    killed: set[int] = set()
    try:
        wait_for(lambda: "ready" in log.read_text(), 60, "the worker")
        coordinator = start_coordinator(broker, tmp_path)
        deadline = time.monotonic() + 600
        while coordinator.poll() is None and time.monotonic() < deadline:
            for task in app.backend.client.keys("celery-task-meta-ctc-*"):
                started = running_pid(app, task)
                if started and started not in killed and is_worker(started):
                    time.sleep(0.5)  # mid-submission
                    if running_pid(app, task) == started:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(started, signal.SIGKILL)
                        killed.add(started)
            time.sleep(0.2)
        out, err = coordinator.communicate(timeout=60)
    finally:
        stop(worker)
    assert len(killed) == 3, (killed, out, err)
    assert "0 graded, 1 needs_review, 0 invalid of 1" in out, out + err
    grader("export", "--course-dir", tmp_path / "course", "--csv", tmp_path / "g.csv")
    row = read_export(tmp_path / "g.csv")[("s00", FLOATS.name)]
    assert "stopped a worker's process 3 times" in row["reason"], row


def test_a_coordinator_started_again_does_not_grade_again_what_is_stored(tmp_path,
                                                                       shared_tmp) -> None:
    """The class graded once for the test run (tests/grading_helpers.graded_class: four
    students, one flagged), copied; one more hand-in arrives while the coordinator is away:
    run again with --resume, it grades that one alone."""
    graded = graded_class(FLOATS, shared_tmp)
    course = tmp_path / "course"
    shutil.copytree(graded["course"], course, symlinks=True)
    shutil.copytree(graded["class"], tmp_path / "class")
    first = json.loads((course / "grading_status.json").read_text())[FLOATS.name]
    assert set(first) == {"s1", "s2", "s3", "s4"}
    submit(tmp_path / "class", "s5", nbformat.read(FLOATS.notebook, as_version=4),
           FLOATS.notebook.name)  # arrived while the coordinator was away
    done = grader("autograde", FLOATS.name, tmp_path / "class", "--course-dir", course,
                  "--resume")
    assert done.stdout.count("is graded already (--resume)") == 4
    assert "1 graded" in done.stdout
    again = json.loads((course / "grading_status.json").read_text())[FLOATS.name]
    assert {s: again[s]["seconds"] for s in first} == {s: first[s]["seconds"] for s in first}
    assert set(again) == {*first, "s5"}


# ------------------------------------------------------------------ grades where the class lives


def test_partial_credit_scores_the_fraction_of_checks_and_everything_agrees(tmp_path,
                                                                           shared_tmp) -> None:
    half_right = nbformat.read(FLOATS.notebook, as_version=4)
    cell(half_right, "machine_epsilon").source = (  # right for every format but the fp8 ones
        "def machine_epsilon(fmt):\n    return 2.0 ** -fmt.mantissa_bits if fmt.mantissa_bits > 3 "
        "else 0.5")
    submit(tmp_path / "class", "s01", half_right, FLOATS.notebook.name)
    course = course_at(tmp_path, shared_tmp)
    grader("autograde", FLOATS.name, tmp_path / "class", "--course-dir", course,
           "--partial-credit")
    record = json.loads((course / "grading_status.json").read_text())[FLOATS.name]["s01"]
    epsilon = record["exercises"]["machine_epsilon"]
    assert 0 < epsilon["passed"] < epsilon["total"]
    fraction = epsilon["max_points"] * epsilon["passed"] / epsilon["total"]
    assert epsilon["points"] == pytest.approx(fraction)
    grader("export", "--course-dir", course, "--csv", tmp_path / "g.csv")
    full = sum(points(nbformat.read(FLOATS.notebook, as_version=4)).values())
    score = float(read_export(tmp_path / "g.csv")[("s01", FLOATS.name)]["score"])
    assert score == pytest.approx(full - epsilon["max_points"] + fraction)
    grader("feedback", FLOATS.name, "--course-dir", course, "--zip")
    page = (course / "feedback" / "s01" / FLOATS.name / f"{FLOATS.notebook_id}.html").read_text()
    assert f"machine_epsilon: {fraction:g} of" in page
    assert (course / "feedback-zips" / FLOATS.name / "s01.zip").exists()
