"""The whole cluster a chaos run breaks: independent RabbitMQ nodes behind fault proxies, a
scheduler, daemons (fork-server slots) and the client process, each startable, killable and
measurable by the nemesis.

Every truba process reaches the brokers through the proxies (the scheduler hands the proxies'
URLs out), so a stalled or cut proxy hits the client's, the daemons' and the scheduler's
connections alike. Memory alarms and kills go to the nodes themselves.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tests.chaos import procs
from tests.integration.brokers import amqp_url
from truba.local import LocalRabbitNode, ThreadedFaultProxy, start_nodes
from truba.local.cluster import LocalCluster, TrubaProcess
from truba.local.nodes import stop_nodes

log = logging.getLogger("chaos.rig")
ALLOW = ["tests.handlers.*"]
BROKER_START_TIMEOUT = float(os.environ.get("TRUBA_TEST_BROKER_START_TIMEOUT", "180"))


class Rig:
    """Brokers, proxies, scheduler, daemons and the client of one chaos run, under ``workdir``."""

    def __init__(self, workdir: Path, *, brokers: int = 2, daemons: int = 2, slots: int = 2) -> None:
        self.workdir = workdir
        self.broker_count, self.daemon_count, self.slot_count = brokers, daemons, slots
        self.nodes: list[LocalRabbitNode] = []
        self.proxies: list[ThreadedFaultProxy] = []
        self.cluster = LocalCluster(workdir / "cluster")
        self.daemons: list[TrubaProcess] = []
        self.scheduler: TrubaProcess | None = None
        self.client: subprocess.Popen[bytes] | None = None
        self.client_incarnations: list[int] = []
        self._client_log: IO[bytes] | None = None

    def start(self) -> None:
        (self.workdir / "executions").mkdir(parents=True, exist_ok=True)
        self.nodes = start_nodes(self.workdir / "rmq", self.broker_count, BROKER_START_TIMEOUT)
        for node in self.nodes:
            proxy = ThreadedFaultProxy(node.host, node.port)
            proxy.start()
            self.proxies.append(proxy)
        urls = [amqp_url(p.host, p.port) for p in self.proxies]
        self.scheduler = self.cluster.start_scheduler(urls, "127.0.0.1:0", "--heartbeat-interval", "0.5")
        for i in range(self.daemon_count):
            self.daemons.append(self.cluster.start_daemon(f"d{i}", self.slot_count, ALLOW))
        self.cluster.wait_for_daemons(self.daemon_count, timeout=120)

    def start_client(self) -> None:
        if self._client_log is None:
            self._client_log = open(self.workdir / "client.log", "ab")  # noqa: SIM115 - closed in stop()
        self.client = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.client_proc", self.cluster.address, str(self.workdir)],
            stdout=self._client_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client_incarnations.append(self.client.pid)

    def restart_daemon(self, index: int) -> None:
        self.daemons[index] = self.cluster.respawn(self.daemons[index])

    def restart_scheduler(self) -> None:
        assert self.scheduler is not None
        self.scheduler = self.cluster.respawn(self.scheduler)

    def rss(self) -> dict[str, float]:
        """Resident MiB per role: each broker, the scheduler, each daemon, each daemon's slots and
        templates together, the client."""
        sizes: dict[str, float] = {}
        for i, node in enumerate(self.nodes):
            sizes[f"broker{i}"] = procs.rss_mib(node.pid) if node.running else 0.0
        if self.scheduler is not None:
            sizes["scheduler"] = procs.rss_mib(self.scheduler.pid)
        for i, daemon in enumerate(self.daemons):
            sizes[f"d{i}"] = procs.rss_mib(daemon.pid)
            sizes[f"d{i}.slots"] = sum(procs.rss_mib(p) for p in procs.descendants(daemon.pid))
        if self.client is not None:
            sizes["client"] = procs.rss_mib(self.client.pid)
        return {name: round(mib, 1) for name, mib in sizes.items()}

    def logs(self, tail: int = 3000) -> str:
        parts = [f"--- {p.name}\n{p.log()[-tail:]}" for p in self.cluster.processes]
        client_log = self.workdir / "client.log"
        if client_log.exists():
            parts.append(f"--- client\n{client_log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        if self.client is not None and self.client.poll() is None:
            self.client.kill()
            self.client.wait()
        if self._client_log is not None:
            self._client_log.close()
        for node in self.nodes:  # no alarm or pause may outlive the run
            if node.running:
                try:
                    node.set_memory_alarm(False)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
        self.cluster.stop()
        for proxy in self.proxies:
            proxy.close()
        stop_nodes(self.nodes)

    def wait_client(self, timeout: float) -> int | None:
        """The client's exit code, or None if it still runs after ``timeout`` seconds."""
        assert self.client is not None
        try:
            return self.client.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def now() -> float:
    return time.time()
