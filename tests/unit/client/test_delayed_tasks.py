"""Delayed tasks over FakeBroker (its clock moved by the test) and a fake scheduler: held by the
broker until due, the job kept open meanwhile, no demand reported for them, bad times refused,
and a delayed task sent again after a broker lost its data keeps its due time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.client.fakes import FakeScheduler, client_for, daemons_for
from truba.client import Client
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2
from truba.wire import TaskCodec


class Clock:
    """The broker's clock: real time moved forward by the test."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def scheduler(clock: Clock) -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0", clock=clock)])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


def queued(broker: FakeBroker, job_id: str) -> list[str]:
    return [TaskCodec().decode(body).task_id for body in broker.messages(f"truba.job.{job_id}.tasks")]


async def test_a_delayed_task_waits_in_the_broker_and_the_job_ends_only_after_it_ran(
    scheduler: FakeScheduler, client: Client, clock: Clock
) -> None:
    (broker,) = scheduler.brokers
    job = await client.create_job("h:f")
    now = await job.submit("now")
    later = await job.submit("later", delay=3600)
    soon = await job.submit("soon", not_before=datetime.now(UTC) + timedelta(minutes=5))
    await job.close()
    assert queued(broker, job.id) == [now]  # the delayed ones are in no queue: no consumer holds them
    (daemon,) = daemons_for(scheduler, job)
    assert [task.task_id for task in await daemon.run()] == [now]
    results = job.results()
    assert (await anext(results)).task_id == now
    taking = asyncio.create_task(anext(results))
    await asyncio.sleep(0.05)
    assert not taking.done() and not job.done  # the job waits for its delayed tasks
    assert scheduler.jobs[job.id].state != jobs_pb2.JOB_STATE_FINISHED
    clock.ahead = 301
    broker.release_due()
    assert [task.task_id for task in await daemon.run()] == [soon]
    assert (await asyncio.wait_for(taking, 5)).task_id == soon
    clock.ahead = 3601
    broker.release_due()
    assert [task.task_id for task in await daemon.run()] == [later]
    assert [o.task_id async for o in results] == [later]
    assert job.done and scheduler.calls.count("FinishJob") == 1


async def test_a_naive_not_before_is_refused_with_a_clear_error_and_nothing_is_sent(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    with pytest.raises(ValueError, match="naive datetime"):
        await job.submit("x", not_before=datetime.now() + timedelta(minutes=1))
    with pytest.raises(ValueError, match="not both"):
        await job.submit("x", delay=1, not_before=datetime.now(UTC))
    with pytest.raises(ValueError, match="delay must be"):
        await job.submit("x", delay=-1)
    with pytest.raises(ValueError, match="longest delay"):
        await job.submit("x", delay=20 * 365 * 86400)
    assert job.submitted == 0 and scheduler.brokers[0].published == 0
    await job.cancel()


async def test_a_past_not_before_runs_at_once(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    task_id = await job.submit("x", not_before=datetime.now(UTC) - timedelta(hours=1))
    assert queued(scheduler.brokers[0], job.id) == [task_id]
    await job.cancel()


async def test_delayed_tasks_not_due_are_reported_as_delayed_not_as_demand(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    await job.submit("a", delay=600)
    await job.submit("b", delay=900)
    await job.submit("c", delay=0.5)  # due within the demand lead: demand at once
    async with asyncio.timeout(5):
        while not scheduler.progress or scheduler.progress[-1][1] < 3:
            await asyncio.sleep(0.01)
    assert scheduler.delayed[-1] == 2
    await job.cancel()


async def test_a_delayed_task_sent_again_after_a_broker_lost_its_data_keeps_its_due_time(
    monkeypatch: pytest.MonkeyPatch, scheduler: FakeScheduler, client: Client, clock: Clock
) -> None:
    monkeypatch.setattr("truba.client.watch.CHECK_INTERVAL", 0.02)
    (broker,) = scheduler.brokers
    job = await client.create_job("h:f")
    task_id = await job.submit("x", delay=3600)
    await job._submission.settle_confirms()
    queue = f"truba.job.{job.id}.tasks"
    assert len(broker.held(queue)) == 1
    broker.lose_data()
    async with asyncio.timeout(10):  # the loss is seen, and the task is sent again
        while not broker.held(queue):
            await asyncio.sleep(0.01)
    assert queued(broker, job.id) == []  # held again, not run early
    clock.ahead = 3601
    broker.release_due()
    assert queued(broker, job.id) == [task_id]
    await job.cancel()
