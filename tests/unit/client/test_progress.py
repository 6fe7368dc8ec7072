"""ProgressReporter: pokes coalesced into few reports, the last word always reported, kept alive,
an unreachable scheduler only delays it, an ended job stops it."""

from __future__ import annotations

import asyncio

import grpc

from tests.unit.client.fakes import FakeScheduler
from truba.client.progress import ProgressReporter
from truba.latency import BOUNDS, BUCKETS
from truba.proto.v1 import jobs_pb2


async def started_job(scheduler: FakeScheduler) -> str:
    response = await scheduler.CreateJob(jobs_pb2.CreateJobRequest(handler="h:f", importance=1.0))
    return response.job.id


async def until(condition: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_pokes_are_coalesced_and_the_last_counts_are_reported() -> None:
    scheduler = FakeScheduler()
    job_id = await started_job(scheduler)
    counts = [0, 0]
    reporter = ProgressReporter(scheduler.stub, job_id, lambda: (counts[0], counts[1], 0), interval=0.05)
    for n in range(1, 101):  # a burst of submits: one report soon, then the rest coalesced
        counts[0] = n
        reporter.poke()
        await asyncio.sleep(0)
    await until(lambda: scheduler.progress and scheduler.progress[-1] == (job_id, 100, 0))
    assert len(scheduler.progress) <= 3
    counts[1] = 100
    reporter.poke()
    await until(lambda: scheduler.progress[-1] == (job_id, 100, 100))
    await reporter.stop()


async def test_an_unchanged_progress_is_said_again_as_a_keepalive() -> None:
    scheduler = FakeScheduler()
    job_id = await started_job(scheduler)
    reporter = ProgressReporter(scheduler.stub, job_id, lambda: (3, 1, 0), interval=0.01, keepalive=0.05)
    reporter.poke()
    await until(lambda: len(scheduler.progress) >= 3)
    assert set(scheduler.progress) == {(job_id, 3, 1)}
    await reporter.stop()


async def test_an_unreachable_scheduler_only_delays_the_report() -> None:
    scheduler = FakeScheduler()
    job_id = await started_job(scheduler)
    scheduler.fail("ReportProgress", times=2)
    reporter = ProgressReporter(scheduler.stub, job_id, lambda: (5, 0, 0), interval=0.01)
    reporter.poke()
    await until(lambda: scheduler.progress == [(job_id, 5, 0)])
    assert scheduler.calls.count("ReportProgress") == 3
    await reporter.stop()


async def test_a_job_that_ended_stops_the_reporter() -> None:
    scheduler = FakeScheduler()
    job_id = await started_job(scheduler)
    scheduler.fail("ReportProgress", code=grpc.StatusCode.FAILED_PRECONDITION)
    reporter = ProgressReporter(scheduler.stub, job_id, lambda: (1, 0, 0), interval=0.01)
    reporter.poke()
    await until(lambda: reporter._task is not None and reporter._task.done())
    reporter.poke()  # stopped for good: no new reporter
    await asyncio.sleep(0.05)
    assert scheduler.calls.count("ReportProgress") == 1 and scheduler.progress == []


async def test_each_report_carries_the_outcomes_taken_by_latency_so_far() -> None:
    scheduler = FakeScheduler()
    job_id = await started_job(scheduler)
    received = [0]
    reporter = ProgressReporter(scheduler.stub, job_id, lambda: (2, received[0], 0), interval=0.01)
    reporter.latency.observe(0.02)
    received[0] = 1
    reporter.poke()
    await until(lambda: scheduler.progress and scheduler.progress[-1] == (job_id, 2, 1))
    first = scheduler.latencies[-1]
    assert sum(first.counts) == 1 and first.counts[BOUNDS.index(0.025)] == 1 and first.sum == 0.02
    reporter.latency.observe(7.0)
    received[0] = 2
    reporter.poke()
    await until(lambda: scheduler.progress[-1] == (job_id, 2, 2))
    assert sum(scheduler.latencies[-1].counts) == 2  # cumulative: a lost report loses nothing
    assert len(scheduler.latencies[-1].counts) == BUCKETS
    await reporter.stop()
