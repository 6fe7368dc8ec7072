"""The processes of a local truba cluster: started, restarted and stopped in order.

Each process runs ``python -m truba ...`` with its output in ``STATE/logs/NAME.log``. The first
start of a name in a :class:`LocalCluster` moves the previous run's log to ``NAME.log.1`` (one
run is kept, so logs do not grow without bound); every start, restarts included, begins with a
marker line (``--- truba: NAME started ... ---``). ``truba up`` (:mod:`truba.local.up`) and the
integration tests run their processes with it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from truba.local.layout import DEFAULT_CONFIG
from truba.local.node import LocalRabbitNode

log = logging.getLogger(__name__)

READY_LINE = "truba scheduler listening on "
HTTP_LINE = "truba scheduler http on "


@dataclass
class TrubaProcess:
    """A ``python -m truba ...`` child with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int = 0
    """Where this start's output begins in ``log_path`` (restarts append to it)."""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "local.process.killed",
                extra={
                    "truba_process": self.name,
                    "pid": self.popen.pid,
                    "why": f"still running {timeout:g} s after SIGTERM",
                },
            )
            self.popen.kill()
            self.popen.wait()

    def log(self) -> str:
        """This run's output so far."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as file:
            file.seek(self.log_offset)
            return file.read().decode(errors="replace")


@dataclass
class LocalCluster:
    """The processes of a local cluster, started and stopped in order."""

    state: Path
    nodes: list[LocalRabbitNode] = field(default_factory=list)
    processes: list[TrubaProcess] = field(default_factory=list)
    address: str = ""
    http: str = ""
    """The scheduler's dashboard URL, ``http://HOST:PORT/`` ("" when its HTTP is off)."""
    log_args: list[str] = field(default_factory=list)
    """Flags every scheduler and daemon started here gets first (``truba up``'s ``--log-level``
    and ``--log-format``); flags given to one start come after them and win."""
    _logs: list[IO[bytes]] = field(default_factory=list)
    _started: set[str] = field(default_factory=set)

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> TrubaProcess:
        """Starts ``python -m truba ARGS`` with its output in ``STATE/logs/NAME.log``."""
        log_dir = self.state / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        if name not in self._started and log_path.exists():
            log_path.replace(log_dir / f"{name}.log.1")  # the previous run's log; older ones go
        restart = name in self._started
        self._started.add(name)
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log_file)
        when = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        verb = "restarted" if restart else "started"
        log_file.write(f"--- truba: {name} {verb} at {when}: truba {' '.join(args)} ---\n".encode())
        log_file.flush()
        offset = log_file.tell()
        # A session of its own: Ctrl-C reaches `truba up` only, which stops children in order.
        popen = subprocess.Popen(
            [sys.executable, "-m", "truba", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env or os.environ.copy(),
            start_new_session=True,
        )
        process = TrubaProcess(name, popen, log_path, offset, list(args), env)
        self.processes.append(process)
        return process

    def respawn(self, process: TrubaProcess) -> TrubaProcess:
        """Starts ``process`` again (same name, arguments and log) in its place; it must have exited.

        A scheduler comes back on the address it served (not on a fresh port 0).
        """
        args = list(process.args)
        if process.name == "scheduler" and self.address and "--listen" in args:
            args[args.index("--listen") + 1] = self.address
        self.processes.remove(process)
        again = self.spawn(process.name, args, process.env)
        if process.name == "scheduler":
            self._wait_for_ready(again)
            self.http = self._http_of(again)
        return again

    def start_scheduler(
        self, broker_urls: list[str], listen: str = "127.0.0.1:0", *extra: str
    ) -> TrubaProcess:
        """Starts the scheduler and waits until it serves; sets :attr:`address`."""
        broker_args = [arg for url in broker_urls for arg in ("--broker", url)]
        process = self.spawn(
            "scheduler",
            [
                "scheduler",
                "--listen",
                listen,
                *broker_args,
                "--state",
                str(self.state / "scheduler"),
                *self.log_args,
                *extra,
            ],
        )
        self.address = self._wait_for_ready(process)
        self.http = self._http_of(process)
        return process

    @staticmethod
    def _http_of(process: TrubaProcess, timeout: float = 2.0) -> str:
        """The dashboard's URL the scheduler prints right after its ready line ("" when its HTTP
        is off: no such line within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in process.log().splitlines():
                if line.startswith(HTTP_LINE):
                    return line.removeprefix(HTTP_LINE).strip()
            if time.monotonic() > deadline or not process.alive():
                return ""
            time.sleep(0.02)

    def start_daemon(self, name: str, slots: int, allow: list[str], *extra: str) -> TrubaProcess:
        allow_args = [arg for pattern in allow for arg in ("--allow", pattern)]
        return self.spawn(
            name,
            [
                "daemon",
                "--scheduler",
                self.address,
                "--slots",
                str(slots),
                "--id",
                name,
                "--drain-timeout",
                str(DAEMON_DRAIN_TIMEOUT),
                *allow_args,
                *self.log_args,
                *extra,
            ],
        )

    def _wait_for_ready(self, process: TrubaProcess, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in process.log().splitlines():
                if line.startswith(READY_LINE):
                    return line.removeprefix(READY_LINE).strip()
            if not process.alive():
                raise RuntimeError(
                    f"{process.name} exited with {process.popen.returncode}; see {process.log_path}"
                )
            time.sleep(0.05)
        raise RuntimeError(f"{process.name} not ready after {timeout:.0f} s; see {process.log_path}")

    def wait_for_daemons(self, count: int, timeout: float = 60.0) -> None:
        """Waits until ``count`` daemons are connected to the scheduler."""
        from truba.client import connect

        deadline = time.monotonic() + timeout
        with connect(self.address) as client:
            while time.monotonic() < deadline:
                if client.cluster_info().daemons >= count:
                    return
                for process in self.processes:
                    if not process.alive():
                        raise RuntimeError(f"{process.name} exited; see {process.log_path}")
                time.sleep(0.1)
        raise RuntimeError(f"{count} daemons did not connect within {timeout:.0f} s; see {self.state}/logs")

    def stop(self) -> None:
        """Stops daemons and scheduler (SIGTERM, newest first), then the local nodes."""
        for process in reversed(self.processes):
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            process.terminate()
        for node in reversed(self.nodes):
            node.stop()
        for log_file in self._logs:
            log_file.close()
        self._logs.clear()


DAEMON_DRAIN_TIMEOUT = 3.0
"""Seconds a local daemon may finish running tasks on shutdown before it hands them back."""
LOCAL_CONSUMER_TIMEOUT = int(DEFAULT_CONFIG["consumer_timeout"]) / 1000
"""The consumer_timeout of the nodes ``truba up`` starts, seconds."""
