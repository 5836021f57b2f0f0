"""Run one submission: its cells in a sandboxed kernel, then the probes of grader/probe.py.

A cell that runs past its time limit or kills the kernel does not cost the student what came
before or after it: the kernel is started again, the cells run again without that one (it gets
a note instead), and grading goes on. A probe that hangs or kills the kernel scores 0 for its
exercise alone. The wall clock of the whole submission is capped; output beyond a cap is
dropped with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import zmq
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_output

from grader.probe import Exercise, Failure, parse_results, probe_source
from grader.sandbox import Limits, SandboxKernelManager, reap, sandbox_uid

MAX_ATTEMPTS = 8
PING = -1  # stands for a last, empty cell that checks the kernel outlived the notebook


class GradingError(Exception):
    """The grader itself could not run a submission (the kernel would not start, say)."""


class LimitedClient(NotebookClient):
    """nbclient with a cap on the bytes of output it keeps."""

    def __init__(self, *args, output_limit: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_limit = output_limit
        self.output_used = 0
        self.truncated = False
        self.unlimited = False  # probe cells: their (bounded) output must arrive whole
        self.on_cell_executed = self.on_exit_payload

    asked_to_exit = False

    def on_exit_payload(self, cell, cell_index, execute_reply) -> None:
        """nbclient's on_cell_executed hook: notice exit() and quit()."""
        payloads = (execute_reply or {}).get("content", {}).get("payload", [])
        if any(p.get("source") == "ask_exit" for p in payloads if isinstance(p, dict)):
            self.asked_to_exit = True

    def output(self, outs, msg, display_id, cell_index):
        size = len(str(msg.get("content", "")))
        if not self.unlimited:
            if self.output_used + size > self.output_limit:
                if not self.truncated:
                    self.truncated = True
                    outs.append(new_output("stream", name="stdout",
                                           text="[grader: output limit reached, the rest "
                                                "of this notebook's output is not kept]\n"))
                return None
            self.output_used += size
        return super().output(outs, msg, display_id, cell_index)


@dataclass
class Run:
    """What came of running a submission."""

    notebook: NotebookNode
    results: dict[str, list[object]]
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    attempts: int = 0


def _runtime_dir(uid: int | None, use_sandbox: bool) -> Path:
    """A short private folder for the connection file and IPC sockets (paths <= 107 bytes)."""
    run_dir = Path(tempfile.mkdtemp(prefix="ctc-"))
    if use_sandbox and uid is not None:
        os.chown(run_dir, uid, uid)
    return run_dir


async def _watch(uid: int, events: list[str]) -> None:
    """Kill every process the kernel starts, as soon as it appears."""
    warned = False
    while True:
        if reap(uid) and not warned:
            events.append("killed processes that the notebook started")
            warned = True
        await asyncio.sleep(0.2)


def _is_course_cell(cell: NotebookNode) -> bool:
    """A locked cell the student cannot change (setup, checks, given code): not a test cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("locked")) and not meta.get("grade") and not meta.get("solution")


def _note(cell: NotebookNode, text: str) -> None:
    cell.outputs = [new_output("stream", name="stdout", text=f"[grader: {text}]\n")]


async def _run(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...],
               uid: int | None, limits: Limits, use_sandbox: bool) -> Run:
    start = time.monotonic()
    deadline = start + limits.notebook_seconds
    skipped: dict[int, str] = {}
    failures: dict[int, int] = {}  # course cells that failed, and how often
    results: dict[str, list[object]] = {}
    events: list[str] = []
    attempts = 0
    executed = nb
    while len(results) < len(plan) and attempts < MAX_ATTEMPTS:
        attempts += 1
        if time.monotonic() > deadline:
            break
        executed = copy.deepcopy(nb)
        run_dir = _runtime_dir(uid, use_sandbox)
        work_dir = Path("/tmp/work") if use_sandbox else run_dir / "work"
        if not use_sandbox:
            work_dir.mkdir()
            for file in files:
                shutil.copyfile(file, work_dir / file.name)
        km = SandboxKernelManager(kernel_name="python3", transport="ipc",
                                  ip=str(run_dir / "k"),
                                  connection_file=str(run_dir / "kernel.json"))
        km.sandbox_setup = (run_dir, work_dir, files, uid, limits, use_sandbox)
        km.context.setsockopt(zmq.MAXMSGSIZE, limits.message_bytes)
        client = LimitedClient(executed, km=km, timeout=limits.cell_seconds, allow_errors=True,
                               startup_timeout=120, output_limit=limits.output_bytes,
                               resources={"metadata": {"path": str(work_dir)}},
                               iopub_timeout=4, shutdown_kernel="immediate")
        restart = False
        watchdog = None
        log = tempfile.TemporaryFile()  # noqa: SIM115  # the kernel's output; closed below
        try:
            async with client.async_setup_kernel(cwd=str(run_dir if use_sandbox else work_dir),
                                                 stdout=log, stderr=log):
                if uid is not None:
                    watchdog = asyncio.create_task(_watch(uid, events))
                previous = None  # the last code cell that ran
                cells = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"]
                for index in [*cells, PING]:
                    cell = executed.cells[index] if index != PING else new_code_cell("pass")
                    if index in skipped:
                        _note(cell, skipped[index])
                        continue
                    client.timeout = max(1, min(limits.cell_seconds,
                                                int(deadline - time.monotonic())))
                    if index == PING:  # is the kernel still there after the last cell?
                        executed.cells.append(cell)
                    client.asked_to_exit = False
                    try:
                        await client.async_execute_cell(cell, len(executed.cells) - 1
                                                        if index == PING else index)
                        if client.asked_to_exit:  # exit(): the kernel ends a moment later
                            raise DeadKernelError("exit() was called")
                    except CellTimeoutError:
                        blamed, why = index, "ran past its time limit"
                    except DeadKernelError:
                        # A kernel that died before it began this cell was ended by the one
                        # before (exit(), a timer): that one is skipped, not this.
                        started = cell.get("execution_count") is not None
                        blamed = index if started or previous is None else previous
                        why = "stopped the kernel"
                    else:
                        previous = index if index != PING else previous
                        continue
                    finally:
                        if index == PING:
                            executed.cells.pop()
                    if blamed == PING:  # the kernel did not outlive the last cell
                        if previous is None:
                            raise GradingError("the kernel stopped before any cell ran")
                        blamed = previous
                    restart = True
                    blamed_cell = executed.cells[blamed]
                    if _is_course_cell(blamed_cell):  # not the student's: try it once more
                        failures[blamed] = failures.get(blamed, 0) + 1
                        events.append(f"cell {blamed} (the course's) {why}; running it again")
                        if failures[blamed] > 1:
                            raise GradingError(
                                f"the course's own cell {blamed} failed twice (time limit or "
                                "kernel death): the machine may be overloaded; grade again "
                                "with fewer --jobs or a longer --cell-timeout")
                    else:
                        skipped[blamed] = f"this cell {why} and was skipped"
                        events.append(f"cell {blamed}: {skipped[blamed]}")
                    break
                if restart:
                    continue
                for exercise in plan:
                    if exercise.name in results:
                        continue
                    outcome = await _probe(client, exercise, limits, deadline)
                    results[exercise.name] = outcome
                    if outcome and isinstance(outcome[0], Failure) and outcome[0].message in (
                            "the check ran past its time limit", "the check stopped the kernel"):
                        events.append(f"checks of {exercise.name}: {outcome[0].message}")
                        restart = True
                        break
        except (DeadKernelError, CellTimeoutError) as error:
            events.append(f"the kernel failed: {type(error).__name__}")
        except RuntimeError as error:
            if attempts == 1:
                log.seek(0)
                said = log.read()[-2000:].decode(errors="replace")
                raise GradingError(f"the kernel did not start: {error}\n{said}") from error
            events.append(f"the kernel failed to start again: {error}")
        finally:
            if watchdog is not None:
                watchdog.cancel()
            # nbclient leaves a kernel it did not start running: stop it and all it left.
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)
            if uid is not None:
                reap(uid, keep_kernel=False)
            shutil.rmtree(run_dir, ignore_errors=True)
            log.close()
        if client.truncated:
            events.append("output limit reached")
    if len(results) < len(plan):
        events.append("notebook time limit reached" if time.monotonic() > deadline
                      else "too many kernel restarts")
    for exercise in plan:
        results.setdefault(exercise.name,
                           [Failure("not graded: time limit")] * len(exercise.checks))
    return Run(executed, results, events, time.monotonic() - start, attempts)


async def _probe(client: LimitedClient, exercise: Exercise, limits: Limits,
                 deadline: float) -> list[object]:
    nonce = secrets.token_hex(16)
    cell = new_code_cell(probe_source([c.expression for c in exercise.checks], nonce))
    client.timeout = max(1, min(limits.cell_seconds, int(deadline - time.monotonic())))
    client.unlimited = True
    client.nb.cells.append(cell)  # nbclient writes the executed cell back into the notebook
    try:
        await client.async_execute_cell(cell, len(client.nb.cells) - 1)
    except CellTimeoutError:
        return [Failure("the check ran past its time limit")] * len(exercise.checks)
    except DeadKernelError:
        return [Failure("the check stopped the kernel")] * len(exercise.checks)
    finally:
        client.unlimited = False
        client.nb.cells.pop()
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    return parse_results(text, nonce, len(exercise.checks))


def run_submission(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...],
                   limits: Limits, use_sandbox: bool) -> Run:
    """Run ``nb`` (already sanitized) and probe every exercise of ``plan``."""
    nb = nbformat.from_dict(nb)
    with sandbox_uid() if use_sandbox else contextlib.nullcontext() as uid:
        return asyncio.run(_run(nb, files, plan, uid, limits, use_sandbox))
