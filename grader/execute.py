"""Run one submission: its cells in a sandboxed kernel, then the probes of grader/probe.py.

A cell that runs past its time limit or kills the kernel does not cost the student what came
before or after it: the kernel is started again, the cells run again without that one (it gets
a note instead), and grading goes on. A probe that hangs or kills the kernel scores 0 for its
exercise alone. The wall clock of the whole submission is capped; output beyond a cap is
dropped with a note.
"""

from __future__ import annotations

import asyncio
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
from grader.sandbox import FIRST_SANDBOX_UID, Limits, SandboxKernelManager

MAX_ATTEMPTS = 8


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


def _runtime_dir(slot: int, use_sandbox: bool) -> Path:
    """A short private folder for the connection file and IPC sockets (paths <= 107 bytes)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"ctc{slot}-"))
    if use_sandbox and os.geteuid() == 0:
        os.chown(run_dir, FIRST_SANDBOX_UID + slot, FIRST_SANDBOX_UID + slot)
    return run_dir


def _note(cell: NotebookNode, text: str) -> None:
    cell.outputs = [new_output("stream", name="stdout", text=f"[grader: {text}]\n")]


async def _run(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...], slot: int,
               limits: Limits, use_sandbox: bool) -> Run:
    start = time.monotonic()
    deadline = start + limits.notebook_seconds
    skipped: dict[int, str] = {}
    results: dict[str, list[object]] = {}
    events: list[str] = []
    attempts = 0
    executed = nb
    while len(results) < len(plan) and attempts < MAX_ATTEMPTS:
        attempts += 1
        if time.monotonic() > deadline:
            break
        executed = copy.deepcopy(nb)
        run_dir = _runtime_dir(slot, use_sandbox)
        work_dir = Path("/tmp/work") if use_sandbox else run_dir / "work"
        if not use_sandbox:
            work_dir.mkdir()
            for file in files:
                shutil.copyfile(file, work_dir / file.name)
        km = SandboxKernelManager(kernel_name="python3", transport="ipc",
                                  ip=str(run_dir / "k"),
                                  connection_file=str(run_dir / "kernel.json"))
        km.sandbox_setup = (run_dir, work_dir, files, slot, limits, use_sandbox)
        km.context.setsockopt(zmq.MAXMSGSIZE, limits.message_bytes)
        client = LimitedClient(executed, km=km, timeout=limits.cell_seconds, allow_errors=True,
                               startup_timeout=60, output_limit=limits.output_bytes,
                               resources={"metadata": {"path": str(work_dir)}},
                               iopub_timeout=4, shutdown_kernel="immediate")
        restart = False
        log = tempfile.TemporaryFile()  # noqa: SIM115  # the kernel's output; closed below
        try:
            async with client.async_setup_kernel(cwd=str(run_dir if use_sandbox else work_dir),
                                                 stdout=log, stderr=log):
                for index, cell in enumerate(executed.cells):
                    if cell.cell_type != "code":
                        continue
                    if index in skipped:
                        _note(cell, skipped[index])
                        continue
                    client.timeout = max(1, min(limits.cell_seconds,
                                                int(deadline - time.monotonic())))
                    try:
                        await client.async_execute_cell(cell, index)
                    except CellTimeoutError:
                        skipped[index] = "this cell ran past its time limit and was skipped"
                    except DeadKernelError:
                        skipped[index] = "this cell stopped the kernel and was skipped"
                    if index in skipped:
                        events.append(f"cell {index}: {skipped[index]}")
                        restart = True
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


def run_submission(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...], slot: int,
                   limits: Limits, use_sandbox: bool) -> Run:
    """Run ``nb`` (already sanitized) and probe every exercise of ``plan``."""
    nb = nbformat.from_dict(nb)
    return asyncio.run(_run(nb, files, plan, slot, limits, use_sandbox))
