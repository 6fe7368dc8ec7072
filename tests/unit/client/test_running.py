"""A job's tasks running now, from the SDK: typed, printable records from ``ListRunning``, on
the job, on a job by id and on the blocking client; NotFound and Unavailable as other calls."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeScheduler, client_for
from truba.client import NotFound, RunningTask, RunningTasks, Unavailable
from truba.client.blocking import BlockingClient
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2

AT = 1_750_000_100.0


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


def answer(
    job_id: str, *tasks: tuple[str, str, int, float], left_out: int = 0
) -> jobs_pb2.ListRunningResponse:
    """``tasks`` as (task id, daemon id, slot, seconds before AT it started), attempt 1 on host h."""
    return jobs_pb2.ListRunningResponse(
        job_id=job_id,
        running=[
            jobs_pb2.RunningTask(
                daemon_id=daemon, hostname="h", slot=slot, task_id=task, attempt=1, started_at=AT - ago
            )
            for task, daemon, slot, ago in tasks
        ],
        left_out=left_out,
        at=AT,
    )


async def test_a_job_lists_its_running_tasks_as_records_with_since_and_for_how_long(
    scheduler: FakeScheduler,
) -> None:
    async with client_for(scheduler) as client:
        job = await client.create_job("h:f")
        assert list(await job.running()) == [] and str(await job.running()) == "nothing running"
        scheduler.running[job.id] = answer(job.id, ("t1", "d0", 1, 4.5), ("t2", "d1", 0, 1.0), left_out=3)
        running = await job.running()
        assert isinstance(running, RunningTasks) and len(running) == 2 and running.left_out == 3
        first = running[0]
        assert first == RunningTask(
            task_id="t1",
            daemon_id="d0",
            hostname="h",
            slot=1,
            attempt=1,
            started_at=datetime.fromtimestamp(AT - 4.5, UTC),
            for_seconds=4.5,
        )
        assert first.started_at.tzinfo is UTC and running.at == datetime.fromtimestamp(AT, UTC)
        lines = str(running).splitlines()
        assert lines[0].startswith("t1  on d0 (h) slot 1, attempt 1, since ") and lines[0].endswith("(4.5 s)")
        assert lines[-1] == "(and 3 more, not listed)"
        # the same from another process, by the job's id
        assert [t.task_id for t in await client.job(job.id).running()] == ["t1", "t2"]


async def test_running_of_an_unknown_job_is_not_found_and_a_silent_scheduler_unavailable_in_time(
    scheduler: FakeScheduler,
) -> None:
    async with client_for(scheduler, unavailable_after=0.3) as client:
        with pytest.raises(NotFound):
            await client.job("nosuchjob").running()
        job = await client.create_job("h:f")
        scheduler.fail("ListRunning", times=1)  # a restart: tried again
        assert list(await job.running()) == []
        scheduler.fail("ListRunning", times=1000)
        async with asyncio.timeout(5):
            with pytest.raises(Unavailable):
                await job.running()


def test_the_blocking_client_lists_running_tasks_of_its_jobs_and_of_jobs_by_id(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    by_url = {broker.url: broker for broker in scheduler.brokers}
    with BlockingClient(
        "fake:0", scheduler=scheduler.stub, brokers=lambda url: by_url[url], journal=tmp_path
    ) as client:
        job = client.create_job("h:f")
        scheduler.running[job.id] = answer(job.id, ("t1", "d0", 0, 2.0))
        assert [(t.task_id, t.for_seconds) for t in job.running()] == [("t1", 2.0)]
        assert [t.daemon_id for t in client.job(job.id).running()] == ["d0"]
        job.cancel()
