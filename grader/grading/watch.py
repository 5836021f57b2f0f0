"""What the coordinator of a batch on workers watches, in threads of its own or between its
looks at the results: the broker's absences (``Outage``), which tasks the queue lists and the
live workers hold (``Watch``, for grader/grading/distributed.py's lost-worker rule), and
whether any worker of this course's queue has answered at all (``NoWorker``)."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable

from celery import Celery

from grader.common.faults import WAIT_SECONDS, Unavailable, describe, is_broker_error
from grader.common.text import inert

LOOK_SECONDS = 2.0
# How long a batch waits for a first worker before it says that none answers, and how often it
# says so again while none comes (CTC_NO_WORKER_SECONDS: the tests' is a few seconds).
NO_WORKER_SECONDS = float(os.environ.get("CTC_NO_WORKER_SECONDS", "60"))


class Outage:
    """The broker's absences, as the coordinator meets them: each is waited out for up to
    grader/faults.WAIT_SECONDS (a restarted Redis is back in seconds, and the workers wait
    too), saying so once; a longer one stops the batch with ``Unavailable``. Results lost with
    a broker that kept no data are found by the watch on the workers and sent again."""

    def __init__(self, app: Celery, log: Callable[[str], None]):
        self.app, self.log = app, log
        self.since: float | None = None
        self.recovered = False  # back after an absence, until the coordinator has looked
        self.where = broker_name(app)

    def answers(self) -> bool:
        """Whether the broker answers now; ``Unavailable`` once it has been away too long."""
        try:
            self.app.backend.client.ping()
        except Exception as error:
            if not is_broker_error(error):
                raise
            now = time.monotonic()
            if self.since is None:
                self.since = now
                self.log(f"the broker ({self.where}) is not answering ({describe(error)}); "
                         f"waiting for it for up to {WAIT_SECONDS:.0f} s")
            elif now - self.since > WAIT_SECONDS:
                raise Unavailable(f"the broker ({self.where})", describe(error)) from error
            time.sleep(1.0)
            return False
        if self.since is not None:
            self.log(f"the broker ({self.where}) answers again")
            self.since, self.recovered = None, True
        return True

    def patiently(self, action: Callable[[], object]) -> None:
        """``action()`` (a call to the broker), waiting out an absence of the broker."""
        while True:
            try:
                action()
                return
            except Exception as error:
                if not is_broker_error(error):
                    raise
                self.answers()  # waits, or raises Unavailable


def broker_name(app: Celery) -> str:
    """The broker's address without a password."""
    try:
        from kombu.utils.url import maybe_sanitize_url

        return maybe_sanitize_url(app.conf.broker_url)
    except Exception:
        return "Redis"


class Watch(threading.Thread):
    """Every LOOK_SECONDS, which tasks the queue lists or a live worker holds, away from the
    coordinator's loop: asking the workers waits out a whole timeout for their answers. It
    keeps the names of the workers that have answered."""

    def __init__(self, app: Celery):
        super().__init__(daemon=True, name="ctc-watch")
        self.app, self.stopping = app, threading.Event()
        self._looks: queue.SimpleQueue[tuple[float, set[str]]] = queue.SimpleQueue()
        self.workers: set[str] = set()  # grows from this thread; read from the coordinator's
        self.others: set[str] = set()  # workers on another course's queue (another key), now
        self.other_versions: set[str] = set()  # on this course's, another grader's version

    def run(self) -> None:
        while not self.stopping.wait(LOOK_SECONDS):
            started = time.monotonic()
            try:
                found, answered, others, other_versions = accounted_for(self.app)
            except Exception:  # the broker did not answer: no look this time
                continue
            self.workers |= answered
            self.others, self.other_versions = others, other_versions
            self._looks.put((started, found))

    def looks(self) -> list[tuple[float, set[str]]]:
        """The looks finished since the last call: (when each began, the task ids it found)."""
        found = []
        while not self._looks.empty():
            found.append(self._looks.get())
        return found

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


class NoWorker:
    """Says, while no worker has answered the coordinator's looks, that none has: after
    NO_WORKER_SECONDS and again every NO_WORKER_SECONDS, with the command that starts one;
    and, once one answers after that, that it does."""

    def __init__(self, watch: Watch, log: Callable[[str], None], broker: str, command: str):
        self.watch, self.log, self.broker = watch, log, broker
        self.version = getattr(watch.app.conf, "ctc_grader_version", "")
        self.command = command or "python -m grader worker --broker URL --queue-key FILE"
        self.since = self.last = time.monotonic()
        self.said = False

    def look(self, results: bool) -> None:
        if self.watch.workers or results:
            if self.said:
                names = ", ".join(sorted(self.watch.workers)[:3]) or "a worker"
                self.log(f"a worker answers now ({inert(names, 200)}): grading")
                self.said = False
            self.since = None
            return
        if self.since is None:  # one answered before: the lost-worker watch covers it
            return
        now = time.monotonic()
        if now - self.last < NO_WORKER_SECONDS:
            return
        self.last, self.said = now, True
        others, older = len(self.watch.others), len(self.watch.other_versions)
        elsewhere = "".join([
            f" ({others} worker(s) answer with another queue key: is their --queue-key this "
            "course's queue.key?)" if others else "",
            f" ({older} worker(s) of this course run another version of the grader: install "
            f"this one (version {self.version}) on their machines and start them again)"
            if older else ""])
        self.log(f"no worker has answered on the broker ({self.broker}) in "
                 f"{now - self.since:.0f} s: none runs, or none can reach it{elsewhere}. Start "
                 "one on each grading machine (with a copy of the course's queue key):\n  "
                 f"{self.command}\nstill waiting (Ctrl-C stops the batch; --resume goes on "
                 "from where it stopped)")


def accounted_for(app: Celery) -> tuple[set[str], set[str], set[str], set[str]]:
    """The task ids on the queue or held by a worker that answers (a submission whose task is
    in neither was taken by a worker that died); the names of the workers that answered on
    this course's queue, of those on another course's (a worker with another queue key), and
    of those on this course's for another version of the grader."""
    found: set[str] = set()
    inspect = app.control.inspect(timeout=1.0)
    ours = app.conf.task_default_queue
    course = getattr(app.conf, "ctc_course_queue", ours)
    queues = {str(worker): {str(q.get("name")) for q in listed or [] if isinstance(q, dict)}
              for worker, listed in (inspect.active_queues() or {}).items()}
    answered = {worker for worker, names in queues.items() if ours in names}
    other_versions = {worker for worker, names in queues.items() if worker not in answered
                      and any(n == course or n.startswith(course + "-") for n in names)}
    others = {worker for worker, names in queues.items()
              if worker not in answered | other_versions
              and any(n.startswith("ctc-") for n in names)}
    for method in (inspect.active, inspect.reserved, inspect.scheduled):
        for tasks in (method() or {}).values():
            for task in tasks:
                found.add(task.get("id") or task.get("request", {}).get("id", ""))
    client = app.backend.client
    for raw in client.lrange(ours, 0, -1):
        try:
            found.add(json.loads(raw)["headers"]["id"])
        except (ValueError, KeyError, TypeError):
            continue
    return found, answered, others, other_versions
