"""``truba up``: a whole cluster on this machine, in one command.

Starts local RabbitMQ nodes (unless ``--broker`` URLs are given), the scheduler and the daemons,
each a process of its own with its log in ``STATE/logs/``, prints the addresses, and stops them
all, in reverse order, on Ctrl-C or SIGTERM. With a command after ``--``, runs it against the
cluster (``TRUBA_SCHEDULER`` names the scheduler), then stops everything and exits with the
command's status. :class:`LocalCluster` is also what the integration tests run processes with.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from truba.local.layout import DEFAULT_CONFIG
from truba.local.node import LocalRabbitNode
from truba.local.nodes import start_nodes

READY_LINE = "truba scheduler listening on "


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``up`` subcommand."""
    parser = subparsers.add_parser("up", help="run a local cluster: brokers, scheduler, daemons")
    parser.add_argument("--brokers", type=int, default=2, metavar="N", help="local RabbitMQ nodes to start")
    parser.add_argument(
        "--broker",
        action="append",
        default=[],
        metavar="AMQP_URL",
        help="use this broker instead (repeatable)",
    )
    parser.add_argument("--daemons", type=int, default=2, metavar="N")
    parser.add_argument(
        "--slots", type=int, default=max(1, (os.cpu_count() or 2) // 2), metavar="N", help="slots per daemon"
    )
    parser.add_argument(
        "--allow",
        action="append",
        required=True,
        metavar="PATTERN",
        help="handler pattern the daemons may import (repeatable)",
    )
    parser.add_argument("--listen", default="127.0.0.1:50051", metavar="HOST:PORT", help="scheduler address")
    parser.add_argument(
        "--state", default=".truba", metavar="DIR", help="brokers' data, scheduler state, logs"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to run against the cluster")
    parser.set_defaults(func=main)


@dataclass
class TrubaProcess:
    """A ``python -m truba ...`` child with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int = 0
    """Where this run's output starts in ``log_path`` (logs are appended across runs)."""

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
    _logs: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> TrubaProcess:
        """Starts ``python -m truba ARGS`` with its output in ``STATE/logs/NAME.log``."""
        log_dir = self.state / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log_file)
        offset = log_file.tell()
        # A session of its own: Ctrl-C reaches `truba up` only, which stops children in order.
        popen = subprocess.Popen(
            [sys.executable, "-m", "truba", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env or os.environ.copy(),
            start_new_session=True,
        )
        process = TrubaProcess(name, popen, log_path, offset)
        self.processes.append(process)
        return process

    def start_scheduler(
        self, broker_urls: list[str], listen: str = "127.0.0.1:0", *extra: str
    ) -> TrubaProcess:
        """Starts the scheduler and waits until it serves; sets :attr:`address`."""
        broker_args = [arg for url in broker_urls for arg in ("--broker", url)]
        process = self.spawn(
            "scheduler",
            ["scheduler", "--listen", listen, *broker_args, "--state", str(self.state / "scheduler"), *extra],
        )
        self.address = self._wait_for_ready(process)
        return process

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


def start(args: argparse.Namespace) -> LocalCluster:
    """Starts brokers, scheduler and daemons as ``args`` say; the caller must ``stop()`` it."""
    state = Path(args.state).resolve()
    cluster = LocalCluster(state)
    try:
        urls = list(args.broker)
        scheduler_args: list[str] = []
        if not urls:
            began = time.monotonic()
            cluster.nodes = start_nodes(state / "brokers", args.brokers)
            urls = [node.url for node in cluster.nodes]
            _say(f"brokers: {' '.join(urls)} (started in {time.monotonic() - began:.1f} s)")
            scheduler_args = ["--consumer-timeout", str(LOCAL_CONSUMER_TIMEOUT)]
        cluster.start_scheduler(urls, args.listen, *scheduler_args)
        _say(f"scheduler: {cluster.address}")
        for i in range(args.daemons):
            cluster.start_daemon(f"daemon-{i}", args.slots, args.allow)
        cluster.wait_for_daemons(args.daemons)
        allowed = " ".join(args.allow)
        _say(f"daemons: {args.daemons} × {args.slots} slots, allow {allowed}; logs in {state}/logs")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]

    def request_stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    try:
        cluster = start(args)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as exc:
        _say(f"error: {exc}")
        return 1
    try:
        if command:
            env = {**os.environ, "TRUBA_SCHEDULER": cluster.address}
            _say(f"running: {' '.join(command)}")
            return subprocess.call(command, env=env)
        _say("cluster is up; Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 130 if command else 0
    finally:
        _say("stopping")
        cluster.stop()
        _say("stopped")


def _say(text: str) -> None:
    print(f"truba up: {text}", flush=True)
