"""A kernel in a bubblewrap sandbox, for running student code.

The kernel sees a read-only system (/usr, /etc, the Python installation and the course's
virtual environment), a private /tmp, its own working folder holding only the files the lesson
ships, and one small folder for its connection file and IPC sockets. It has no network, its own
PID namespace (the whole process tree dies with it) and, when the grader runs as root, an
unprivileged user of its own, so that limits on processes apply to it alone. Memory, CPU time,
file size, open files and processes are capped with rlimits; the wall clock and the volume of
output are capped by the client (grader/execute.py).

Known facts this relies on (tried here): with the network unshared the kernel must use IPC
transport with an absolute socket path; the connection file is copied into a private folder
rather than binding all of /tmp; inside a PID namespace ipykernel exits if JPY_PARENT_PID is set,
so the environment is cleared.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

FIRST_SANDBOX_UID = 64000  # when the grader is root, each kernel runs as a uid of its own
SANDBOX_UIDS = 1000
UID_LOCKS = Path(tempfile.gettempdir()) / "counting-the-cost-uids"
MAX_CHILDREN = 8  # processes the kernel may have started at once
CHILD_SECONDS = 5  # how long one of them may live


@dataclass(frozen=True)
class Limits:
    """What one submission may use."""

    memory_bytes: int = 6 * 2**30  # address space of the kernel (torch maps a lot of it)
    cpu_seconds: int = 600
    processes: int = 256  # threads count too
    file_bytes: int = 64 * 2**20
    open_files: int = 512
    scratch_bytes: int = 256 * 2**20  # the kernel's /tmp and working folder, in memory
    cell_seconds: int = 60
    notebook_seconds: int = 300
    output_bytes: int = 2 * 2**20  # per notebook, beyond it outputs are dropped
    message_bytes: int = 32 * 2**20  # one kernel message; a larger one disconnects the kernel


@contextlib.contextmanager
def sandbox_uid() -> Iterator[int | None]:
    """A uid no other sandbox (of this or another grading process) is using, while held.

    None when the grader is not root: the kernel then runs as the grader's own user.
    """
    if os.geteuid() != 0:
        yield None
        return
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for uid in range(FIRST_SANDBOX_UID, FIRST_SANDBOX_UID + SANDBOX_UIDS):
        handle = open(UID_LOCKS / f"{uid}.lock", "w")  # noqa: SIM115  # held while in use
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            reap(uid, keep_kernel=False)  # whatever an earlier holder left behind
            yield uid
        finally:
            reap(uid, keep_kernel=False)
            handle.close()
        return
    raise RuntimeError("no free sandbox uid")


def reap(uid: int, keep_kernel: bool = True) -> int:
    """Kill processes of ``uid``: all of them, or (``keep_kernel``) those the kernel started
    that linger or multiply; return how many.

    A library may run a helper for a moment (matplotlib runs fc-list once), so a child is
    left alone for CHILD_SECONDS, unless there are more than MAX_CHILDREN: a fork bomb is
    stopped within a moment rather than left to slow every other submission down.
    """
    owners: dict[int, tuple[int, int, float]] = {}  # pid -> (uid, parent pid, start tick)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            with open(f"/proc/{entry.name}/stat") as stat:
                started = float(stat.read().rsplit(")", 1)[1].split()[19])
            owners[int(entry.name)] = (int(fields["Uid"].split()[0]), int(fields["PPid"]),
                                       started)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    children = [pid for pid, (owner, parent, _) in owners.items()
                if owner == uid and owners.get(parent, (None, 0, 0))[0] == uid]
    if not keep_kernel:
        doomed = [pid for pid, (owner, _, _) in owners.items() if owner == uid]
    elif len(children) > MAX_CHILDREN:
        doomed = children
    else:
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK")
        ticks = CHILD_SECONDS * os.sysconf("SC_CLK_TCK")
        doomed = [pid for pid in children if now - owners[pid][2] > ticks]
    killed = 0
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _python_roots() -> list[Path]:
    """Folders the kernel's Python needs: the installation and the virtual environment."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    real = Path(os.path.realpath(sys.executable)).parent.parent
    roots.add(real)
    return sorted(roots)


def _parents(path: Path) -> list[Path]:
    return [p for p in reversed(path.parents) if p != Path("/")]


def sandbox_argv(kernel_argv: list[str], run_dir: Path, work_dir: Path, files: list[Path],
                 uid: int | None, limits: Limits) -> list[str]:
    """The command that starts ``kernel_argv`` inside the sandbox."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed")
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    made: set[Path] = set()

    def mkdirs(path: Path) -> None:
        for parent in [*_parents(path), path]:
            if parent not in made:
                argv.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)

    for system in ("/usr", "/etc"):
        argv += ["--ro-bind", system, system]
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        target = Path("/") / link
        if target.is_symlink():
            argv += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            argv += ["--ro-bind", str(target), str(target)]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.scratch_bytes), "--perms", "01777", "--tmpfs", "/tmp"]
    for root in _python_roots():
        if str(root).startswith("/usr/"):  # bound already
            continue
        mkdirs(root.parent)
        argv += ["--ro-bind", str(root), str(root)]
        made.add(root)
    # An editable install would point the kernel at the repository; hide its hooks.
    for hook in glob.glob(str(Path(sys.prefix) / "lib" / "python*" / "site-packages"
                              / "__editable__*")):
        argv += ["--ro-bind", "/dev/null", hook]
    mkdirs(run_dir.parent)
    argv += ["--bind", str(run_dir), str(run_dir)]
    argv += ["--size", str(limits.scratch_bytes), "--perms", "0777", "--tmpfs", str(work_dir)]
    for file in files:
        argv += ["--ro-bind", str(file), str(work_dir / file.name)]
    env = {
        "HOME": "/tmp", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "MPLCONFIGDIR": "/tmp/matplotlib", "IPYTHONDIR": "/tmp/ipython",
        "NBGRADER_EXECUTION": "autograde", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
    }
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += ["--chdir", str(work_dir)]
    if uid is not None:  # drop to an unprivileged user of this kernel's own
        argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}",
                 f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    return [*limit_argv(limits), *argv, *kernel_argv]


def limit_argv(limits: Limits) -> list[str]:
    """prlimit in front of a command: rlimits that its whole process tree inherits."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    return [prlimit, f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}", "--core=0", "--"]


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts inside the sandbox (or, unsandboxed, under rlimits).

    Set ``sandbox_setup = (run_dir, work_dir, files, uid, limits, use_sandbox)`` before
    starting the kernel.
    """

    sandbox_setup: tuple | None = None

    def write_connection_file(self, **kwargs) -> tuple[str, dict]:
        written = super().write_connection_file(**kwargs)
        uid, use_sandbox = self.sandbox_setup[3], self.sandbox_setup[5]
        if use_sandbox and uid is not None:  # the kernel's own user must read it
            os.chown(self.connection_file, uid, uid)
        return written

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        argv = super().format_kernel_cmd(extra_arguments)
        run_dir, work_dir, files, uid, limits, use_sandbox = self.sandbox_setup
        if use_sandbox:
            return sandbox_argv(argv, run_dir, work_dir, files, uid, limits)
        return [*limit_argv(limits), *argv]
