"""Dead letters outlive their job for the keep time, listed through the scheduler with their
errors; a crafted frame is dead-lettered whole instead of running a hidden member."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

import truba
from tests.integration.brokers import BrokerNode
from tests.integration.processes import ALLOW, queues_of
from truba.client import DeadLetters, DeadReason, FailedPrecondition, Job
from truba.local.cluster import LocalCluster
from truba.pipes.frame import pack
from truba.proto.v1 import jobs_pb2
from truba.wire import TaskCodec, TaskMessage

pytestmark = pytest.mark.integration

KEEP = 4.0
"""Seconds the scheduler keeps an ended job's dead letters in these tests."""


@pytest.fixture
def cluster(rabbit_nodes: list[BrokerNode], tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path)
    try:
        urls = [node.url for node in rabbit_nodes]
        local.start_scheduler(urls, "127.0.0.1:0", "--heartbeat-interval", "0.5", "--keep-dead", str(KEEP))
        local.start_daemon("d0", 2, ALLOW)
        local.wait_for_daemons(1)
        yield local
    except BaseException:
        print("\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in local.processes))
        raise
    finally:
        local.stop()


async def eventually(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.2)


async def letters_of(job: Job, timeout: float = 30.0) -> DeadLetters:
    """The job's dead letters, once there are some."""
    deadline = time.monotonic() + timeout
    while not (letters := await job.dead_letters()):
        assert time.monotonic() < deadline, "no dead letter in time"
        await asyncio.sleep(0.2)
    return letters


async def test_a_given_up_task_is_listed_with_its_error_after_its_job_ended_and_gone_after_the_keep_time(
    cluster: LocalCluster, rabbit_nodes: list[object]
) -> None:
    async with truba.Client(cluster.address) as client:
        # Given a job whose second task outlives its timeout on its only attempt (it gives up)
        job = await client.create_job("tests.handlers.faults:pid", task_timeout=0.5, max_attempts=1)
        ok_id = await job.submit(0.0)
        dead_id = await job.submit(30.0)
        await job.close()
        outcomes = {o.task_id: o async for o in job.results()}
        assert outcomes[ok_id].ok and outcomes[dead_id].gave_up
        info = await job.info()
        assert info.state == jobs_pb2.JOB_STATE_FINISHED
        # When its dead letters are listed after the job ended
        letters = await job.dead_letters(bodies=True)
        # Then the given-up task is there with its error, and listing consumed nothing
        (letter,) = letters
        assert (letter.task_id, letter.reason, letter.attempts) == (dead_id, DeadReason.GAVE_UP, 1)
        assert letter.error.type == "TaskTimeout" and letter.broker in ("b0", "b1")
        assert letter.payload == 30.0 and letter.daemon_id == "d0"
        assert letters.kept_until is not None and letters.kept_until > time.time()
        assert dead_id in str(letters)
        assert [d.task_id for d in await job.dead_letters()] == [dead_id]
        # Only the dead-letter queues are left of the job's queues
        assert sorted(queues_of(job.id, rabbit_nodes)) == [info.queues.dead] * 2
        # And after the keep time they are gone, and the scheduler says so
        await eventually(lambda: queues_of(job.id, rabbit_nodes) == [])
        with pytest.raises(FailedPrecondition, match="is finished: its dead letters .*are deleted"):
            await job.dead_letters()


async def test_a_frame_hiding_a_task_with_a_taken_id_is_dead_lettered_and_none_of_it_runs(
    cluster: LocalCluster, rabbit_nodes: list[BrokerNode], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    async with truba.Client(cluster.address) as client:
        job = await client.create_job("tests.handlers.faults:count_runs")
        info = await job.info()
        # A foreign client publishes a frame whose second member reuses the first one's task id
        codec = TaskCodec()
        frame = pack(
            [
                codec.encode(TaskMessage("x-1", [str(runs), 0.0])),
                codec.encode(TaskMessage("x-1", [str(runs), 0.0])),
            ]
        )
        connection = pika.BlockingConnection(pika.URLParameters(rabbit_nodes[0].url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", info.queues.tasks, frame, pika.BasicProperties(delivery_mode=2))
        connection.close()
        letters = await letters_of(job)
        (letter,) = letters
        assert (letter.reason, letter.error.type) == (DeadReason.POISON, "MalformedFrame")
        assert "members 0 and 1 both have task id 'x-1'" in letter.error.message
        # The job still runs its own tasks; the crafted frame's members never ran
        (outcome,) = [o async for o in job.map([[str(runs), 0.0]])]
        assert outcome.ok
        assert len(runs.read_text().splitlines()) == 1


async def test_retry_dead_runs_a_given_up_task_again_with_a_fresh_outcome_and_removes_its_letter(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with truba.Client(cluster.address) as client:
        # Given an open job whose task timed out on its only attempt (slow the first time only)
        job = await client.create_job("tests.handlers.faults:sleep_once", task_timeout=0.5, max_attempts=1)
        dead_id = await job.submit([str(tmp_path / "ran"), 30.0, 0.0])
        stream = job.results()
        gave_up = await anext(stream)
        assert (gave_up.task_id, gave_up.gave_up) == (dead_id, True)
        await letters_of(job)
        # When the application sends the dead tasks again
        retried = await job.retry_dead()
        # Then the task runs again under a new id, with its own outcome, and its letter is gone
        assert list(retried) == [dead_id]
        await job.close()
        async with asyncio.timeout(60):
            rest = [outcome async for outcome in stream]
        assert [(o.task_id, o.ok) for o in rest] == [(retried[dead_id], True)]
        assert len(await job.dead_letters()) == 0


def test_the_blocking_job_lists_its_dead_letters_and_sends_them_again(cluster: LocalCluster) -> None:
    with truba.connect(cluster.address) as client:
        job = client.create_job("tests.handlers.faults:pid", task_timeout=0.5, max_attempts=1)
        dead_id = job.submit(30.0)  # outlives its timeout on its only attempt: given up
        results = job.results()
        first = next(results)
        assert first.task_id == dead_id and first.gave_up
        deadline = time.monotonic() + 30
        while not (letters := job.dead_letters()):
            assert time.monotonic() < deadline, "no dead letter in time"
            time.sleep(0.2)
        assert [(d.task_id, d.reason) for d in letters] == [(dead_id, DeadReason.GAVE_UP)]
        sent = job.retry_dead()
        assert list(sent) == [dead_id] and sent[dead_id] != dead_id
        again = next(results)  # the new task gives up too: its own, fresh outcome
        assert again.task_id == sent[dead_id] and again.gave_up
        results.close()  # type: ignore[attr-defined]
        job.cancel()
