"""Delayed messages on real brokers: the delay levels hold them, no consumer does, and they come
out on time (±1 s), in due order, also across a broker killed -9 and restarted; a job's delayed
tasks run on time and the job ends only after them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import truba
from tests.integration.brokers import BrokerNode
from tests.integration.processes import Cluster
from truba.pipes import delay
from truba.pipes.base import Listener
from truba.pipes.broker import QueueSpec
from truba.pipes.rabbit import RabbitBroker
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

TOLERANCE = 1.0


async def _arrivals(listener: Listener[bytes], count: int, timeout: float) -> list[tuple[bytes, float]]:
    """``count`` messages (acked) with when each arrived."""
    got: list[tuple[bytes, float]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        delivery = await listener.get(0.2)
        if delivery is not None:
            got.append((delivery.message, time.time()))
            await delivery.ack()
    return got


async def test_delays_of_one_to_five_seconds_arrive_on_time_and_in_due_order(
    rabbit_nodes: list[BrokerNode], request: pytest.FixtureRequest
) -> None:
    broker = RabbitBroker(rabbit_nodes[0].url, name=request.node.nodeid)
    spec = QueueSpec(f"truba.test.{request.node.name}", delays=True)
    try:
        await broker.declare(spec)  # the delay levels, once, and the queue bound to them
        sender = await broker.sender(spec, delayed=True)
        listener = await broker.listener(spec.name, prefetch=10)
        start = time.time()
        delays = [5, 1, 4, 2, 3, 1.5, 2.5, 3.5, 4.5, 1.2]
        dues = {f"d{d}".encode(): start + d for d in delays}
        await asyncio.gather(*[await sender.send(delay.with_due(body, due)) for body, due in dues.items()])
        assert await listener.get(0.5) is None  # nothing is delivered before its time
        got = await _arrivals(listener, len(delays), timeout=15)
        errors = {body: round(at - dues[body], 2) for body, at in got}
        assert [body for body, _ in got] == sorted(dues, key=dues.__getitem__)
        assert all(abs(error) <= TOLERANCE for error in errors.values()), errors
        await listener.close()
        await sender.close()
    finally:
        await broker.close()


async def test_delayed_messages_survive_a_broker_killed_and_restarted_in_between(
    fresh_nodes: Callable[[int], list[BrokerNode]], request: pytest.FixtureRequest
) -> None:
    (node,) = await asyncio.to_thread(fresh_nodes, 1)
    broker = RabbitBroker(node.url, name=request.node.nodeid)
    # A classic target: see test_pipes_faults (a killed single-member quorum queue may refuse a
    # consumer for minutes on 3.10.8); the delay levels are quorum queues, with no consumers.
    spec = QueueSpec("truba.test.delays.kill9", kind="classic", delays=True)
    try:
        await broker.declare(spec)
        sender = await broker.sender(spec, delayed=True)
        start = time.time()
        bodies = [f"m{i}".encode() for i in range(50)]
        sends = [await sender.send(delay.with_due(body, start + 3 + i / 10)) for i, body in enumerate(bodies)]
        await asyncio.wait_for(asyncio.gather(*sends), 30)
        await sender.close()
        await asyncio.to_thread(node.kill)
        await asyncio.to_thread(node.restart)
        await broker.close()
        broker = RabbitBroker(node.url, name=request.node.nodeid)  # the old connection died
        listener = await broker.listener(spec.name, prefetch=100)
        got = await _arrivals(listener, len(bodies), timeout=60)
        assert sorted(body for body, _ in got) == sorted(bodies)
        assert all(at >= start + 3 - TOLERANCE for _, at in got)
        await listener.close()
    finally:
        await broker.close()


def test_delayed_tasks_of_a_job_run_on_time_in_due_order_and_the_job_ends_after_them(
    rabbit_nodes: list[BrokerNode], tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path, list[object](rabbit_nodes))
    try:
        cluster.start(daemons=1, slots=2)
        with truba.connect(cluster.address) as client:
            job = client.create_job(handler="tests.handlers.timing:started_at")
            delays = [3, 1, 5, 2, 4, 1.5, 4.5, 2.5, 3.5]
            dues: dict[str, float] = {}
            for seconds in delays:
                dues[job.submit(0.0, delay=seconds)] = time.time() + seconds
            job.close()
            assert client.get_job_info(job.id).state == jobs_pb2.JOB_STATE_CLOSED
            outcomes = list(job.results())
            info = client.get_job_info(job.id)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.local.stop()
    started = {o.task_id: float(o.value) for o in outcomes}  # type: ignore[arg-type]
    assert sorted(started) == sorted(dues)
    errors = {task_id: round(started[task_id] - due, 2) for task_id, due in dues.items()}
    assert all(abs(error) <= TOLERANCE for error in errors.values()), errors
    assert sorted(started, key=started.__getitem__) == sorted(dues, key=dues.__getitem__)
    assert info.state == jobs_pb2.JOB_STATE_FINISHED


def test_a_jobs_delayed_tasks_survive_its_broker_killed_and_restarted_before_they_are_due(
    fresh_nodes: Callable[[int], list[BrokerNode]], tmp_path: Path
) -> None:
    (node,) = fresh_nodes(1)
    cluster = Cluster(tmp_path, [node])
    try:
        cluster.start(daemons=1, slots=2)
        with truba.connect(cluster.address) as client:
            # Classic task queue: see test_pipes_faults (3.10.8 and killed single-member quorum queues).
            job = client.create_job(handler="tests.handlers.timing:started_at", queue_type="classic")
            ids = [job.submit(0.0, delay=6 + i / 10) for i in range(20)]
            job.close()  # every task confirmed: in the delay levels
            node.kill()
            node.restart()
            outcomes = list(job.results())
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.local.stop()
    assert sorted(o.task_id for o in outcomes) == sorted(ids)
    assert all(o.ok for o in outcomes)
