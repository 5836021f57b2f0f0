"""The processes of a sandboxed kernel: finding, reaping and killing them, and the cgroup that
holds them where the grader may make one (see grader/grading/sandbox.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.grading.limits import Limits

MAX_CHILDREN = 8  # processes the kernel may have started at once
CHILD_SECONDS = 5  # how long one of them may live
CGROUP_NAME = "counting-the-cost"


def _processes() -> dict[int, tuple[int, int, float]]:
    """Every process: pid -> (uid, parent pid, start time in clock ticks)."""
    table: dict[int, tuple[int, int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            with open(f"/proc/{entry.name}/stat") as stat:
                started = float(stat.read().rsplit(")", 1)[1].split()[19])
            table[int(entry.name)] = (int(fields["Uid"].split()[0]), int(fields["PPid"]),
                                      started)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return table


def descendants(pid: int, table: dict[int, tuple[int, int, float]] | None = None) -> list[int]:
    """Every process below ``pid`` in the process tree."""
    table = _processes() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def _kill(pids: list[int]) -> int:
    killed = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def reap(init_pid: int) -> int:
    """Kill processes that the kernel started and that linger or multiply; return how many.

    The kernel is the sandbox init's first child; everything else below the init is the
    kernel's doing: a process that double-forks and detaches is re-parented to the init, not to
    the host. A library may run a helper for a moment (matplotlib runs fc-list once), so a
    process is left alone for CHILD_SECONDS, unless there are more than MAX_CHILDREN: a fork
    bomb is stopped within a moment rather than left to slow every other submission down.
    """
    table = _processes()
    below = descendants(init_pid, table)
    first = sorted((table[pid][2], pid) for pid in below if table[pid][1] == init_pid)
    if not first:
        return 0
    kernel = first[0][1]
    started = [pid for pid in below if pid != kernel]
    if len(started) > MAX_CHILDREN:
        return _kill(started)
    with open("/proc/uptime") as uptime:
        now = float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK")
    ticks = CHILD_SECONDS * os.sysconf("SC_CLK_TCK")
    return _kill([pid for pid in started if now - table[pid][2] > ticks])


def kill_uid(uid: int) -> int:
    """Kill every process of ``uid`` (a sandbox uid no longer in use)."""
    return _kill([pid for pid, (owner, _, _) in _processes().items() if owner == uid])


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and everything below it."""
    for _ in range(20):  # a process may fork while its siblings die: look again
        if not _kill([*descendants(pid), pid]):
            return
        time.sleep(0.01)


# ------------------------------------------------------------------ cgroups


class Cgroup:
    """A cgroup of one kernel's own: its memory (shared memory and tmpfs included), process
    count and CPU time, and a kill of everything in it. Made where the grader may (root, cgroup
    v2, or v1 as on hybrid systems); ``Cgroup.create`` returns None elsewhere."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders  # controller ("memory", "pids", "cpu", "kill") -> folder

    # One line, once, when grading runs without a cgroup.
    unavailable_reason: str | None = None

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
        if os.geteuid() != 0:
            cls.unavailable_reason = "the grader is not root"
            return None
        name = f"kernel-{uuid.uuid4().hex[:12]}"
        try:
            folders = _make_cgroup(name)
        except OSError as error:
            cls.unavailable_reason = f"no writable cgroup file system ({error.strerror})"
            return None
        if not {"memory", "pids"} <= set(folders):
            for folder in folders.values():
                with contextlib.suppress(OSError):
                    folder.rmdir()
            cls.unavailable_reason = "the cgroup file system lacks the memory or pids controller"
            return None
        group = cls(folders)
        try:
            group._limit(limits)
        except OSError as error:
            group.remove()
            cls.unavailable_reason = f"cgroup limits could not be set ({error.strerror})"
            return None
        return group

    def _limit(self, limits: Limits) -> None:
        memory, pids, cpu = (self.folders.get(k) for k in ("memory", "pids", "cpu"))
        if (memory / "memory.max").exists():  # v2
            (memory / "memory.max").write_text(str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                (memory / "memory.swap.max").write_text("0")
        else:
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # absent without swap accounting
                (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        (pids / "pids.max").write_text(str(limits.processes))
        if cpu is not None:
            period = 100_000
            quota = max(1000, int(limits.cpus * period))
            if (cpu / "cpu.max").exists():
                (cpu / "cpu.max").write_text(f"{quota} {period}")
            else:
                (cpu / "cpu.cfs_period_us").write_text(str(period))
                (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run from inside this cgroup: the shell moves itself in, then execs it, so
        that no process of the kernel ever runs outside."""
        procs = sorted({str(folder / "cgroup.procs") for folder in self.folders.values()})
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *procs, "--", *argv]

    def pids(self) -> list[int]:
        folder = self.folders.get("pids") or next(iter(self.folders.values()))
        try:
            return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def out_of_memory(self) -> bool:
        """Whether the kernel was killed for memory."""
        memory = self.folders["memory"]
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError, ValueError):
                fields = dict(line.split() for line in (memory / name).read_text().splitlines()
                              if len(line.split()) == 2)
                return int(fields.get("oom_kill", 0)) > 0
        return False

    def kill(self) -> None:
        """Kill every process in the group, however it forked or detached."""
        kill_file = self.folders.get("kill")
        if kill_file is not None:
            with contextlib.suppress(OSError):
                (kill_file / "cgroup.kill").write_text("1")
        for _ in range(50):  # v1: no cgroup.kill; the pids limit bounds any race with fork
            if not self.pids():
                return
            _kill(self.pids())
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill()
        for folder in self.folders.values():
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still leaving
                    time.sleep(0.02)


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy: controller (or "" for v2) -> path."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _make_cgroup(name: str) -> dict[str, Path]:
    """Make cgroup ``name`` for one kernel; return its folder per controller."""
    root = Path("/sys/fs/cgroup")
    own = _own_cgroups()
    if (root / "cgroup.controllers").exists():  # cgroup v2 only
        # Controllers can be handed down only through cgroups without processes of their own:
        # ours, under the root, holds kernels only.
        parent = root / CGROUP_NAME
        wanted = [c for c in ("memory", "pids", "cpu")
                  if c in (root / "cgroup.controllers").read_text().split()]
        with contextlib.suppress(OSError):
            (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        folder = parent / name
        folder.mkdir()
        enabled = (folder / "cgroup.controllers").read_text().split()
        return {**{c: folder for c in enabled if c in wanted}, "kill": folder}
    folders = {}
    for controller in ("memory", "pids", "cpu"):
        base = root / controller
        if not base.is_dir():
            continue
        folder = base / own.get(controller, "/").lstrip("/") / f"{CGROUP_NAME}-{name}"
        folder.mkdir()
        folders[controller] = folder
    unified = root / "unified" / own.get("", "/").lstrip("/")
    if (unified / "cgroup.kill").exists() or (root / "unified" / "cgroup.procs").exists():
        with contextlib.suppress(OSError):
            folder = unified / f"{CGROUP_NAME}-{name}"
            folder.mkdir()
            if (folder / "cgroup.kill").exists():
                folders["kill"] = folder
            else:
                folder.rmdir()
    return folders
