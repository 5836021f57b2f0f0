"""A submission's kernels: nbclient's client with a cap on the output it keeps, the
notebook's clock, and the sandboxed kernels themselves (bubblewrap, a cgroup, a uid of their
own), started, watched and removed with everything they started and wrote."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output

from grader.common.files import remove_tree
from grader.grading.limits import Limits
from grader.grading.processes import Cgroup, reap
from grader.grading.sandbox import PRIVATE_DIR, SandboxKernelManager, SandboxSetup

OWN_SHARE = 0.5  # of the notebook's time, for cells that are neither the course's nor graded


RECEIVE_QUEUE = 64  # messages that may wait in each of the grader's sockets to a kernel


class GradingError(Exception):
    """The grader itself could not run a submission (the kernel would not start, say)."""


class KernelLost(Exception):  # an event, not an error of ours
    """The kernel stopped or hung: start it again and run the cells once more."""


def _size(value: object, limit: int) -> int:
    """About how many bytes ``value`` (a message's content) holds, counting up to ``limit``."""
    total, todo = 0, [value]
    while todo and total <= limit:
        item = todo.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, dict):
            todo += item.keys()
            todo += item.values()
        elif isinstance(item, (list, tuple)):
            todo += item
        else:
            total += 8
    return total


class LimitedClient(NotebookClient):
    """nbclient with a cap on the bytes of output it keeps, whatever the message type.

    Display updates and clear_output count like any output; comm messages (widgets) are
    dropped, since nothing of them is graded or shown; while ``discard`` is set (a probe is
    running) outputs are not kept at all."""

    def __init__(self, *args, output_limit: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_limit = output_limit
        self.output_used = 0
        self.truncated = False
        self.discard = False
        self.probe_errors: list[str] = []  # errors a probe raised (outputs are not kept)
        self.asked_to_exit = False
        self.on_cell_executed = self.on_exit_payload

    def on_exit_payload(self, cell, cell_index, execute_reply) -> None:
        """nbclient's on_cell_executed hook: notice exit() and quit()."""
        payloads = (execute_reply or {}).get("content", {}).get("payload", [])
        if any(p.get("source") == "ask_exit" for p in payloads if isinstance(p, dict)):
            self.asked_to_exit = True

    def process_message(self, msg, cell, cell_index):
        kind = msg.get("msg_type", "")
        if kind.startswith("comm"):
            return None
        if kind in ("stream", "display_data", "execute_result", "error", "update_display_data",
                    "clear_output"):
            if self.discard:
                if kind == "error":
                    content = msg.get("content", {})
                    self.probe_errors.append(f"{content.get('ename', '')}: "
                                             f"{content.get('evalue', '')}"[:200])
                return None
            size = _size(msg.get("content"), self.output_limit)
            if self.output_used + size > self.output_limit:
                if not self.truncated:
                    self.truncated = True
                    cell.outputs.append(new_output(
                        "stream", name="stdout", text="[grader: output limit reached, the rest "
                        "of this notebook's output is not kept]\n"))
                return None
            self.output_used += size
        return super().process_message(msg, cell, cell_index)


class Clock:
    """The notebook's wall clock, and the share of it that the student's own cells may use."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.notebook_seconds
        self.own_left = limits.notebook_seconds * OWN_SHARE

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, own_cell: bool = False) -> int:
        """Seconds the next cell may run."""
        limit = min(self.limits.cell_seconds, self.left())
        if own_cell:
            limit = min(limit, self.own_left)
        return max(1, int(limit))


class _Drain(threading.Thread):
    """Reads the kernel's own stdout and stderr, keeping the last few kilobytes."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.tail = fd, b""

    def run(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(self.fd, 65536):
                self.tail = (self.tail + chunk)[-4096:]
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Kernels:
    """The sandboxed kernels of one submission's run: each started in bubblewrap, with a cgroup
    and a uid of its own where the grader may, watched while it runs, and gone with all it
    started and wrote when it is done."""

    def __init__(self, files: list[Path], uid: int | None, limits: Limits, use_sandbox: bool,
                 clock: Clock, event: Callable[[str], None], env: dict[str, str] | None = None):
        self.files, self.uid, self.limits, self.use_sandbox = files, uid, limits, use_sandbox
        self.clock, self.event = clock, event
        self.env = dict(env or {})  # the kernel's own variables (the student's variants)

    @contextlib.asynccontextmanager
    async def open(self, executed: NotebookNode, quiet: bool = False, first: bool = False):
        """A sandboxed kernel for ``executed``: (client, kernel manager, private folder). All
        it started dies, and all it wrote goes, when the block ends. ``first``: nothing has run
        yet, so a kernel that does not start is the grader's error, not the submission's."""
        run_dir = Path(tempfile.mkdtemp(prefix="ctc-"))
        cgroup = Cgroup.create(self.limits) if self.use_sandbox else None
        if self.use_sandbox:
            work_dir, private = Path("/tmp/work"), PRIVATE_DIR
        else:
            work_dir, private = run_dir / "work", str(run_dir)
            work_dir.mkdir()
            for file in self.files:
                shutil.copyfile(file, work_dir / file.name)
        km = SandboxKernelManager(kernel_name="python3", transport="ipc",
                                  ip=f"{private}/k", connection_file=str(run_dir / "kernel.json"))
        km.sandbox = SandboxSetup(work_dir, self.files, self.uid, self.limits, self.use_sandbox,
                                  cgroup, private, self.env)
        km.context.setsockopt(zmq.MAXMSGSIZE, self.limits.message_bytes)
        # At most RECEIVE_QUEUE messages wait in each of the grader's sockets: with zmq's
        # default (1000) a kernel that floods its output while the grader is short of CPU
        # queued up to 1000 messages of up to 32 MiB in the grader (1.9 GB seen under a busy
        # machine). Past it the kernel's output is dropped (its own queue fills, in its own
        # memory limit): a flood hits the output limit either way, and the checks' replies
        # come through files, not these sockets.
        km.context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        client = LimitedClient(executed, km=km, timeout=self.limits.cell_seconds,
                               allow_errors=True, output_limit=self.limits.output_bytes,
                               startup_timeout=max(10, int(min(120, self.clock.left()))),
                               resources={"metadata": {"path": str(work_dir)}},
                               iopub_timeout=4, shutdown_kernel="immediate",
                               store_widget_state=False)
        read_end, write_end = os.pipe()
        drain = _Drain(read_end)
        drain.start()
        watchdog = None
        try:
            try:
                async with client.async_setup_kernel(
                        cwd=str(run_dir if self.use_sandbox else work_dir),
                        stdout=write_end, stderr=write_end, env={**os.environ, **self.env}):
                    os.close(write_end)
                    write_end = -1
                    private = self.lock_private(km, private)
                    if self.use_sandbox:
                        watchdog = asyncio.create_task(self.watch(km))
                    yield client, km, private
            except RuntimeError as error:  # the kernel did not start
                if first:
                    said = drain.tail[-2000:].decode(errors="replace")
                    raise GradingError(f"the kernel did not start: {error}\n{said}") from error
                if not quiet:
                    self.event(f"the kernel failed to start again: {error}")
                raise KernelLost from error
            except (DeadKernelError, CellTimeoutError) as error:
                if not quiet:
                    self.event(f"the kernel failed: {type(error).__name__}")
                raise KernelLost from error
        finally:
            # nbclient registers an exit hook before starting the kernel and removes it only
            # after a start that worked: after one that failed, the hook would fail at exit
            # (nbclient asserts a kernel manager it has let go) with a traceback for the user.
            atexit.unregister(client._cleanup_kernel)
            if watchdog is not None:
                watchdog.cancel()
            km.kill_everything()
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)
            # The client's channels and the manager's zmq context (its sockets, an I/O thread
            # and about 13 descriptors), which the shutdown above leaves open when the kernel is
            # dead already: else a process that grades a class keeps one set per kernel it
            # started, and under the common limit of 1024 descriptors fails after about 75.
            with contextlib.suppress(Exception):
                if client.kc is not None:
                    client.kc.stop_channels()
            if not km.context.closed:
                km.context.destroy(linger=0)
            if write_end >= 0:
                os.close(write_end)
            if cgroup is not None:
                if cgroup.out_of_memory() and not quiet:
                    self.event(f"the kernel ran out of memory "
                               f"({self.limits.memory_bytes / 2**30:g} GiB)")
                cgroup.remove()
            remove_tree(run_dir)
            if client.truncated and not quiet:
                self.event("output limit reached")

    def lock_private(self, km: SandboxKernelManager, private: str) -> str:
        """Once the kernel has bound its sockets, take its private folder from it (where the
        grader is root and the kernel runs as a uid of its own): its code cannot replace a
        socket by a link that the grader would follow into the host. The probes' replies go to
        a folder of their own inside it, which stays the kernel's. Returns that folder."""
        if not self.use_sandbox or self.uid is None:
            return private
        replies = km.host_path(f"{private}/replies")
        with contextlib.suppress(FileExistsError):
            replies.mkdir(mode=0o700)
        os.chown(replies, self.uid, self.uid)
        folder = km.host_path(private)
        os.chown(folder, 0, 0)
        os.chmod(folder, 0o755)
        return f"{private}/replies"

    async def watch(self, km: SandboxKernelManager) -> None:
        """Kill processes the kernel started that linger or multiply, as soon as they do."""
        while True:
            if km.init_pid is not None and reap(km.init_pid):
                self.event("killed processes that the notebook started")
            await asyncio.sleep(0.2)
