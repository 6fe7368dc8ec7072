"""Issue 18, its last open case: a frame member a daemon handed back must not run twice when the
frame comes back redelivered (its channel cut before the frame's ack).

A daemon's real job pipes and task endings over a real broker, reached through a fault proxy: the
daemon takes a frame of three, keeps running the first and hands the other two back (each
published again as a message of its own, then settled in the frame). The proxy then cuts its
connection before the frame's ack, so the broker redelivers the whole frame. A second daemon
takes everything there is: each task must come to it once, the two handed back only as their
copies (the members they replaced in the redelivered frame have a hand-back record in the result
log).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest

from tests.integration.brokers import BrokerNode, amqp_url
from tests.integration.test_daemon_harness import JobQueues
from truba.daemon.job_pipes import JobPipes, Wanted, open_job_pipes
from truba.daemon.stats import JobStats
from truba.daemon.task_endings import TaskEndings
from truba.local import ThreadedFaultProxy
from truba.pipes.base import Delivery
from truba.pipes.broker import QueueSpec
from truba.pipes.frame import FrameLimits
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker
from truba.pipes.stacks import send_stack
from truba.wire import TaskCodec, TaskMessage

pytestmark = pytest.mark.integration


@pytest.fixture
async def job(rabbit_nodes: list[BrokerNode], request: pytest.FixtureRequest) -> AsyncIterator[JobQueues]:
    queues = JobQueues(f"{request.node.name[:36]}-{secrets.token_hex(3)}", [rabbit_nodes[0].url])
    await queues.declare()
    try:
        yield queues
    finally:
        await queues.delete()


def _wanted(job: JobQueues) -> Wanted:
    return Wanted(
        handler="tests.handlers.basic:echo",
        slots=1,
        tasks_queue=job.tasks,
        results_queue=job.results,
        dead_queue=job.dead,
        result_log=QueueSpec(job.result_log, kind="stream"),
    )


async def _take(pipes: JobPipes, count: int, timeout: float) -> list[Delivery[TaskMessage]]:
    taken: list[Delivery[TaskMessage]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(taken) < count and loop.time() < deadline:
        delivery = await pipes.tasks.get(0.2)
        if delivery is not None:
            taken.append(delivery)
    return taken


async def test_a_member_handed_back_before_its_frame_is_redelivered_runs_only_as_its_copy(
    job: JobQueues,
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
) -> None:
    node = rabbit_nodes[0]
    proxy = fault_proxy(node)
    # "alone" goes out alone (nothing in flight); the next three gather into one frame.
    sender = send_stack(TaskCodec(), job.links, job.tasks, frames=FrameLimits(max_messages=3)).sender
    tasks = [TaskMessage(task_id, None) for task_id in ("alone", "running", "back-1", "back-2")]
    await asyncio.gather(*[await sender.send(task) for task in tasks])
    await sender.close()

    cut_link = RabbitBroker(amqp_url(proxy.host, proxy.port), name="test-cut-daemon", heartbeat=5)
    heir_link = RabbitBroker(node.url, name="test-heir-daemon", heartbeat=5)
    doomed = open_job_pipes([cut_link], _wanted(job), Window(10))
    heir = open_job_pipes([heir_link], _wanted(job), Window(10))
    try:
        ends = TaskEndings(doomed, "d-doomed", JobStats())
        first = await _take(doomed, 4, timeout=5)
        by_id = {d.message.task_id: d for d in first}
        assert sorted(by_id) == sorted(t.task_id for t in tasks)
        await by_id["alone"].ack()
        # Held too long behind "running": both go back, unspent, as messages of their own.
        for task_id in ("back-1", "back-2"):
            await ends.requeue(by_id[task_id], by_id[task_id].message, "held")
        assert await ends.wait(0, timeout=10)  # copies confirmed, members settled in their frame
        assert doomed.handed_back is not None
        assert await doomed.handed_back.flush(10)  # their records confirmed (the acks did not wait)
        proxy.refuse()  # the cut daemon stays away: it would take the frame back itself
        proxy.cut()  # the frame ("running" unsettled) goes back to the queue, redelivered

        taken = await _take(heir, 10, timeout=4)  # everything the heir gets, then some quiet
        runs = Counter(d.message.task_id for d in taken)
        assert runs == {"running": 1, "back-1": 1, "back-2": 1}, runs
        assert next(d for d in taken if d.message.task_id == "running").redelivered
        for delivery in taken:
            await delivery.ack()
    finally:
        for pipes in (doomed, heir):
            await pipes.close()
        for link in (cut_link, heir_link):
            await link.close()
