"""A grading worker that records what it returns, or replays it without running anything.

    .venv/bin/python benchmarks/replay_worker.py --broker URL --queue-key FILE --record DIR
    .venv/bin/python benchmarks/replay_worker.py --broker URL --queue-key FILE --replay DIR

For ``grade_distributed.py --coordinator-only``, which measures what the coordinator itself
costs a hand-in. Both are the grader's own worker (``python -m grader worker``: the same Celery
app, queue, task and signatures) with one step changed, what a task's payload is turned into:

- ``--record`` runs it for real (the sandbox) and keeps the result in DIR, named by the digest
  of the notebook's cells;
- ``--replay`` runs nothing: it answers each task with the recorded result of the notebook whose
  cells it has (an error result where none was recorded).

Either way the grader's own task checks the task's signature and signs the result for that
task and payload, and the coordinator verifies and judges it as it does any worker's. Replay is
exact only where every student's notebook of a template is sent the same: a course without a
key (no drawn variants or hidden inputs differ between students).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.grading import distributed  # noqa: E402


def template_digest(payload: dict) -> str:
    """The digest of a sent notebook's cells (type and source): the same for every student's
    hand-in of one template, since the coordinator sends each sanitized the same way."""
    cells = [(cell.get("cell_type"), cell.get("source"))
             for cell in payload["notebook"].get("cells", [])]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def recording(folder: Path):
    """The worker's own step, whose result is also written to ``folder``."""
    run_payload = distributed._run_payload

    def record(task, payload: dict) -> dict:
        result = run_payload(task, payload)
        (folder / f"{template_digest(payload)}.json").write_text(json.dumps(result))
        return result

    return record


def replaying(folder: Path):
    """A step that runs nothing: the recorded result of the task's template."""
    recorded = {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}

    def replay(task, payload: dict) -> dict:
        found = recorded.get(template_digest(payload))
        if found is None:
            return {"error": "replay: no result recorded for this notebook",
                    "worker": socket.gethostname()}
        return found

    return replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--queue-key", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, metavar="DIR")
    mode.add_argument("--replay", type=Path, metavar="DIR")
    args = parser.parse_args()
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
    # The task the grader registers (_run_task) calls this module-level step by name: the
    # prefork pool's processes, forked after this, inherit the change.
    distributed._run_payload = recording(args.record) if args.record else replaying(args.replay)
    distributed.worker(args.broker, args.concurrency, 3600, args.queue_key)


if __name__ == "__main__":
    main()
