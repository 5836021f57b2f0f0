"""Run one submission in a sandboxed kernel and judge each exercise where its checks ran.

The notebook's cells run top to bottom. Right after an exercise's test cell has run, the grader
probes that exercise (grader/grading/probe.py) and judges it: later cells, a scratch cell that
rebinds a name, a slow demo or a time limit further down cannot change its points. An exercise
that loses points there has its checks run once more at the same point, and the better run
counts: a failure that does not come back was the machine's or the grader's, not the code's
(the instructor still reads what the first run said). An exercise whose checks fail only
because an earlier graded function it builds on is wrong is judged again, in a kernel of its
own that runs the notebook up to its checks, receives the course's version of that function,
and is thrown away; it keeps its points if it then passes (the earlier one has been judged by
then; its points are not given back).

A cell that runs past its time limit or kills the kernel does not cost the student what came
before or after it: the kernel is started again, the cells run again without that one (it gets
a note instead), and grading goes on. Cells that are neither the course's nor an exercise's
(demos, the student's own) share half of the notebook's time; past that they are skipped. The
whole submission's wall clock is capped, and output beyond a cap is dropped with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import secrets
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_output

from grader.grading.kernel import Clock, GradingError, KernelLost, Kernels, LimitedClient
from grader.grading.limits import Limits
from grader.grading.probe import (
    Exercise,
    Failure,
    Verdict,
    decode_reply,
    judge,
    probe_source,
    reply_bodies,
    unattempted,
)
from grader.grading.sandbox import SandboxKernelManager, sandbox_uid

MAX_ATTEMPTS = 8
END = -1  # stands for a last, empty cell that checks the kernel outlived the notebook
MAX_REPLY_BYTES = 64 * 2**20
FATAL = ("the check ran past its time limit", "the check stopped the kernel")


@dataclass
class Run:
    """What came of running a submission."""

    notebook: NotebookNode
    verdicts: dict[str, Verdict]
    events: list[str] = field(default_factory=list)
    seconds: float = 0.0
    attempts: int = 0
    replies: dict[str, list[str]] = field(default_factory=dict)  # a worker's, unjudged
    lost: dict[str, str] = field(default_factory=dict)  # probes that hung or killed the kernel
    rejudged: tuple[str, ...] = ()  # due to be judged again in a kernel of their own
    skipped: dict[int, str] = field(default_factory=dict)  # cells not run, and why


def _kind(cell: NotebookNode) -> str:
    """"course" (locked, given), "test", "solution" or "own" (anything else)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if meta.get("grade"):
        return "test"
    if meta.get("solution"):
        return "solution"
    return "course" if meta.get("locked") else "own"


def probe_points(nb: NotebookNode, plan: tuple[Exercise, ...]) -> dict[int, list[str]]:
    """Where each exercise is judged: right after its test cell, the first one at or after its
    solution cell; at the end of the notebook where there is none (deleted or moved above the
    code it checks)."""
    ids = [c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells]
    points: dict[int, list[str]] = {}
    for exercise in plan:
        start = ids.index(exercise.name) if exercise.name in ids else 0
        at = next((i for i in range(start, len(ids)) if ids[i] == f"test-{exercise.name}"
                   and nb.cells[i].cell_type == "code"), END)
        points.setdefault(at, []).append(exercise.name)
    return points


def _note(cell: NotebookNode, text: str) -> None:
    cell.outputs = [new_output("stream", name="stdout", text=f"[grader: {text}]\n")]


class Judging:
    """Verdicts from a probe's replies; a second run of the checks of an exercise that lost
    points; and judging again, in a kernel of its own, an exercise that failed where an earlier
    one it builds on failed too: the notebook runs up to its checks, receives the course's
    version of the earlier ones, and the checks run again (a part of ``Grading``)."""

    def verdict(self, exercise: Exercise, bodies: list[str]) -> Verdict:
        verdict, more = verdict_from_replies(exercise, bodies, self.partial)
        if more:
            self.event(more)
        return verdict

    def judge(self, exercise: Exercise, results: list[object]) -> Verdict:
        return judge(exercise, results, self.partial)

    async def judge_again(self) -> None:
        """Judge again, each in a kernel of its own, the exercises that failed where an earlier
        one they build on failed too (``rejudge``), while the notebook's time lasts."""
        for name, (index, failed) in self.rejudge.items():
            if self.clock.left() <= 5:
                self.event("no time left to judge again the exercises that failed through "
                           "an earlier one")
                break
            exercise = self.by_name[name]
            try:
                again = await asyncio.wait_for(self.replay(exercise, index, failed),
                                               timeout=max(1.0, self.clock.left()))
            except TimeoutError:
                again = None
            if again is not None and again.points == exercise.points:
                self.verdicts[name] = replace(again, note="passes with a correct "
                                              + ", ".join(f"`{d.name}`" for d in failed))

    def due_again(self, exercise: Exercise, verdict: Verdict, index: int) -> None:
        """Put ``exercise`` in ``rejudge`` when it lost points, an earlier exercise it builds
        on did too, and it is not still as released (then nothing earlier could help it)."""
        failed = [self.by_name[d] for d in exercise.depends if d in self.verdicts
                  and self.verdicts[d].points < self.by_name[d].points]
        if verdict.points < exercise.points and failed and not unattempted(self.nb, exercise):
            self.rejudge[exercise.name] = (index, failed)

    async def _probe_again(self, client: LimitedClient, km: SandboxKernelManager, private: str,
                           exercise: Exercise, first: Verdict) -> Verdict:
        """An exercise that lost points has its checks run once more, in the same kernel at the
        same point: what a second run of the same calls does not repeat was not the code's doing
        (a fault of the machine or of the grader), and honest work must not pay for it. Points
        come only from one run in which the checks pass, so the better run counts; it says so,
        and the instructor reads what the first run's failed checks said."""
        try:
            bodies = await self._probe(client, km, private, exercise, record=False)
        except KernelLost:  # the second run hung or killed the kernel: the first one stands
            self.verdicts[exercise.name] = first
            self.event(f"checks of {exercise.name}: their second run did not finish (a time "
                       "limit, or the kernel stopped); the first run's result stands")
            raise
        again = self.verdict(exercise, bodies)
        if again.points <= first.points:
            return first
        return replace(again, note="; ".join(filter(None, [
            again.note, "its checks passed when they ran a second time"])),
            first_run=[*first.visible_failures, *first.hidden_failures])

    async def replay(self, exercise: Exercise, index: int, failed: list[Exercise],
                     ) -> Verdict | None:
        """Judge ``exercise`` again with the course's version of the earlier exercises it builds
        on, in a kernel of its own: the notebook runs up to the exercise's checks, the course's
        code is sent, the checks run, and the kernel is thrown away with whatever the student's
        code may have kept of that code. None when the replay did not get that far."""
        executed = copy.deepcopy(self.nb)
        given = "\n\n".join(d.given for d in failed)
        names = tuple(dict.fromkeys(n for d in failed for n in d.defines))
        try:
            async with self.kernels.open(executed, quiet=True) as (client, km, private):
                for at, cell in enumerate(executed.cells):
                    if at > index:
                        break
                    if cell.cell_type != "code" or at in self.skipped:
                        continue
                    client.timeout = self.clock.timeout(own_cell=_kind(cell) == "own")
                    await client.async_execute_cell(cell, at)
                bodies = await self._probe(client, km, private, exercise, given, names,
                                           record=False)
        except (KernelLost, DeadKernelError, CellTimeoutError, GradingError):
            return None
        return self.verdict(exercise, bodies)


class Grading(Judging):
    """One submission's run: its kernels, cells, probes and verdicts."""

    def __init__(self, nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...],
                 uid: int | None, limits: Limits, use_sandbox: bool, partial: bool = False,
                 raw: bool = False, env: dict[str, str] | None = None):
        self.nb, self.files, self.plan, self.partial = nb, files, plan, partial
        self.raw = raw  # a worker: probe, keep the replies, judge nothing
        self.replies: dict[str, list[str]] = {}
        self.lost: dict[str, str] = {}
        # exercise -> (its probe point, the failed earlier exercises it builds on)
        self.rejudge: dict[str, tuple[int, list[Exercise]]] = {}
        self.by_name = {e.name: e for e in plan}
        self.uid, self.limits, self.use_sandbox = uid, limits, use_sandbox
        self.clock = Clock(limits)
        self.skipped: dict[int, str] = {}
        self.failures: dict[int, int] = {}  # course cells that failed, and how often
        self.verdicts: dict[str, Verdict] = {}
        self.events: list[str] = []
        self.points = probe_points(nb, plan)
        self.executed = nb
        self.kernels = Kernels(files, uid, limits, use_sandbox, self.clock, self.event, env)

    def event(self, text: str) -> None:
        if text not in self.events:
            self.events.append(text)

    async def run(self) -> Run:
        start = time.monotonic()
        attempts = 0
        while len(self.done()) < len(self.plan) and attempts < MAX_ATTEMPTS:
            if self.clock.left() <= 0:
                break
            attempts += 1
            try:
                await asyncio.wait_for(self.attempt(), timeout=max(1.0, self.clock.left() + 5))
            except (TimeoutError, KernelLost):
                continue
        if len(self.done()) < len(self.plan):
            self.event("notebook time limit reached" if self.clock.left() <= 0
                       else "too many kernel restarts")
        await self.judge_again()
        for exercise in self.plan:
            if exercise.name not in self.done() and not self.raw:
                self.verdicts[exercise.name] = self.judge(
                    exercise, [Failure("not graded: the notebook did not get this far in "
                                       "time")] * len(exercise.checks))
        return Run(self.executed, self.verdicts, self.events, time.monotonic() - start,
                   attempts, self.replies, self.lost, tuple(self.rejudge), dict(self.skipped))

    def done(self) -> set[str]:
        """Exercises judged (or, on a worker, probed), or whose probe was lost."""
        return set(self.verdicts) | set(self.replies) | set(self.lost)

    async def attempt(self) -> None:
        """Start a kernel, run the cells (skipping those blamed before), judge what is due."""
        self.executed = copy.deepcopy(self.nb)
        async with self.kernels.open(self.executed, first=not self.done() and not self.failures
                                     and not self.skipped) as (client, km, private):
            await self._cells(client, km, private)

    async def _cells(self, client: LimitedClient, km: SandboxKernelManager, private: str) -> None:
        executed = self.executed
        previous = None  # the last code cell that ran
        cells = [i for i, c in enumerate(executed.cells) if c.cell_type == "code"]
        for index in [*cells, END]:
            if self.clock.left() <= 0:
                self.event("notebook time limit reached")
                raise KernelLost
            cell = executed.cells[index] if index != END else new_code_cell("pass")
            own = index != END and _kind(cell) == "own"
            if index in self.skipped:
                _note(cell, self.skipped[index])
            elif own and self.clock.own_left <= 0:
                _note(cell, "not run: the notebook's own cells used up their share of the "
                            "time limit")
                self.event("cells past the time share of the notebook's own cells were not run")
            else:
                blamed = await self._execute(client, cell, index, previous, own)
                if blamed is not None:
                    self._blame(*blamed)
                    raise KernelLost
                previous = index if index != END else previous
            for name in self.points.get(index, []):
                if name not in self.done():
                    await self._judge(client, km, private, self.by_name[name], index)

    async def _execute(self, client: LimitedClient, cell: NotebookNode, index: int,
                       previous: int | None, own: bool) -> tuple[int, str] | None:
        """Run one cell; None if it ran, else the cell to blame and why."""
        executed = self.executed
        client.timeout = self.clock.timeout(own_cell=own)
        if index == END:
            executed.cells.append(cell)
        client.asked_to_exit = False
        began = time.monotonic()
        try:
            await client.async_execute_cell(cell, len(executed.cells) - 1 if index == END
                                            else index)
            if client.asked_to_exit:  # exit(): the kernel ends a moment later
                raise DeadKernelError("exit() was called")
        except CellTimeoutError:
            why = "ran past its time limit"
            if own and self.clock.own_left - (time.monotonic() - began) <= 1:
                why = "ran past the time share of the notebook's own cells"
            return self._blamed(index, previous, why)
        except DeadKernelError:
            # A kernel that died before it began this cell was ended by the one before (exit(),
            # a timer): that one is skipped, not this.
            started = cell.get("execution_count") is not None
            blamed = index if started or previous is None else previous
            return self._blamed(blamed, previous, "stopped the kernel")
        finally:
            if own:
                self.clock.own_left -= time.monotonic() - began
            if index == END:
                executed.cells.pop()
        return None

    def _blamed(self, blamed: int, previous: int | None, why: str) -> tuple[int, str]:
        if blamed == END:  # the kernel did not outlive the last cell
            if previous is None:
                raise GradingError("the kernel stopped before any cell ran")
            blamed = previous
        return blamed, why

    def _blame(self, blamed: int, why: str) -> None:
        cell = self.executed.cells[blamed]
        if _kind(cell) == "course":  # not the student's: try it once more
            self.failures[blamed] = self.failures.get(blamed, 0) + 1
            self.event(f"cell {blamed} (the course's) {why}; running it again")
            if self.failures[blamed] > 1:
                raise GradingError(
                    f"the course's own cell {blamed} failed twice (time limit or kernel death):"
                    " the machine may be overloaded; grade again with fewer --jobs or a longer "
                    "--cell-timeout")
        else:
            self.skipped[blamed] = f"this cell {why} and was skipped"
            self.event(f"cell {blamed}: {self.skipped[blamed]}")

    async def _judge(self, client: LimitedClient, km: SandboxKernelManager, private: str,
                     exercise: Exercise, index: int) -> None:
        """Probe and judge ``exercise`` now. Where it fails and an earlier exercise it builds on
        failed too, it is judged again later, in a kernel of its own (``replay``). Without a
        plan's expected values (a worker), only keep the replies."""
        bodies = await self._probe(client, km, private, exercise)
        if self.raw:
            self.replies[exercise.name] = bodies
            return
        verdict = self.verdict(exercise, bodies)
        if verdict.points < exercise.points and not unattempted(self.nb, exercise):
            verdict = await self._probe_again(client, km, private, exercise, verdict)
        self.due_again(exercise, verdict, index)
        self.verdicts[exercise.name] = verdict

    async def _probe(self, client: LimitedClient, km: SandboxKernelManager, private: str,
                     exercise: Exercise, given: str = "", names: tuple[str, ...] = (),
                     record: bool = True) -> list[str]:
        """Run one probe; the bodies of the replies in its file (normally one). A probe that
        hangs or kills the kernel is recorded as lost (``record``), and the kernel is started
        again; a probe that raised, or a reply file that is no plain file, is flagged."""
        nonce = secrets.token_hex(16)
        reply = f"{private}/reply-{nonce}"
        cell = new_code_cell(probe_source([c.expression for c in exercise.checks], reply, nonce,
                                          given, names))
        client.timeout = self.clock.timeout()
        client.discard = True
        client.probe_errors = []
        client.nb.cells.append(cell)  # nbclient writes the executed cell back into the notebook
        lost = None
        try:
            await client.async_execute_cell(cell, len(client.nb.cells) - 1, store_history=False)
        except CellTimeoutError:
            lost = FATAL[0]
        except DeadKernelError:
            lost = FATAL[1]
        finally:
            client.discard = False
            client.nb.cells.pop()
        if lost is not None:
            if record:
                self.lost[exercise.name] = lost
                if not self.raw:
                    self.verdicts[exercise.name] = self.judge(
                        exercise, [Failure(lost)] * len(exercise.checks))
                self.event(f"checks of {exercise.name}: {lost}")
            raise KernelLost
        if client.probe_errors:
            self.event(f"checks of {exercise.name}: the grader's probe raised "
                       f"{client.probe_errors[0]} (the notebook changed what it relies on)")
        text, problem = _read_reply(km.host_path(reply))
        if problem is not None:
            self.event(f"checks of {exercise.name}: {problem} (the notebook tampered with the "
                       "grader's reply file)")
        return reply_bodies(text, nonce)


def verdict_from_replies(exercise: Exercise, bodies: list[str], partial: bool = False,
                         ) -> tuple[Verdict, str | None]:
    """The verdict of an exercise from its probe's replies, and what to flag: more than one
    reply means the student's code wrote into the grader's file, and the lowest score counts;
    a reply that lists replaced functions means the notebook patched what the probe uses."""
    count = len(exercise.checks)
    if not bodies:
        return judge(exercise, [Failure("the probe gave no result")] * count, partial), None
    decoded = [decode_reply(body, count) for body in bodies]
    verdicts = [judge(exercise, results, partial) for results, _ in decoded]
    flags = []
    if len(bodies) > 1:
        flags.append("more than one reply (the notebook wrote to the grader's reply file); "
                     "the lowest score counts")
    tampered = sorted({name for _, names in decoded for name in names})
    if tampered:
        flags.append(f"the notebook replaced functions the grader's probe uses "
                     f"({', '.join(tampered)[:200]})")
    more = f"checks of {exercise.name}: " + "; ".join(flags) if flags else None
    return min(verdicts, key=lambda v: v.points), more


def _read_reply(path: Path) -> tuple[str, str | None]:
    """A probe's reply file, read without trusting it: never through a link (which the host
    would resolve in its own file system), never from a FIFO or device (which could block the
    grader for good). Returns (text, what was wrong with it or None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "", None
    except OSError as error:
        return "", f"its reply file could not be opened ({error.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "", "its reply file is not a plain file"
        chunks, size = [], 0
        while size <= MAX_REPLY_BYTES and (chunk := os.read(fd, 2**20)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()
    if size > MAX_REPLY_BYTES:
        return "", "its reply file is too large"
    return b"".join(chunks).decode("utf-8", errors="replace"), None


def judge_again(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...],
                limits: Limits, use_sandbox: bool, partial: bool, verdicts: dict[str, Verdict],
                skipped: dict[int, str], seconds: float, env: dict[str, str] | None = None,
                ) -> tuple[dict[str, Verdict], list[str]]:
    """On a coordinator, after a worker ran ``nb`` in ``seconds`` (skipping the cells of
    ``skipped``) and ``verdicts`` were judged from its replies: judge again here, as
    ``run_submission`` would have at its end, the exercises that failed through an earlier
    one, within what is left of the notebook's time. The verdicts and what happened."""
    nb = nbformat.from_dict(nb)
    with sandbox_uid() if use_sandbox else contextlib.nullcontext() as uid:
        grading = Grading(nb, files, plan, uid, limits, use_sandbox, partial, env=env)
        grading.clock.deadline -= max(0.0, seconds)
        grading.skipped = dict(skipped)
        at = {name: index for index, names in grading.points.items() for name in names}
        for exercise in plan:  # in notebook order, as the run judged them
            if exercise.name in verdicts:
                grading.due_again(exercise, verdicts[exercise.name], at[exercise.name])
                grading.verdicts[exercise.name] = verdicts[exercise.name]
        asyncio.run(grading.judge_again())
        return grading.verdicts, grading.events


def run_submission(nb: NotebookNode, files: list[Path], plan: tuple[Exercise, ...],
                   limits: Limits, use_sandbox: bool, partial: bool = False,
                   raw: bool = False, env: dict[str, str] | None = None) -> Run:
    """Run ``nb`` (already sanitized), judging every exercise of ``plan`` as it goes (``raw``:
    keeping each probe's replies instead, for the coordinator to judge); its kernels get the
    variables ``env`` (the student's variants)."""
    nb = nbformat.from_dict(nb)
    with sandbox_uid() if use_sandbox else contextlib.nullcontext() as uid:
        return asyncio.run(Grading(nb, files, plan, uid, limits, use_sandbox, partial,
                                   raw, env).run())
