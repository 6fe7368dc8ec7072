"""A real PostgreSQL server for tests: Debian's ``postgresql`` package, run by the test itself.

:class:`LocalPostgres` runs ``initdb`` in a temporary folder of its own, then ``postgres`` on a
free loopback port with its unix socket in that folder, so it never meets the machine's own
clusters (a distribution service on 5432 is left alone). The server runs in a process group of
its own: :meth:`LocalPostgres.kill` is a ``kill -9`` of the postmaster and every backend,
:meth:`LocalPostgres.restart` starts it again on the same port and data (crash recovery), and
:meth:`LocalPostgres.close` stops it and removes the folder. As root (CI, our machines) the
server runs as the ``postgres`` user, since ``initdb`` refuses root.

A server that cannot start raises: the tests that need one fail, they are not skipped.
``scripts/bootstrap`` installs the package where ``initdb`` is missing.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

import psycopg

from truba.local import free_port

START_TIMEOUT: Final = float(os.environ.get("TRUBA_TEST_POSTGRES_START_TIMEOUT", "60"))
SUPERUSER: Final = "truba"
_names = itertools.count(1)


def postgres_bin() -> Path:
    """The newest ``/usr/lib/postgresql/*/bin`` that has ``initdb``.

    Raises:
        RuntimeError: Debian's postgresql package is not installed.
    """
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL's initdb is missing: install Debian's postgresql package (scripts/bootstrap as root)"
        )
    return Path(found[-1]).parent


class LocalPostgres:
    """One PostgreSQL server of the test's own, on a free port; trust authentication."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="truba-pg-"))
        self.data = self.folder / "data"
        self.log_path = self.folder / "postgres.log"
        self.port = free_port()
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._process: subprocess.Popen[bytes] | None = None
        if self._user is not None:
            os.chown(self.folder, self._user.pw_uid, self._user.pw_gid)
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )

    def url(self, dbname: str = "postgres") -> str:
        """``postgresql://truba@127.0.0.1:PORT/DBNAME`` (TCP, so a fault proxy can sit between)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def socket_url(self, dbname: str = "postgres") -> str:
        """The same database through the unix socket in the server's folder."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.folder}&port={self.port}"

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Starts the server and waits until it accepts connections.

        Raises:
            RuntimeError: it exited, or did not answer within ``timeout`` seconds.
        """
        if self.running:
            return
        log = self.log_path.open("ab")
        # fsync off: a killed server still recovers from its WAL (the OS keeps what was written).
        self._process = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.folder),
                "-h",
                "127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=50",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=self._user.pw_uid if self._user else None,
            group=self._user.pw_gid if self._user else None,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.socket_url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"postgres did not start on port {self.port}; its log:\n{self.log()[-3000:]}"
                    ) from None
                time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """``kill -9`` of the server and its backends; returns once the postmaster is gone."""
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            group = self._process.pid
            self._process.wait(30)
            self._process = None
            # The backends got the signal too; wait until the group is empty, so that a restart
            # does not find their shared memory still attached.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.killpg(group, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT), then :meth:`kill` after ``timeout`` seconds."""
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGINT)
            try:
                self._process.wait(timeout)
                self._process = None
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Starts the server again on the same port and data (stopping it first if running)."""
        self.stop()
        self.start()

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        name = f"t{os.getpid()}_{next(_names)}"
        with psycopg.connect(self.socket_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stops the server and removes its folder."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, argv: list[str]) -> None:
        result = subprocess.run(
            argv,
            capture_output=True,
            timeout=START_TIMEOUT,
            user=self._user.pw_uid if self._user else None,
            group=self._user.pw_gid if self._user else None,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}): {result.stderr.decode()[-2000:]}")
