"""Jobs by id from any process: ``client.job(job_id)`` looks at, re-weights and cancels a job
without its journal; an unknown id is NotFound; outcomes still go only to the journal's owner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeScheduler, client_for
from truba.client import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from truba.client.blocking import BlockingClient
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


async def test_another_client_can_look_at_reweight_and_cancel_a_job_by_id(
    scheduler: FakeScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("truba.client.result_stream.STATE_POLL_SECONDS", 0.0)
    async with client_for(scheduler, journal=tmp_path / "owner") as owner, client_for(scheduler) as other:
        job = await owner.create_job("h:f", name="render")
        task = await job.submit(1)
        handle = other.job(job.id)
        info = await handle.info()
        assert (info.id, info.name, info.state) == (job.id, "render", jobs_pb2.JOB_STATE_OPEN)
        assert (await handle.set_importance(4.0)).importance == 4.0
        assert (await job.info()).importance == 4.0
        await handle.cancel()
        async with asyncio.timeout(10):  # the owner sees it and ends with cancelled outcomes
            outcomes = [outcome async for outcome in job.results()]
        assert [(o.task_id, o.cancelled) for o in outcomes] == [(task, True)]
        assert not (tmp_path / "owner" / job.id).exists()
        with pytest.raises(FailedPrecondition):
            await handle.cancel()


async def test_a_job_by_an_unknown_id_is_not_found_and_a_malformed_one_invalid(
    scheduler: FakeScheduler,
) -> None:
    async with client_for(scheduler) as client:
        handle = client.job("nosuchjob")
        for call in (handle.info(), handle.cancel(), handle.set_importance(2.0)):
            with pytest.raises(NotFound):
                await call
        with pytest.raises(InvalidArgument, match="job_id"):
            client.job("../x")


async def test_cancelling_by_id_removes_a_journal_nobody_holds(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        job = await client.create_job("h:f")
        await job.submit(1)
        await job.detach()  # left for a resume (e.g. after Ctrl-C)
        assert (tmp_path / job.id).is_dir()
        await client.job(job.id).cancel()
    assert not (tmp_path / job.id).exists()
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED


def test_the_blocking_client_has_jobs_by_id_too(scheduler: FakeScheduler, tmp_path: Path) -> None:
    by_url = {broker.url: broker for broker in scheduler.brokers}
    with BlockingClient(
        "fake:0", scheduler=scheduler.stub, brokers=lambda url: by_url[url], journal=tmp_path
    ) as client:
        job = client.create_job("h:f")
        handle = client.job(job.id)
        assert handle.info().state == jobs_pb2.JOB_STATE_OPEN
        assert handle.set_importance(3.0).importance == 3.0
        handle.cancel()
        with pytest.raises(NotFound):
            client.job("nosuchjob").info()
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED


async def test_watching_a_job_by_id_gives_it_now_and_a_silent_scheduler_is_unavailable(
    scheduler: FakeScheduler,
) -> None:
    async with client_for(scheduler, unavailable_after=0.2) as client:
        job = await client.create_job("h:f", name="watched")
        events = client.job(job.id).watch()
        assert (await anext(events)).job.name == "watched"
        await events.aclose()
        scheduler.watch_hangs = True
        async with asyncio.timeout(10):
            with pytest.raises(Unavailable):
                await anext(client.job(job.id).watch())


async def test_a_watch_whose_stream_breaks_opens_again_where_get_job_answers(
    scheduler: FakeScheduler,
) -> None:
    """A scheduler restarted or a standby taking over ends the stream with UNAVAILABLE: the watch
    goes on (the job as it is now comes again); an address that is a standby is followed too."""
    async with client_for(scheduler, unavailable_after=2.0) as client:
        job = await client.create_job("h:f", name="watched")
        scheduler.watch_breaks = 2
        scheduler.fail("WatchJob")  # the first stream is refused at once, as by a standby
        events = client.job(job.id).watch()
        async with asyncio.timeout(10):
            names = [(await anext(events)).job.name for _ in range(3)]
            await handle_ends(events)
        assert names == ["watched"] * 3
        assert scheduler.calls.count("WatchJob") == 4 and scheduler.calls.count("GetJob") == 3


async def test_a_watch_that_keeps_breaking_without_an_event_gives_up_unavailable(
    scheduler: FakeScheduler,
) -> None:
    async with client_for(scheduler, unavailable_after=2.0) as client:
        job = await client.create_job("h:f")
        scheduler.fail("WatchJob", times=10)
        async with asyncio.timeout(10):
            with pytest.raises(Unavailable, match="WatchJob failed"):
                await anext(client.job(job.id).watch())
        assert scheduler.calls.count("WatchJob") == 4  # the first and WATCH_REOPENS more


async def handle_ends(events: AsyncIterator[jobs_pb2.JobEvent]) -> None:
    """The fake's last stream ends after its one event: so does the watch."""
    with pytest.raises(StopAsyncIteration):
        await anext(events)
