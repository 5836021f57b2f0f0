"""Real PostgreSQL and Redis servers for the tests, started on loopback in temporary folders.

Debian's packages (``make test`` installs them where it may). PostgreSQL will not run as root,
so a root test runs it as the ``postgres`` user. One server of each kind serves a whole test
run (``shared``: tests/conftest.py's ``postgres_server`` and ``redis_server``), each test on a
database of its own; a test that stops or restarts a server on purpose starts one of its own
(``postgres_server``, ``redis_server``), which is ended when its block ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from grader.common.faults import process_alive


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs, newest version first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def redis_programs() -> tuple[str, str] | None:
    """redis-server and redis-cli (Debian's redis-server package brings both), if installed."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return (server, cli) if server and cli else None


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return [shutil.which("runuser") or "/sbin/runuser", "-u", "postgres", "--", *argv]


@dataclass
class Server:
    """A server the tests started: its URL (with ``{db}`` for the database: PostgreSQL's name,
    Redis's number), the commands that stop it and start it again on the same port (with the
    same data, for PostgreSQL; Redis keeps none), and the one that ends it for good. Plain
    data, so that every xdist worker of a run can read it from a file."""

    url: str
    port: int
    stop_command: list[str]
    start_command: list[str]
    end_command: list[str]
    folder: str

    def stop(self) -> None:
        subprocess.run(self.stop_command, check=True, capture_output=True, cwd="/")

    def start(self) -> None:
        subprocess.run(self.start_command, check=True, capture_output=True, cwd="/")
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1",
                                                                         self.port), 1):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.start_command[0]} did not start")
            time.sleep(0.1)

    def started(self) -> Server:
        """Started (ended again, folder and all, if it does not start): itself."""
        try:
            self.start()
        except BaseException:
            self.end()
            raise
        return self

    def end(self) -> None:
        """Stop it at once, whatever it holds, and remove its folder."""
        subprocess.run(self.end_command, capture_output=True, cwd="/")
        shutil.rmtree(self.folder, ignore_errors=True)


def start_postgres(also_on: str = "") -> Server:
    """A PostgreSQL server on loopback, started. Its folder is a temporary one of its own:
    pytest's are closed to the postgres user. ``also_on``: another address of this machine it
    listens on too, trusting clients of its /24 (a network namespace's, say)."""
    binaries = postgres_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="ctc-postgres-"))
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        shutil.chown(sockets, "postgres", "postgres")
    port = free_port()
    subprocess.run(_as_postgres([str(binaries / "initdb"), "-D", str(data), "-A", "trust",
                                 "-U", "postgres", "--no-sync"]),
                   check=True, capture_output=True, cwd="/")
    if also_on:
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {also_on.rsplit('.', 1)[0]}.0/24 trust\n")
    listen = "127.0.0.1" + (f",{also_on}" if also_on else "")
    options = f"-p {port} -k {sockets} -c listen_addresses={listen} -c fsync=off"
    pg_ctl = str(binaries / "pg_ctl")
    server = Server(f"postgresql://postgres@127.0.0.1:{port}/{{db}}", port,
                    _as_postgres([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]),
                    _as_postgres([pg_ctl, "-D", str(data), "-o", options, "-l",
                                  str(folder / "server.log"), "-w", "start"]),
                    _as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]),
                    str(folder))
    return server.started()


def start_redis() -> Server:
    """A Redis server on loopback that keeps nothing on disk, started (a restart loses what
    it held, as a real one without persistence does). Its databases are numbered 0 to 999."""
    programs = redis_programs()
    if programs is None:
        raise RuntimeError("Redis is not installed (Debian: apt-get install redis-server)")
    executable, cli = programs
    folder = Path(tempfile.mkdtemp(prefix="ctc-redis-"))
    port = free_port()
    start = [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder), "--databases", "1000",
             "--daemonize", "yes", "--pidfile", str(folder / "redis.pid"),
             "--logfile", str(folder / "redis.log")]
    stop = [cli, "-p", str(port), "shutdown", "nosave"]
    server = Server(f"redis://127.0.0.1:{port}/{{db}}", port, stop, start, stop, str(folder))
    return server.started()


@contextlib.contextmanager
def postgres_server() -> Iterator[Server]:
    """A PostgreSQL server of the caller's own, ended when the block ends: for a test that
    stops it on purpose."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.end()


@contextlib.contextmanager
def redis_server() -> Iterator[Server]:
    """A Redis server of the caller's own, ended when the block ends: for a test that stops it
    on purpose."""
    server = start_redis()
    try:
        yield server
    finally:
        server.end()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def shared(folder: Path, kind: str, start: Callable[[], Server]) -> Iterator[Server]:
    """One server of ``kind`` for every process of a test run that asks (each xdist worker):
    ``folder`` is one they all see (conftest's ``shared_tmp``). The first to ask starts it,
    under a file lock; each signs in with its process id, and the last to sign out ends it,
    so that it stays up while any worker may still use it. A worker that died without
    signing out is signed out by the next that looks; a server left by workers that all died
    is ended and another started."""
    state, users = folder / f"{kind}-server.json", folder / f"{kind}-server.users"

    def signed_in() -> set[int]:
        pids = users.read_text().split() if users.exists() else []
        return {pid for pid in map(int, pids) if process_alive(pid)}

    with _locked(folder / f"{kind}-server.lock"):
        present = signed_in()
        if state.exists() and not present:  # its users died: it may be up, or not
            Server(**json.loads(state.read_text())).end()
            state.unlink()
        if not state.exists():
            state.write_text(json.dumps(dataclasses.asdict(start())))
        server = Server(**json.loads(state.read_text()))
        users.write_text(" ".join(map(str, present | {os.getpid()})))
    try:
        yield server
    finally:
        with _locked(folder / f"{kind}-server.lock"):
            left = signed_in() - {os.getpid()}
            users.write_text(" ".join(map(str, left)))
            if not left:
                server.end()
                state.unlink(missing_ok=True)


def next_number(counter: Path) -> int:
    """1, 2, 3, ... across every process of the run that shares ``counter``'s folder: a Redis
    database number that no other test of the run has."""
    with _locked(counter.with_name(counter.name + ".lock")):
        number = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(number))
    return number


def create_database(url_template: str, name: str) -> str:
    """A new, empty database on the server; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url_template.format(db="postgres"), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url_template.format(db=name)


def new_database(url_template: str, label: str) -> str:
    """A new, empty database named after ``label`` (a test's name, say) and made unique, on a
    server that other tests of the run share; its URL."""
    name = re.sub(r"[^a-z0-9_]+", "_", label.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return create_database(url_template, name)
