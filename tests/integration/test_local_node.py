"""The broker toolkit against real RabbitMQ: independent nodes, kill -9, pause, alarms, proxy faults."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import aio_pika
import pika
import pika.exceptions
import pytest

from tests.integration.brokers import BrokerNode, amqp_url
from truba.local import LocalRabbitNode, NodeStartError, ThreadedFaultProxy
from truba.local.probe import speaks_amqp

pytestmark = pytest.mark.integration

FreshNodes = Callable[[int], list[BrokerNode]]
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@contextmanager
def channel(url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A confirming channel on a short-timeout connection, closed on exit."""
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 10
    connection = pika.BlockingConnection(params)
    try:
        ch = connection.channel()
        ch.confirm_delivery()
        yield ch
    finally:
        if connection.is_open:
            connection.close()


def publish_confirmed(url: str, queue: str, body: bytes) -> None:
    """Declares a durable queue and publishes one persistent message; returns once it is confirmed."""
    with channel(url) as ch:
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)  # raises unless acked


def get_one(url: str, queue: str) -> bytes | None:
    """Takes one message off ``queue`` (acked), or None if it is empty."""
    with channel(url) as ch:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        return cast(bytes, body) if method is not None else None  # types-pika says str; it is bytes


def recovery_lines(node: LocalRabbitNode) -> str:
    """The broker log's lines on vhosts, seeding, queue recovery, warnings and errors (a CI report
    truncates long output, and a plain tail shows only boot steps)."""
    log_file = node.base_dir / "log" / f"{node.nodename}.log"
    words = (
        "vhost",
        "Recovering",
        "seed",
        "durable-q",
        "[error]",
        "[warning]",
        "startup complete",
        "SIGTERM",
    )
    lines = log_file.read_text(errors="replace").splitlines() if log_file.exists() else []
    picked = [line[:200] for line in lines if any(word in line for word in words)]
    # The log loses what the logger still buffered at a kill -9; stdout has each boot's banner, and
    # the database's files say whether the first boot wrote the queue's record at all.
    stdout = node.base_dir / "stdout.log"
    printed = stdout.read_text(errors="replace").splitlines()
    boots = [line[:160] for line in printed if "Starting broker" in line]
    database = node.base_dir / "mnesia" / node.nodename
    files = sorted(
        f"{path.relative_to(database)} {path.stat().st_size} B"
        for path in database.glob("*")
        if path.is_file()
    )
    return "\n".join([*picked[-40:], "boots in stdout:", *boots, "database files:", *files])


def test_two_nodes_are_independent_brokers(
    rabbit_nodes: list[BrokerNode], request: pytest.FixtureRequest
) -> None:
    first, second = rabbit_nodes
    assert first.port != second.port
    only_first, only_second = f"{request.node.name}-1", f"{request.node.name}-2"
    # Given a persistent message confirmed by each broker,
    publish_confirmed(first.url, only_first, b"one")
    publish_confirmed(second.url, only_second, b"two")
    # then each broker holds only its own queue, and delivers its own message.
    assert only_first in first.list_queues() and only_first not in second.list_queues()
    assert only_second in second.list_queues() and only_second not in first.list_queues()
    assert get_one(first.url, only_first) == b"one"
    assert get_one(second.url, only_second) == b"two"
    for node, queue in ((first, only_first), (second, only_second)):
        with channel(node.url) as ch:
            ch.queue_delete(queue)


def test_list_queues_counts_messages(rabbit_nodes: list[BrokerNode], request: pytest.FixtureRequest) -> None:
    node = rabbit_nodes[1]
    empty, full = f"{request.node.name}-empty", f"{request.node.name}-full"
    with channel(node.url) as ch:
        ch.queue_declare(empty, durable=True)
        ch.queue_declare(full, durable=True)
        for i in range(3):
            ch.basic_publish("", full, b"%d" % i, PERSISTENT, mandatory=True)
    queues = node.list_queues()
    assert queues[empty] == 0
    assert queues[full] == 3
    with channel(node.url) as ch:
        ch.queue_delete(empty)
        ch.queue_delete(full)
    assert empty not in node.list_queues()


def test_kill9_and_restart_keep_a_confirmed_persistent_message(fresh_nodes: FreshNodes) -> None:
    (node,) = fresh_nodes(1)
    url = node.url
    publish_confirmed(url, "durable-q", b"survivor")
    pid = node.pid if isinstance(node, LocalRabbitNode) else None
    # When the broker is killed with SIGKILL,
    node.kill()
    if pid is not None:
        assert not Path(f"/proc/{pid}").exists(), "beam.smp itself must be gone, not just a wrapper"
    assert not speaks_amqp(node.host, node.port, timeout=1.0)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        get_one(url, "durable-q")
    # then after a restart on the same port, the confirmed message is still there.
    node.restart()
    assert node.url == url
    # Queues are recovered just after the node answers AMQP, usually within a second; after an unclean stop
    # on a loaded machine (CI) a classic queue once took over 15 s to be listed again, so the bound is 60 s.
    deadline = time.monotonic() + 60
    while (queues := node.list_queues()) != {"durable-q": 1} and time.monotonic() < deadline:
        time.sleep(0.2)
    recovery = recovery_lines(node) if isinstance(node, LocalRabbitNode) else ""
    assert queues == {"durable-q": 1}, f"queues 60 s after the restart: {queues}\n{recovery}"
    assert get_one(url, "durable-q") == b"survivor"


def test_pause_freezes_the_broker_and_resume_thaws_it(fresh_nodes: FreshNodes) -> None:
    (node,) = fresh_nodes(1)
    with channel(node.url) as ch:
        ch.queue_declare("before-pause", durable=True)
        node.pause()
        try:
            # The kernel still accepts TCP connections, but nobody answers AMQP.
            assert not speaks_amqp(node.host, node.port, timeout=1.0)
        finally:
            node.resume()
        assert speaks_amqp(node.host, node.port, timeout=5.0)
        # A connection opened before the pause carries on.
        ch.basic_publish("", "before-pause", b"after", PERSISTENT, mandatory=True)
    assert node.list_queues() == {"before-pause": 1}


async def test_memory_alarm_blocks_publishers_until_cleared(fresh_nodes: FreshNodes) -> None:
    (node,) = await asyncio.to_thread(fresh_nodes, 1)
    connection = await aio_pika.connect(node.url, timeout=10)
    async with connection:
        ch = await connection.channel(publisher_confirms=True)
        queue = await ch.declare_queue("alarmed", durable=True)
        message = aio_pika.Message(b"blocked", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        # Given a memory alarm, a confirmed publish does not complete,
        await asyncio.to_thread(node.set_memory_alarm, True)
        publish = asyncio.create_task(ch.default_exchange.publish(message, queue.name, mandatory=True))
        done, _ = await asyncio.wait({publish}, timeout=2.0)
        assert not done, "publish was confirmed during a memory alarm"
        # and once the alarm clears, it is confirmed.
        await asyncio.to_thread(node.set_memory_alarm, False)
        await asyncio.wait_for(publish, 20)
    assert await asyncio.to_thread(node.list_queues) == {"alarmed": 1}


def test_fault_proxy_cut_breaks_a_live_connection(
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
    request: pytest.FixtureRequest,
) -> None:
    node = rabbit_nodes[0]
    proxy = fault_proxy(node)
    url = amqp_url(proxy.host, proxy.port)
    queue = f"{request.node.name}-q"
    with channel(url) as ch:
        ch.queue_declare(queue, durable=True)
        assert proxy.connection_count == 1
        # When the proxy resets the connection, the next operation fails at once.
        assert proxy.cut() == 1
        started = time.monotonic()
        with pytest.raises(pika.exceptions.AMQPError):
            ch.basic_publish("", queue, b"lost", PERSISTENT, mandatory=True)
        assert time.monotonic() - started < 5
    # A new connection through the proxy works, and the broker itself never noticed a fault.
    publish_confirmed(url, queue, b"through")
    assert get_one(node.url, queue) == b"through"
    with channel(node.url) as ch:
        ch.queue_delete(queue)


def test_bad_config_fails_start_with_the_log(tmp_path: Path) -> None:
    node = LocalRabbitNode(tmp_path / "bad", config={"no_such_setting": "1"})
    with pytest.raises(NodeStartError, match="no_such_setting"):
        node.start(timeout=60)
    assert not node.running


def test_a_node_dies_with_its_owner_process(tmp_path: Path) -> None:
    # Given a process that starts a node and dies without stopping it,
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from truba.local import LocalRabbitNode
        node = LocalRabbitNode(Path({str(tmp_path / "orphan")!r}))
        node.start(timeout=120)
        print(node.pid, flush=True)
        os._exit(0)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    # then its broker halts within seconds (stdin EOF), leaving nothing running.
    deadline = time.monotonic() + 15
    while beam_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = beam_alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)  # started by this test (through the child): never leak it
    assert not alive, "orphaned node kept running"


def beam_alive(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) beam.smp."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm, _, rest = stat.partition(") ")
    return comm.endswith("(beam.smp") and rest[:1] not in ("Z", "X")
