"""Lesson 07's given code that starts its measurements: ``run_demo`` has the lesson's helper
script, ``distributed_demos.py``, measure on several processes and returns what it printed.

Nothing here is graded. On Linux one process per notebook kernel, the script's ``serve``
command (``DemoServer``), imports torch once and forks every measurement from there, so that a
measurement starts in a tenth of a second rather than the seconds that importing torch again
takes; elsewhere each measurement is a fresh ``python distributed_demos.py ...``. Either way a
measurement runs with its ranks in a process group of its own: an interrupt stops all of them
and says so in one line (``DemoInterrupted``), and on Linux they end with the kernel.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Forking after `import torch` is safe on Linux (DataLoader starts its workers so); elsewhere
# every measurement starts a fresh interpreter.
FORK_SERVER = sys.platform == "linux"
KILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL


class DemoInterrupted(Exception):
    """A measurement interrupted (the stop button, Ctrl-C), its processes stopped. A notebook
    shows it as its one line, as it shows an interrupt, and the cells after it do not run."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self}"]


def _group_members(group: int) -> set[int] | None:
    """The live processes (zombies left out) of process group ``group``, from Linux's /proc;
    None where there is no /proc to read."""
    if not Path("/proc/self/stat").exists():
        return None
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        if int(fields[2]) == group and fields[0] != "Z":  # state, ppid, pgrp
            members.add(int(stat.parent.name))
    return members


def _group_alive(group: int) -> bool:
    """Whether any process of group ``group`` still runs."""
    members = _group_members(group)
    if members is not None:
        return bool(members)
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(leader: int, how: int) -> None:
    """Send ``how`` to the process group that ``leader`` leads (a measurement and its ranks);
    where there are no process groups (Windows), to ``leader`` alone."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(leader, how)
        else:
            os.kill(leader, how)
    except ProcessLookupError:
        pass


def _stop_group(leader: int, wait: Callable[[float], int | None], patience: float = 5.0) -> str:
    """Stop a measurement and its ranks: SIGTERM to all of them (the measurement then stops its
    ranks and removes its temporary folder), SIGKILL to whatever is left after ``patience``
    seconds; ``wait(seconds)`` waits for the measurement's exit status (None: not yet).
    Returns the words that say what was stopped."""
    members = _group_members(leader) if hasattr(os, "killpg") else None
    _signal_group(leader, signal.SIGTERM)
    if wait(patience) is None:
        _signal_group(leader, KILL)
        wait(patience)
    if hasattr(os, "killpg"):
        deadline = time.monotonic() + patience
        while _group_alive(leader) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _group_alive(leader):
            _signal_group(leader, KILL)
    if members and len(members) == 1:  # the measurement alone: its ranks had not started
        return "the one process was stopped"
    return (f"the {len(members)} processes were stopped" if members
            else "the script and its ranks were stopped")


def _file_stamp(path: Path) -> tuple[int, int] | None:
    """When ``path`` last changed and its size; None when it is missing."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class DemoServer:
    """``python distributed_demos.py serve``, started for this kernel: it imports torch and
    what the demos need once, then forks each measurement (``start``), answering ``started
    PID`` and ``exited STATUS`` on its stdout. It runs in a session of its own, so that the
    stop button's SIGINT does not reach it, and ends with the kernel (Linux's parent-death
    signal) or ``close``."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.stamp = _file_stamp(script)
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - open as long as the server runs
        self._buffer = b""
        self.process = subprocess.Popen(
            [sys.executable, script.name, "serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._errors, start_new_session=True,
            cwd=script.parent if script.parent != Path() else None)
        atexit.register(self.close)  # at once when the kernel ends well; else Linux's signal

    def usable(self) -> bool:
        """Whether it still runs the script as it is now (an edited script needs a new one)."""
        return self.process.poll() is None and _file_stamp(self.script) == self.stamp

    def _line(self, deadline: float | None) -> str | None:
        """The server's next line; None at ``deadline`` (time.monotonic()); RuntimeError with
        its last words when it has ended."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                self._errors.seek(0)
                words = self._errors.read().decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"{self.script.name} serve failed (exit "
                                   f"{self.process.wait()}): {(words or ['no message'])[-1]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def start(self, arguments: list[str], folder: str, deadline: float) -> int | None:
        """Have the server fork a measurement of the command line ``arguments``, its stdout
        and stderr in ``folder``; its process id, or None when the server had not started it
        by ``deadline`` (still importing torch, say: then it is closed)."""
        request = json.dumps({"argv": arguments, "folder": folder}) + "\n"
        try:
            self.process.stdin.write(request.encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            self._line(None)  # raises, with the server's last words
        try:
            line = self._line(deadline)
        except KeyboardInterrupt:
            self.close()
            raise
        if line is None:
            self.close()
            return None
        return int(line.removeprefix("started "))

    def exited(self, timeout: float) -> int | None:
        """The running measurement's exit status (negative: killed by that signal), or None
        when it has not ended within ``timeout`` seconds."""
        line = self._line(time.monotonic() + timeout)
        return None if line is None else int(line.removeprefix("exited "))

    def close(self) -> None:
        """Stop the server (and a measurement it runs: that one stops its ranks)."""
        atexit.unregister(self.close)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self._errors):
            pipe.close()


_SERVERS: dict[Path, DemoServer] = {}


def demo_server(script: Path = Path("distributed_demos.py")) -> DemoServer | None:
    """This kernel's server for ``script``, started now where none runs (or where the script
    changed since); None where measurements are not forked (not Linux). Call it early: the
    server imports torch while the notebook goes on."""
    if not FORK_SERVER:
        return None
    key = script.resolve()
    server = _SERVERS.get(key)
    if server is None or not server.usable():
        if server is not None:
            server.close()
        server = _SERVERS[key] = DemoServer(script)
    return server


def run_demo(command: str, world_size: int, options: dict[str, object] | None = None,
             script: Path = Path("distributed_demos.py"), timeout: float = 120.0) -> dict:
    """Run ``python distributed_demos.py COMMAND --world-size N --OPTION VALUE ...`` and return
    the JSON object it prints; on Linux forked by this kernel's ``demo_server``.

    The measurement runs in a process group of its own, with its ranks: an interrupt of the
    notebook reaches this function alone, which stops all of them (``_stop_group``) and raises
    ``DemoInterrupted``, shown as one line. On Linux the measurement and its ranks also end with
    the notebook's kernel. Options are written as ``--name value``, underscores as dashes; a
    list is joined with commas.

    Raises:
        RuntimeError: the script failed or ran past ``timeout``, with its last lines of stderr.
        DemoInterrupted: interrupted; every process was stopped.
    """
    arguments = [command, "--world-size", str(world_size)]
    for name, value in (options or {}).items():
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        arguments += [f"--{name.replace('_', '-')}", text]
    what = f"{script.name} {command}"
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="run_demo_") as folder:
        server = demo_server(script)
        if server is not None:
            try:
                leader = server.start(arguments, folder, deadline)
            except KeyboardInterrupt:
                raise DemoInterrupted(f"{what} interrupted before it started; the "
                                      "measurements' server was stopped") from None
            if leader is None:
                raise RuntimeError(f"{what} ran past {timeout:g} s and was stopped")
            wait = server.exited
        else:
            with (Path(folder, "stdout").open("w") as out,
                  Path(folder, "stderr").open("w") as err):
                # The script runs in its own folder (cwd), so it is named by its name alone.
                process = subprocess.Popen(
                    [sys.executable, script.name, *arguments], stdin=subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True,
                    cwd=script.parent if script.parent != Path() else None)
            leader = process.pid

            def wait(seconds: float) -> int | None:
                try:
                    return process.wait(timeout=seconds)
                except subprocess.TimeoutExpired:
                    return None

        try:
            status = wait(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            raise DemoInterrupted(f"{what} interrupted; {_stop(leader, wait, server)}") from None
        if status is None:
            _stop(leader, wait, server)
            raise RuntimeError(f"{what} ran past {timeout:g} s and was stopped")
        stdout = Path(folder, "stdout").read_text()
        stderr = Path(folder, "stderr").read_text()
    if status != 0:
        tail = "\n".join(stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{what} failed (exit {status}): {tail}")
    return json.loads(stdout)


def _stop(leader: int, wait: Callable[[float], int | None], server: DemoServer | None) -> str:
    """``_stop_group``, then close a server that never said the measurement ended (the next
    measurement starts a new one)."""
    ended: list[int | None] = []

    def wait_and_note(seconds: float) -> int | None:
        status = wait(seconds)
        ended.append(status)
        return status

    words = _stop_group(leader, wait_and_note)
    if server is not None and ended[-1] is None:
        server.close()
    return words
