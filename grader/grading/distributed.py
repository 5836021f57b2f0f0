"""Grading on many machines: Celery workers run the sandbox, the coordinator judges.

``python -m grader worker --broker redis://HOST:PORT/0`` runs on each grading machine; it takes
submissions from the queue, runs each in the same bubblewrap sandbox as local grading, and
sends back the executed notebook and each probe's raw replies as plain JSON (no pickle). It
never sees an expected value or a line of reference code, and it writes no grade:
``python -m grader autograde LESSON SUBMISSIONS --broker URL`` (the coordinator) sanitizes each
submission with nbgrader, sends it, judges the replies against values it computed itself and
writes the gradebook. What must be shared is the broker (Redis) and, where several coordinators
grade one course, the database; nothing else.

Every message is signed with the queue's key (``queue.key``: 32 random bytes that the
coordinator makes in its course directory and each worker is given with ``--queue-key``;
HMAC-SHA256): a worker runs only a task the coordinator signed, and the coordinator accepts only
a result signed for the very task and payload it sent. Anyone who reaches the broker can read
what is queued (keep it behind a password, on a network students cannot reach:
docs/many-machines.md), but cannot make the coordinator judge a result of their own: a forged
or unsigned result is refused and the submission sent again.

Delivery is at least once, grades exactly once: a task is acknowledged only when it is done, so
the broker hands it out again if its worker dies; the coordinator notices a task that no live
worker holds and no queue lists, sends the submission again at once, stores the first result
per student, and after MAX_ATTEMPTS lost tries gives the submission ``needs_review`` rather than
looping. A coordinator started again with ``--resume`` skips what the gradebook already holds
for the same notebook (by its hash).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from celery import Celery

from grader.common.errors import CourseError
from grader.common.faults import is_broker_error
from grader.common.text import text_safe
from grader.content.lessons import Lesson
from grader.grading.autograde import Graded, Prepared, finish, not_graded, run_prepared
from grader.grading.execute import Run, judge_again, verdict_from_replies
from grader.grading.kernel import GradingError
from grader.grading.limits import Limits
from grader.grading.probe import Check, Exercise, Failure, judge, unattempted
from grader.grading.watch import NoWorker, Outage, Watch, broker_name

MAX_ATTEMPTS = 3  # workers a submission may stop before it is given up as needs_review
# The submissions on the queue at once (queued or running): the coordinator sends the next as
# results come in, so the broker holds a bounded number of notebooks (each up to its size
# limit) and each turn of the coordinator reads that many results, not the whole class's. Far
# more than the workers run at once (a worker's --concurrency, one per core), so none waits.
QUEUE_WINDOW = int(os.environ.get("CTC_QUEUE_WINDOW", "128"))
MISSED_LOOKS = 3  # a task neither queued nor held by a live worker this often in a row is lost
TASK = "counting_the_cost.run_submission"


QUEUE_KEY = "queue.key"


def queue_key(path: Path, create: bool = False) -> bytes:
    """The queue's key in ``path`` (made there first with ``create``: the coordinator's), or a
    clear error where there is none."""
    from grader.common.keys import key_file

    key = key_file(path, create, "the queue's key",
                   "copy the coordinator's queue.key (in its course directory) again")
    if key is None:
        raise CourseError(f"no queue key at {path}: give each worker the coordinator's "
                          f"{QUEUE_KEY} (in its course directory, made by the first autograde "
                          "--broker) with --queue-key FILE (docs/many-machines.md)")
    return key


@functools.cache
def grader_version() -> str:
    """A digest of the grader's own code (every module of this package): a worker and its
    coordinator run the same code, or none of the worker's sandbox, probes and replies can be
    trusted to be what the coordinator judges. 8 hex digits."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        inner = path.relative_to(root)
        # the package's modules only: every folder down to the file a package (not, say, a
        # Python file of a build tool under the lab extension's node_modules)
        if all((root.joinpath(*inner.parts[:depth]) / "__init__.py").exists()
               for depth in range(len(inner.parts))):
            digest.update(inner.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:8]


def course_queue(key: bytes) -> str:
    """The course's part of its queues' names: named for the key (a digest that tells nothing
    of it), so that a worker given another course's key, or an old one, never takes this
    course's tasks off the queue (it listens on its own key's queue)."""
    return "ctc-" + hmac.new(key, b"queue name", hashlib.sha256).hexdigest()[:16]


def queue_name(key: bytes) -> str:
    """The broker's queue of the course whose queue key is ``key``, for workers running this
    very grader (``grader_version``): a worker left on another version never takes the
    course's tasks, and the coordinator counts it as such while no worker of its own answers."""
    return f"{course_queue(key)}-{grader_version()}"


def sign(key: bytes, kind: str, task: str, *parts: str) -> str:
    """HMAC-SHA256 of a message of ``kind`` (task, result) for ``task``, over ``parts``."""
    message = "\0".join((kind, task, *parts)).encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def make_app(broker: str, visibility_timeout: int = 3600) -> Celery:
    """The Celery app of both sides: JSON only, late acknowledgement, one task at a time."""
    app = Celery("counting_the_cost", broker=broker, backend=broker)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
        task_track_started=True, result_expires=7 * 86400, broker_connection_retry=True,
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        # A message a worker took but never acknowledged goes back to the queue after this
        # long; the coordinator's own watch on the workers is much quicker.
        broker_transport_options={"visibility_timeout": visibility_timeout},
        result_backend_transport_options={"visibility_timeout": visibility_timeout},
    )
    app.task(name=TASK, bind=True)(_run_task)
    return app


def _run_task(task, body: str, mac: str) -> dict:
    """On a worker: check the task's signature, run the submission in the sandbox, and send
    back every probe's replies, signed for this task and payload."""
    key = task.app.conf.ctc_queue_key
    if not hmac.compare_digest(sign(key, "task", task.request.id, body), str(mac)):
        print(f"refused task {task.request.id}: it is not signed with this worker's queue key "
              "(is this worker's --queue-key the coordinator's queue.key?)", file=sys.stderr)
        result = {"error": "refused by a worker: not signed with its queue key",
                  "worker": socket.gethostname()}
    else:
        result = _run_payload(task, json.loads(body))
    text = json.dumps(result, sort_keys=True)
    digest = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()
    return {"body": text, "mac": sign(key, "result", task.request.id, digest, text)}


def _run_payload(task, payload: dict) -> dict:
    """Run one submission in the sandbox, keep every probe's replies. A task handed out again
    after it stopped this worker's process too often is given up."""
    from nbformat import from_dict

    counter = f"ctc:deliveries:{task.request.id}"
    client = task.app.backend.client
    deliveries = client.incr(counter)
    client.expire(counter, 7 * 86400)
    if deliveries > MAX_ATTEMPTS:
        return {"error": f"this submission stopped a worker's process {deliveries - 1} times; "
                         "not graded", "worker": socket.gethostname()}

    plan = tuple(Exercise(e["name"], 0.0, [Check(x, None, 0.0, 0.0, False)
                                            for x in e["expressions"]])
                 for e in payload["exercises"])
    limits = Limits(**payload["limits"])
    with tempfile.TemporaryDirectory(prefix="ctc-worker-") as tmp:
        files = []
        for name, data in payload["files"].items():
            path = Path(tmp) / Path(name).name
            path.write_bytes(base64.b64decode(data))
            files.append(path)
        from grader.grading.execute import run_submission

        try:
            env = {str(k): str(v) for k, v in dict(payload.get("env", {})).items()}
            run = run_submission(from_dict(payload["notebook"]), files, plan, limits,
                                 use_sandbox=True, raw=True, env=env)
        except GradingError as error:
            return {"error": str(error)[:2000], "worker": socket.gethostname()}
    return {"notebook": text_safe(run.notebook), "replies": run.replies, "lost": run.lost,
            "events": run.events, "seconds": run.seconds, "attempts": run.attempts,
            "skipped": {str(index): why for index, why in run.skipped.items()},
            "worker": socket.gethostname()}


def worker(broker: str, concurrency: int, visibility_timeout: int, key_path: Path) -> int:
    """Run a worker until it is stopped (Ctrl-C, SIGTERM)."""
    app = make_app(broker, visibility_timeout)
    app.conf.ctc_queue_key = queue_key(key_path)
    app.conf.task_default_queue = queue_name(app.conf.ctc_queue_key)
    print(f"grader version {grader_version()}: this worker takes the tasks of coordinators "
          "running the same version only", flush=True)
    # A name of its own per worker, also beside others on one machine: the coordinator's look
    # at what the workers hold keeps one answer per name, and would lose the others' tasks.
    app.worker_main(["worker", "--loglevel=INFO", f"--concurrency={concurrency}",
                     "--pool=prefork", f"--hostname=ctc-{os.getpid()}@%h",
                     f"--queues={app.conf.task_default_queue}",
                     "--without-gossip", "--without-mingle"])
    return 0


# ------------------------------------------------------------------ the coordinator


@dataclass
class Sent:
    """A submission on the queue: what was sent (the payload's JSON text), under which task,
    how often."""

    prepared: Prepared
    payload: str
    attempt: int = 1
    task_id: str = ""
    lost_tasks: list[str] = field(default_factory=list)
    sent_at: float = 0.0  # time.monotonic() when last sent


def payload_for(prepared: Prepared, lesson: Lesson, limits: Limits) -> str:
    """What a worker needs, as JSON text: the sanitized notebook, the check expressions, the
    lesson's data files, the limits and the kernel's variables (the student's variants). No
    expected value, no reference code, no course key."""
    return json.dumps({
        "lesson": lesson.name, "student": prepared.student_id,
        "notebook": prepared.notebook,
        "exercises": [{"name": e.name, "expressions": [c.expression for c in e.checks]}
                      for e in prepared.plan],
        "files": {name: base64.b64encode((lesson.folder / name).read_bytes()).decode()
                  for name in lesson.data_files},
        "limits": asdict(limits), "env": prepared.env(),
    }, sort_keys=True)


def opened(key: bytes, sent: Sent, task: str, reply: object) -> dict | None:
    """A worker's reply for ``task``, if it is signed with the queue's key for this very task
    and payload; None for a forged, unsigned or mangled one."""
    if not isinstance(reply, dict) or not isinstance(reply.get("body"), str) \
            or not isinstance(reply.get("mac"), str):
        return None
    digest = hashlib.sha256(sent.payload.encode("utf-8", "surrogatepass")).hexdigest()
    if not hmac.compare_digest(sign(key, "result", task, digest, reply["body"]), reply["mac"]):
        return None
    try:
        result = json.loads(reply["body"])
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def judge_result(prepared: Prepared, result: dict, lesson: Lesson, partial: bool,
                 limits: Limits, use_sandbox: bool) -> Graded:
    """Judge a worker's replies here. An exercise that failed only through an earlier failed
    exercise it builds on is judged again with the course's version of that one: that run
    happens here, in this machine's own sandbox, so that reference code never leaves it."""
    if "error" in result:
        return not_graded(prepared, f"grading error on a worker: {result['error']}")
    events = list(result.get("events", []))
    verdicts = {}
    own = prepared.plan
    for exercise in own:
        if exercise.name in result.get("lost", {}):
            failure = Failure(str(result["lost"][exercise.name]))
            verdicts[exercise.name] = judge(exercise, [failure] * len(exercise.checks), partial)
            continue
        bodies = result.get("replies", {}).get(exercise.name)
        if bodies is None:
            failure = Failure("not graded: the notebook did not get this far in time")
            verdicts[exercise.name] = judge(exercise, [failure] * len(exercise.checks), partial)
            continue
        verdicts[exercise.name], more = verdict_from_replies(exercise, list(bodies), partial)
        if more:
            events.append(more)
    plan = {e.name: e for e in own}
    if any(v.points < plan[name].points and any(verdicts[d].points < plan[d].points
                                                for d in plan[name].depends)
           and not unattempted(prepared.notebook, plan[name])
           for name, v in verdicts.items()):
        # Judged again here, in this machine's sandbox: the course's code stays here.
        try:
            skipped = {int(index): str(why) for index, why in result["skipped"].items()}
            seconds = float(result.get("seconds", 0))
        except (KeyError, TypeError, ValueError, AttributeError):  # an older worker's result
            return run_prepared(prepared, lesson, limits, use_sandbox, partial)
        files = [lesson.folder / name for name in lesson.data_files]
        try:
            verdicts, more_events = judge_again(prepared.notebook, files, own, limits,
                                                use_sandbox, partial, verdicts, skipped,
                                                seconds, prepared.env())
        except GradingError as error:
            return not_graded(prepared, f"grading error: {error}")
        events += [e for e in more_events if e not in events]
    from nbformat import from_dict

    run = Run(from_dict(result["notebook"]), verdicts, events, float(result.get("seconds", 0)),
              int(result.get("attempts", 1)))
    return finish(prepared, run, lesson)


def task_id(lesson: Lesson, sent: Sent) -> str:
    """A task id of its own per try: a result is never taken from another batch or course."""
    return f"ctc-{lesson.name}-{sent.prepared.student_id}-{uuid.uuid4().hex[:16]}"


def grade_on_workers(app: Celery, lesson: Lesson, prepared: Iterable[Prepared], limits: Limits,
                     partial: bool, use_sandbox: bool, done: Callable[[Graded], None],
                     log: Callable[[str], None], judges: int = 1, key: bytes = b"",
                     start_worker: str = "") -> None:
    """Send the prepared submissions to the queue (QUEUE_WINDOW on it at once, the next as
    results come in) and judge each result as it arrives, calling
    ``done`` once per student, from this thread. Up to ``judges`` results are judged at once (a
    judgement may run kernels here, to judge exercises again with the course's code). A thread
    asks the live workers every few seconds what they hold and reads the queue; a submission in
    neither (its worker died) is sent again. While no worker has answered, it says so every
    NO_WORKER_SECONDS, with ``start_worker`` (the command that starts one), and waits on."""
    waiting: dict[str, Sent] = {}
    broker = Outage(app, log)
    app.conf.ctc_queue_key = key
    app.conf.ctc_course_queue, app.conf.ctc_grader_version = course_queue(key), grader_version()
    app.conf.task_default_queue = queue_name(key)
    unsent = iter(prepared)
    last: list[Prepared | None] = []  # the next to send, once taken from ``unsent``

    def fill() -> None:
        """Send the next submissions while fewer than QUEUE_WINDOW are on the queue."""
        while len(waiting) < max(1, QUEUE_WINDOW):
            if not last:
                last.append(next(unsent, None))
            if last[0] is None:
                return
            sent = Sent(last[0], payload_for(last[0], lesson, limits))
            broker.patiently(lambda sent=sent: _send(app, lesson, sent, log))
            last.clear()
            waiting[sent.task_id] = sent

    fill()

    def again(sent: Sent, why: str, given_up: Callable[[int], str]) -> None:
        """Send a lost submission again, or give it up after MAX_ATTEMPTS tries."""
        sent.lost_tasks.append(sent.task_id)
        if len(sent.lost_tasks) >= MAX_ATTEMPTS:
            done(Graded(sent.prepared.student_id, "needs_review",
                        [given_up(len(sent.lost_tasks))]))
            return
        log(f"{sent.prepared.student_id}: {why}; sending it again")
        sent.attempt += 1
        broker.patiently(lambda: _send(app, lesson, sent, log))
        waiting[sent.task_id] = sent

    def judged(future: Future, sent: Sent) -> Graded:
        try:
            return future.result()
        except Exception as error:  # a bug of ours must not stop the batch
            return Graded(sent.prepared.student_id, "needs_review",
                          [f"grading error: {type(error).__name__}: {error}"[:500]])

    missing: dict[str, int] = {}
    judging: dict[Future, Sent] = {}
    watch = Watch(app)
    watch.start()
    lonely = NoWorker(watch, log, broker_name(app), start_worker)
    try:
        with ThreadPoolExecutor(max_workers=max(1, judges)) as pool:
            while waiting or judging or last != [None]:
                time.sleep(0.3)
                lonely.look(bool(judging))
                for future in [f for f in judging if f.done()]:
                    done(judged(future, judging.pop(future)))
                if not broker.answers():
                    continue  # the broker is away: wait for it (within a bound), then look
                try:  # the broker may go away mid-look: the next turn waits for it
                    if broker.recovered:  # what it held may be gone with it: send it again
                        for task in list(waiting):
                            if app.AsyncResult(task).state != "SUCCESS":
                                sent = waiting.pop(task)
                                broker.patiently(lambda sent=sent: _send(app, lesson, sent,
                                                                         log))
                                waiting[sent.task_id] = sent
                                missing.pop(task, None)
                        broker.recovered = False
                    for task, sent in list(waiting.items()):
                        state, reply, failure = _read_result(app, key, sent, task)
                        if state == "SUCCESS":
                            if reply is None:  # forged, or a worker with another key
                                app.control.revoke(task)
                                again(waiting.pop(task), "its result is not signed with this "
                                      "course's queue key (forged, or a worker given another "
                                      "--queue-key): refused",
                                      lambda n: f"{n} results for it were not signed with the "
                                                "queue's key (a forged result, or workers with "
                                                "another --queue-key); not graded")
                                continue
                            del waiting[task]
                            judging[pool.submit(judge_result, sent.prepared, reply, lesson,
                                                partial, limits, use_sandbox)] = sent
                        elif state == "FAILURE":  # the worker's process died under it, say
                            again(waiting.pop(task), f"a worker failed on it ({failure})",
                                  lambda n, failure=failure: f"it stopped a worker's process {n} "
                                                             f"times ({failure}); not graded")
                    for started, accounted in watch.looks():
                        for task in list(waiting):
                            if waiting[task].sent_at >= started:  # sent after the look began
                                continue
                            missing[task] = 0 if task in accounted else missing.get(task, 0) + 1
                            if (missing[task] < MISSED_LOOKS
                                    or _read_result(app, key, waiting[task], task)[0]
                                    == "SUCCESS"):
                                continue
                            app.control.revoke(task)
                            again(waiting.pop(task), "the worker running it stopped answering",
                                  lambda n: f"its grading was lost with {n} workers; not graded")
                    fill()
                except Exception as error:
                    if not is_broker_error(error):
                        raise
    finally:
        watch.stop()


def _read_result(app: Celery, key: bytes, sent: Sent, task: str,
                 ) -> tuple[str, dict | None, str]:
    """A task's state, its reply opened (None unless signed for this task and payload) and,
    for a failure, what it said. Whatever someone wrote under the task's key on the broker
    (an exception of their choosing, bytes that are not JSON) reads as a forged result, never
    as an error of the coordinator's."""
    result = app.AsyncResult(task)
    try:
        state = result.state
        if state == "SUCCESS":
            return state, opened(key, sent, task, result.get(timeout=30)), ""
        if state == "FAILURE":
            return state, None, str(result.result)[:200]
        return state, None, ""
    except Exception as error:
        if is_broker_error(error):
            raise
        return "SUCCESS", None, ""  # unreadable: refused as a forged result is


def _send(app: Celery, lesson: Lesson, sent: Sent, log: Callable[[str], None]) -> None:
    """Queue ``sent`` under a new task id."""
    sent.task_id = task_id(lesson, sent)
    sent.sent_at = time.monotonic()
    mac = sign(app.conf.ctc_queue_key, "task", sent.task_id, sent.payload)
    app.send_task(TASK, args=[sent.payload, mac], task_id=sent.task_id)
