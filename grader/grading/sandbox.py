"""A kernel in a bubblewrap sandbox, for running student code.

The kernel sees a read-only system (/usr, /etc, the Python installation and the course's
virtual environment), a private /tmp, its own working folder holding only the files the lesson
ships, and a small private folder (``/run/ctc``) for its IPC sockets and the probes' replies.
Every place it can write is a size-limited tmpfs inside its own mount namespace, so nothing it
writes reaches the host's disk or survives it. It has no network and its own PID namespace:
the namespace's first process is the sandbox's init, every process the kernel starts (however
it forks, double-forks or detaches) stays its descendant, and all of them die with it. The
grader reaches the sockets through ``/proc/<init>/root``, the sandbox's own view of its files.

Limits, in layers:
- rlimits (prlimit) on every process: address space, CPU time, file size, open files, and
  (when the grader runs as root, which gives each kernel a uid of its own) processes;
- a cgroup of its own when the grader may make one (root, with cgroup v2 or v1 mounted): memory
  that counts shared memory, memfd and tmpfs pages; a process count; one CPU's worth of time,
  so that a busy loop cannot starve the submission graded beside it; and a kill of the whole
  group at the end. Without one (not root, or no writable cgroup file system) the grader says so
  once, and relies on the PID namespace and the rlimits alone;
- the client (grader/grading/execute.py) caps wall-clock time and the volume of output it keeps.

Known facts this relies on (tried here): with the network unshared the kernel must use IPC
transport with an absolute socket path; a Unix socket in another mount namespace can be reached
at /proc/PID/root/PATH; inside a PID namespace ipykernel exits if JPY_PARENT_PID is set, so the
environment is cleared.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from grader.grading.limits import Limits
from grader.grading.processes import Cgroup, kill_tree, kill_uid

FIRST_SANDBOX_UID = 64000  # when the grader is root, each kernel runs as a uid of its own
SANDBOX_UIDS = 1000
UID_LOCKS = Path(tempfile.gettempdir()) / "counting-the-cost-uids"
PRIVATE_DIR = "/run/ctc"  # inside the sandbox: the kernel's sockets and the probes' replies


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
            kill_uid(uid)  # whatever an earlier holder left behind
            yield uid
        finally:
            kill_uid(uid)
            handle.close()
        return
    raise RuntimeError("no free sandbox uid")


# ------------------------------------------------------------------ the sandbox


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


MPLCONFIGDIR = "/tmp/matplotlib"  # matplotlib's folder in the sandbox (its fresh /tmp)
_FONTS_LOCK = threading.Lock()
_fonts: list[tuple[Path, ...]] = []


def matplotlib_fonts() -> tuple[Path, ...]:
    """matplotlib's list of the machine's fonts (``fontlist-*.json``), made once per grading
    process in a folder of its own and shown read-only to every kernel: else each kernel, in a
    fresh ``/tmp``, runs fc-list and reads every font file again (a tenth of a CPU second a
    submission, more where many fonts are installed). Empty where it cannot be made: the
    kernels then make their own, as before."""
    with _FONTS_LOCK:
        if not _fonts:
            folder = Path(tempfile.mkdtemp(prefix="ctc-fonts-"))
            atexit.register(shutil.rmtree, folder, True)
            try:
                subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"],
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    "MPLCONFIGDIR": str(folder), "HOME": str(folder)},
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                               check=True)
                found = tuple(sorted(folder.glob("fontlist-*.json")))
            except (OSError, subprocess.SubprocessError):
                found = ()
            for file in found:
                file.chmod(0o644)
            folder.chmod(0o755)
            _fonts.append(found)
        return _fonts[0]


def sandbox_argv(kernel_argv: list[str], readable: list[Path], work_dir: Path, files: list[Path],
                 uid: int | None, limits: Limits, cgroup: bool = False,
                 extra_env: dict[str, str] | None = None) -> list[str]:
    """The command that starts ``kernel_argv`` inside the sandbox; ``readable`` files (the
    connection file) are bound read-only at their own paths, ``files`` into ``work_dir``."""
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
             "--size", str(limits.scratch_bytes), "--perms", "01777", "--tmpfs", "/tmp",
             "--dir", "/run",
             "--size", str(limits.private_bytes), "--perms", "01777", "--tmpfs", PRIVATE_DIR]
    made.update({Path("/tmp"), Path("/run"), Path(PRIVATE_DIR)})
    fonts = matplotlib_fonts()
    if fonts:  # MPLCONFIGDIR: writable, with the font list ready in it
        argv += ["--perms", "01777", "--dir", MPLCONFIGDIR]
        for file in fonts:
            argv += ["--ro-bind", str(file), f"{MPLCONFIGDIR}/{file.name}"]
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
    for path in readable:
        mkdirs(path.parent)
        argv += ["--ro-bind", str(path), str(path)]
    if work_dir not in made:
        mkdirs(work_dir.parent)
        argv += ["--size", str(limits.scratch_bytes), "--perms", "0777", "--tmpfs",
                 str(work_dir)]
    for file in files:
        argv += ["--ro-bind", str(file), str(work_dir / file.name)]
    env = {
        "HOME": "/tmp", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "MPLCONFIGDIR": MPLCONFIGDIR, "IPYTHONDIR": "/tmp/ipython",
        "NBGRADER_EXECUTION": "autograde", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1", **(extra_env or {}),
    }
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += ["--chdir", str(work_dir)]
    if uid is not None:  # drop to an unprivileged user of this kernel's own
        argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}",
                 f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    return [*limit_argv(limits, uid, cgroup), *argv, *kernel_argv]


def limit_argv(limits: Limits, uid: int | None = None, cgroup: bool = False) -> list[str]:
    """prlimit in front of a command: rlimits that its whole process tree inherits. The process
    limit counts every process of the user, so it is set only for a sandbox uid of its own.
    Address space is not memory (torch maps far more than it touches): where a cgroup limits
    the memory itself, the address space may be four times as large, and it still turns an
    absurd allocation into a MemoryError rather than a killed kernel."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    processes = [f"--nproc={limits.processes}"] if uid is not None else []
    address_space = limits.memory_bytes * (4 if cgroup else 1)
    return [prlimit, f"--as={address_space}", f"--cpu={limits.cpu_seconds}",
            *processes, f"--fsize={limits.file_bytes}", f"--nofile={limits.open_files}",
            "--core=0", "--"]


def _first_child(pid: int, seconds: float) -> int | None:
    """The first child of ``pid`` (bubblewrap's: the sandbox's init), waiting up to
    ``seconds`` for it to appear."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.005)
    return None


# The kernel's option that leaves IPython no image format for a matplotlib figure: the inline
# backend shows and closes each figure as usual, as its text repr, without drawing it.
NO_FIGURE_FORMATS = "--InlineBackend.figure_formats=[]"


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts inside the sandbox (or, unsandboxed, under rlimits).

    Set ``sandbox`` (a ``SandboxSetup``) before starting the kernel. The kernel binds its IPC
    sockets in its private folder; once it is launched, the manager's ``ip`` points at that
    folder as the host sees it, ``/proc/<init>/root/run/ctc``.
    """

    sandbox: SandboxSetup | None = None
    init_pid: int | None = None  # the sandbox's init, as the host numbers it

    def write_connection_file(self, **kwargs) -> tuple[str, dict]:
        written = super().write_connection_file(**kwargs)
        os.chmod(self.connection_file, 0o644)  # the kernel's own user must read it
        return written

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        argv = super().format_kernel_cmd(extra_arguments)
        setup = self.sandbox
        if not setup.limits.plots:  # matplotlib-inline then formats a figure as text alone
            argv = [*argv, NO_FIGURE_FORMATS]
        if not setup.use_sandbox:
            argv = [*limit_argv(setup.limits), *argv]
        else:
            argv = sandbox_argv(argv, [Path(self.connection_file)], setup.work_dir, setup.files,
                                setup.uid, setup.limits, cgroup=setup.cgroup is not None,
                                extra_env=setup.env)
        return setup.cgroup.wrap(argv) if setup.cgroup is not None else argv

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        await super()._async_launch_kernel(kernel_cmd, **kw)
        if self.sandbox.use_sandbox:
            self.init_pid = _first_child(self.provisioner.process.pid, seconds=30)
            if self.init_pid is None:
                raise RuntimeError("the sandbox did not start")
            self.ip = f"/proc/{self.init_pid}/root{PRIVATE_DIR}/k"

    def host_path(self, inside: str) -> Path:
        """Where the host finds a path of the kernel's private folder."""
        if self.sandbox.use_sandbox:
            return Path(f"/proc/{self.init_pid}/root{inside}")
        return Path(inside)

    def kill_everything(self) -> None:
        """Kill the kernel and every process it started, however detached."""
        if self.sandbox.cgroup is not None:
            self.sandbox.cgroup.kill()
        process = getattr(self.provisioner, "process", None) if self.provisioner else None
        if process is not None:
            kill_tree(process.pid)
            with contextlib.suppress(Exception):  # reap it: no zombie per attempt
                process.wait(timeout=5)


@dataclass
class SandboxSetup:
    """How one kernel is started: its files, user, limits and cgroup."""

    work_dir: Path
    files: list[Path]
    uid: int | None
    limits: Limits
    use_sandbox: bool
    cgroup: Cgroup | None = None
    private_dir: str = PRIVATE_DIR  # where the kernel writes probe replies
    env: dict[str, str] = field(default_factory=dict)  # more of the kernel's variables


