"""Real RabbitMQ brokers for integration tests, behind one small interface.

:class:`BrokerNode` is what tests see. Two implementations satisfy it:

- :class:`truba.local.LocalRabbitNode`: a ``rabbitmq-server`` process on a free loopback port (the
  default, and the only choice on machines without a Docker engine, such as ours and CI);
- :class:`DockerRabbitNode`: a testcontainers RabbitMQ container, used when a Docker engine answers.

``TRUBA_TEST_BROKERS=local|docker`` forces the choice. A broker that cannot start raises: integration
tests fail rather than skip.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, Literal, Protocol

from truba.local import LocalRabbitNode, free_port, start_nodes, unique_nodename
from truba.local.layout import NO_BUSY_WAIT
from truba.local.probe import speaks_amqp

log = logging.getLogger(__name__)

Backend = Literal["local", "docker"]
BACKEND_ENV: Final = "TRUBA_TEST_BROKERS"
# A node boots in 5-20 s on our 2-core machines, and slower while other test sessions share the CPU.
START_TIMEOUT: Final = float(os.environ.get("TRUBA_TEST_BROKER_START_TIMEOUT", "120"))


class BrokerNode(Protocol):
    """One independent RabbitMQ broker that a test may inject process faults into."""

    @property
    def host(self) -> str:
        """Address of the AMQP listener."""

    @property
    def port(self) -> int:
        """AMQP port; unchanged by restart()."""

    @property
    def url(self) -> str:
        """``amqp://guest:guest@host:port/``."""

    def kill(self) -> None:
        """SIGKILL the broker and wait until it is gone."""

    def restart(self, timeout: float = 60.0) -> None:
        """Start again with the same port and data (stops it first if running)."""

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop, SIGKILL after ``timeout``."""

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP / cgroup freezer)."""

    def resume(self) -> None:
        """Thaw a paused broker."""

    def set_memory_alarm(self, on: bool) -> None:
        """Raise or clear the memory alarm, which blocks publishers."""

    def list_queues(self, vhost: str = "/") -> dict[str, int]:
        """Queue name → message count."""


def amqp_url(host: str, port: int) -> str:
    """The guest URL of a broker, or of a proxy in front of one."""
    return f"amqp://guest:guest@{host}:{port}/"


def docker_available() -> bool:
    """True if a Docker engine answers a ping within a few seconds."""
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable engine"
        return False


def choose_backend() -> Backend:
    """``$TRUBA_TEST_BROKERS`` if set, else docker when an engine answers, else local processes."""
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced in ("local", "docker"):
        return "docker" if forced == "docker" else "local"
    if forced:
        raise ValueError(f"{BACKEND_ENV} must be 'local' or 'docker', not {forced!r}")
    return "docker" if docker_available() else "local"


class DockerRabbitNode:
    """A RabbitMQ container bound to a fixed host port, so a killed and restarted broker keeps its URL.

    kill/restart use ``docker kill``/``docker start`` on the same container, so its data survives;
    pause/resume use the cgroup freezer; alarms and queue listings run ``rabbitmqctl`` inside it.
    """

    IMAGE: Final = os.environ.get("TRUBA_TEST_RABBITMQ_IMAGE", "rabbitmq:3.10")

    def __init__(self) -> None:
        from testcontainers.community.rabbitmq import RabbitMqContainer

        self._port = free_port()
        self._container = RabbitMqContainer(self.IMAGE)
        self._container.with_bind_ports(5672, self._port)
        self._container.with_name(unique_nodename("truba-test").partition("@")[0])
        self._container.with_env(
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", f"{NO_BUSY_WAIT} -rabbit consumer_timeout 7200000"
        )
        self._started = False

    @property
    def host(self) -> str:
        """Address of the AMQP listener."""
        return self._container.get_container_host_ip()

    @property
    def port(self) -> int:
        """AMQP port; unchanged by restart()."""
        return self._port

    @property
    def url(self) -> str:
        """``amqp://guest:guest@host:port/``."""
        return amqp_url(self.host, self._port)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Creates and starts the container; returns once AMQP answers."""
        self._container.start()
        self._started = True
        self._await_amqp(timeout)

    def _await_amqp(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not speaks_amqp(self.host, self._port):
            if time.monotonic() > deadline:
                stdout, stderr = self._container.get_logs()
                tail = (stdout + stderr).decode(errors="replace")[-4000:]
                raise RuntimeError(f"RabbitMQ container did not answer AMQP in {timeout}s\n{tail}")
            time.sleep(0.2)

    def _unpause(self) -> str:
        container = self._container.get_wrapped_container()
        container.reload()
        if container.status == "paused":  # docker refuses to kill or stop a paused container
            container.unpause()
            container.reload()
        return str(container.status)

    def kill(self) -> None:
        """SIGKILL the broker and wait until it is gone."""
        if self._unpause() == "running":
            container = self._container.get_wrapped_container()
            container.kill()
            container.wait(timeout=30)

    def restart(self, timeout: float = 60.0) -> None:
        """Start again with the same port and data (stops it first if running)."""
        if self._unpause() == "running":
            self._container.get_wrapped_container().stop(timeout=30)
        self._container.get_wrapped_container().start()
        self._await_amqp(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stops and removes the container. Idempotent."""
        if self._started:
            self._started = False
            self._unpause()
            self._container.stop()

    def pause(self) -> None:
        """Freeze the broker (cgroup freezer)."""
        self._container.get_wrapped_container().pause()

    def resume(self) -> None:
        """Thaw a paused broker."""
        self._container.get_wrapped_container().unpause()

    def _ctl(self, *args: str) -> str:
        result = self._container.exec(["rabbitmqctl", *args])
        output = result.output.decode(errors="replace") if result.output else ""
        if result.exit_code != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} exited {result.exit_code}: {output}")
        return output

    def set_memory_alarm(self, on: bool) -> None:
        """Raise or clear the memory alarm, which blocks publishers."""
        self._ctl("set_vm_memory_high_watermark", "0" if on else "0.4")

    def list_queues(self, vhost: str = "/") -> dict[str, int]:
        """Queue name → message count."""
        out = self._ctl("list_queues", "-p", vhost, "name", "messages", "--formatter", "json", "--silent")
        return {str(row["name"]): int(row.get("messages") or 0) for row in json.loads(out.strip() or "[]")}


class BrokerNodes:
    """Starts brokers of one backend in parallel, and stops every broker it started.

    Local nodes live in numbered directories under ``base_dir``; :meth:`discard` kills a node and
    deletes its data, :meth:`close` stops whatever is left.
    """

    def __init__(self, base_dir: Path, backend: Backend) -> None:
        self.base_dir = base_dir
        self.backend = backend
        self._brokers: list[BrokerNode] = []
        self._groups = 0
        self._lock = threading.Lock()

    def start(self, count: int) -> list[BrokerNode]:
        """Starts ``count`` independent brokers in parallel.

        Raises:
            NodeStartError, RuntimeError: a broker did not come up (the others are stopped).
        """
        with self._lock:
            self._groups += 1
            group = self._groups
        started = time.monotonic()
        if self.backend == "local":
            brokers: list[BrokerNode] = list(start_nodes(self.base_dir / f"g{group}", count, START_TIMEOUT))
        else:
            brokers = self._start_containers(count)
        with self._lock:
            self._brokers.extend(brokers)
        log.info(
            "tests.brokers.started",
            extra={"backend": self.backend, "count": count, "seconds": round(time.monotonic() - started, 2)},
        )
        return brokers

    def _start_containers(self, count: int) -> list[BrokerNode]:
        nodes = [DockerRabbitNode() for _ in range(count)]
        with ThreadPoolExecutor(max_workers=max(1, count)) as pool:
            futures = [pool.submit(node.start) for node in nodes]
            errors = [exc for exc in (f.exception() for f in futures) if exc is not None]
        if errors:
            for node in nodes:
                node.stop()
            raise errors[0]
        return list(nodes)

    def discard(self, brokers: list[BrokerNode]) -> None:
        """Kills the brokers (their data is not needed any more) and removes local data dirs."""
        for broker in brokers:
            broker.kill()
            broker.stop()
            if isinstance(broker, LocalRabbitNode):
                shutil.rmtree(broker.base_dir, ignore_errors=True)
        with self._lock:
            self._brokers = [b for b in self._brokers if all(b is not d for d in brokers)]

    def close(self) -> None:
        """Stops every broker still running. Resumes paused ones first."""
        with self._lock:
            brokers, self._brokers = self._brokers, []
        with ThreadPoolExecutor(max_workers=max(1, len(brokers))) as pool:
            for future in [pool.submit(b.stop) for b in brokers]:
                future.result()
