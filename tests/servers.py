"""Real PostgreSQL and Redis servers for the tests, started on loopback in temporary folders.

Debian's packages (``make test`` installs them where it may). PostgreSQL will not run as root,
so a root test runs it as the ``postgres`` user; a server is stopped when its block ends.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return [shutil.which("runuser") or "/sbin/runuser", "-u", "postgres", "--", *argv]


@dataclass
class Server:
    """A server the tests started: its URL (PostgreSQL's with ``{db}`` for the database) and
    the commands that stop and start it again on the same port, with the same data."""

    url: str
    stop_command: list[str]
    start_command: list[str]

    def stop(self) -> None:
        subprocess.run(self.stop_command, check=True, capture_output=True, cwd="/")

    def start(self) -> None:
        subprocess.run(self.start_command, check=True, capture_output=True, cwd="/")


@contextlib.contextmanager
def postgres_server() -> Iterator[Server]:
    """A PostgreSQL server on loopback. Its folder is a temporary one of its own: pytest's are
    closed to the postgres user."""
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
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = str(binaries / "pg_ctl")
    server = Server(f"postgresql://postgres@127.0.0.1:{port}/{{db}}",
                    _as_postgres([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]),
                    _as_postgres([pg_ctl, "-D", str(data), "-o", options, "-l",
                                  str(folder / "server.log"), "-w", "start"]))
    server.start()
    try:
        yield server
    finally:
        subprocess.run(_as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True, cwd="/")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server on loopback; yields a URL template with ``{db}`` for the database."""
    with postgres_server() as server:
        yield server.url


def create_database(url_template: str, name: str) -> str:
    """A new, empty database on the server; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url_template.format(db="postgres"), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url_template.format(db=name)


@contextlib.contextmanager
def redis(folder: Path) -> Iterator[str]:
    """A Redis server on loopback, nothing saved to disk; yields its URL."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise RuntimeError("Redis is not installed (Debian: apt-get install redis-server)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(folder)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=20)
