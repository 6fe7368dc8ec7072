"""map_outcomes (Job.map): ordered and unordered, the window, and a payload that cannot be submitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeDaemon, FakeScheduler, client_for, daemons_for
from truba.client import Client
from truba.client.blocking import BlockingJob, _LoopThread
from truba.pipes.errors import CodecError, MessageTooLarge, PipeClosed
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2
from truba.wire import TaskMessage


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


async def answer_all_at_once(daemon: FakeDaemon, count: int) -> None:
    """Waits for ``count`` tasks, then answers them last first."""
    tasks: list[TaskMessage] = []
    while len(tasks) < count:
        tasks += await daemon.take()
        await asyncio.sleep(0.005)
    await daemon.answer(tasks[::-1])


async def serve(daemon: FakeDaemon) -> None:
    while True:
        await daemon.run()
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("ordered", [True, False])
async def test_map_yields_one_outcome_per_payload(
    scheduler: FakeScheduler, client: Client, ordered: bool
) -> None:
    job = await client.create_job("h:f")
    (daemon,) = daemons_for(scheduler, job)
    answering = asyncio.create_task(answer_all_at_once(daemon, 6))
    async with asyncio.timeout(10):
        values = [outcome.result() async for outcome in job.map(range(6), ordered=ordered, progress=False)]
    await answering
    assert values == ([0, 1, 2, 3, 4, 5] if ordered else [5, 4, 3, 2, 1, 0])  # unordered: as they came
    assert job.done and scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_FINISHED


async def test_map_keeps_at_most_window_tasks_submitted_and_not_yielded(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    (daemon,) = daemons_for(scheduler, job)
    server = asyncio.create_task(serve(daemon))
    ahead: list[int] = []
    try:
        async with asyncio.timeout(10):
            async for outcome in job.map(range(20), window=3, progress=False):
                ahead.append(job.submitted - len(ahead))
                assert outcome.result() == len(ahead) - 1
    finally:
        server.cancel()
    assert len(ahead) == 20 and max(ahead) <= 3


@pytest.mark.parametrize("bad", [object(), b"x" * (17 * 1024 * 1024)], ids=["unencodable", "oversized"])
async def test_a_map_whose_payload_cannot_be_sent_raises_and_cancels_its_job_leaving_no_orphan(
    scheduler: FakeScheduler, tmp_path: Path, bad: object
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        job = await client.create_job("h:f")
        (daemon,) = daemons_for(scheduler, job)
        server = asyncio.create_task(serve(daemon))
        try:
            with pytest.raises((CodecError, MessageTooLarge)):
                async with asyncio.timeout(10):
                    async for outcome in job.map([1, 2, bad, 4], progress=False):
                        outcome.result()
        finally:
            server.cancel()
        assert job.submitted == 2 and job.ended
        assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED  # no open job holding slots
        assert not (tmp_path / job.id).exists()  # nor its journal on disk


async def test_map_refuses_a_window_below_one(client: Client) -> None:
    job = await client.create_job("h:f")
    with pytest.raises(ValueError, match="window"):
        await anext(job.map([1], window=0))


def test_the_blocking_job_maps_too(scheduler: FakeScheduler) -> None:
    runner = _LoopThread()
    try:

        async def start() -> tuple[Client, BlockingJob, asyncio.Task[None]]:
            client = client_for(scheduler)
            await client.connect()
            job = await client.create_job("h:f")
            (daemon,) = daemons_for(scheduler, job)
            return client, BlockingJob(job, runner), asyncio.create_task(serve(daemon))

        client, job, server = runner.run(start())
        assert [o.result() for o in job.map(range(5), progress=False)] == [0, 1, 2, 3, 4]

        async def stop() -> None:
            server.cancel()
            await client.close()

        runner.run(stop())
    finally:
        runner.stop()


async def test_a_map_on_a_job_closed_before_raises_and_leaves_the_job_as_it_was(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    await job.submit(1)
    await job.close()
    with pytest.raises(PipeClosed):
        await anext(job.map([2], progress=False))
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CLOSED and not job.ended
