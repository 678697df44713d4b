"""A throw-away PostgreSQL server for tests and benches: a temporary cluster on 127.0.0.1 and
a free port.

Debian's PostgreSQL refuses to run as root, so as root the cluster is made and started as
the ``postgres`` user (``runuser``); as any other user it runs as that user. The server
listens on 127.0.0.1 only, with ``trust`` authentication (nothing else can reach it), and
its data directory is deleted when the server stops. The directory is in memory (``/dev/shm``)
where that has room: on disk, deleting it after its files were written back cost the
suite's last test 8-21 s of teardown (see ``data_parent``).

Use it through the fixtures of ``tests/conftest.py``: ``postgres_server`` (one server per
test session) and ``postgres_url`` (a fresh, empty database on it per test), e.g.::

    def test_something(postgres_url):
        store = ResultStore(postgres_url)  # postgresql+psycopg://postgres@127.0.0.1:PORT/test_3

Both skip, naming the reason, where PostgreSQL or psycopg is not installed (``.ci/run``
installs them).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

USER = "postgres"  # the superuser initdb creates (also the OS user as root)
SHM = Path("/dev/shm")
SHM_ROOM = 2 * 1024**3  # bytes free: the whole suite's ~50 databases are ~0.4 GB


def data_parent() -> str | None:
    """Where the cluster's folder goes: ``/dev/shm`` (a tmpfs) where it has ``SHM_ROOM``
    free, else the temporary directory (None). Each database is a copy of the template's
    ~300 files; once the kernel has written them back (after ~30 s), deleting them frees
    blocks on the disk, which on this machine's ext4 (mounted with ``discard``) took 7.9 s
    for 136 MB at the end of 73 tests (load 6.5) and 15 s for 5,100 files of 24 KiB
    written and synced (0.37 s unsynced, 0.10 s on tmpfs, session 19)."""
    try:
        if shutil.disk_usage(SHM).free >= SHM_ROOM and os.access(SHM, os.W_OK | os.X_OK):
            return str(SHM)
    except OSError:
        pass
    return None


def find_bindir() -> Path | None:
    """The newest PostgreSQL server binaries (Debian: /usr/lib/postgresql/N/bin)."""

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    """One running cluster; ``url(database)`` is a SQLAlchemy URL for psycopg 3."""

    bindir: Path
    datadir: Path
    port: int
    as_postgres: bool
    options: str = ""  # the server options it was started with (``pause`` starts it so again)
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL. ``FILE_COPY`` (PostgreSQL 15+; before 15
        the only way): the template's files copied, where 15's default writes all of them
        through the WAL (0.24 s against 0.08 s per database at load 7)."""
        import psycopg

        name = f"test_{next(self._names)}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True
        ) as connection:
            copy = " STRATEGY FILE_COPY" if connection.info.server_version >= 150000 else ""
            connection.execute(f'CREATE DATABASE "{name}"{copy}')
        return self.url(name)

    def pause(self) -> None:
        """Stop the server, keeping its data (``resume`` starts it again on the same port).
        ``-t``: pg_ctl's own wait (60 s by default) can run out on a loaded machine."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "-t", "300", "stop")

    def resume(self) -> None:
        log = str(self.datadir.parent / "log")
        self._run("pg_ctl", "-D", str(self.datadir), "-o", self.options, "-l", log, "-w", "-t",
                  "300", "start")  # fmt: skip

    def stop(self) -> None:
        """Stop and delete the cluster. ``-m immediate``: no shutdown checkpoint, which writes
        every dirty buffer to files deleted right after (s15: 10,911 buffers, 42 s of
        teardown on a loaded machine); ``pause`` keeps ``fast``, its data is read again."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.datadir.parent, ignore_errors=True)

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bindir / tool), *args]
        if self.as_postgres:
            command = ["runuser", "-u", USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=360)
        if check and done.returncode:  # what pg_ctl and the server said, not only the status
            raise RuntimeError(
                f"{' '.join(command)} exited {done.returncode}: {done.stdout} {done.stderr}\n"
                f"server log (last lines):\n{self.log_tail()}"
            )
        return done

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log (why it did not start or stop)."""
        log = self.datadir.parent / "log"
        text = log.read_text(errors="replace") if log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def start_postgres() -> PostgresServer:
    """initdb + pg_ctl start in a temporary directory; raises RuntimeError if unavailable."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries (initdb) not found; apt install postgresql")
    as_postgres = os.geteuid() == 0
    root = Path(tempfile.mkdtemp(prefix="aisafety-pg-", dir=data_parent()))
    datadir = root / "data"
    if as_postgres:
        shutil.chown(root, USER, USER)
    server = PostgresServer(bindir, datadir, free_port(), as_postgres)
    try:
        server._run(
            "initdb", "-D", str(datadir), "-U", USER, "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        options = (
            f"-p {server.port} -c listen_addresses=127.0.0.1 -k {root} -c fsync=off "
            "-c max_connections=200"
        )
        server.options = options
        server._run(
            "pg_ctl", "-D", str(datadir), "-o", options, "-l", str(root / "log"), "-w", "start"
        )
    except RuntimeError as exc:  # its message has the server log's last lines
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {exc}") from None
    return server
