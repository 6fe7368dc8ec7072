"""JobCalls: the scheduler calls of one job through the JobService stub, each retried with
Backoff while the scheduler is unreachable, within the client's patience; other errors at once."""

from __future__ import annotations

import grpc
import pytest

from tests.unit.client.fakes import FakeScheduler
from truba.backoff import Backoff
from truba.client.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from truba.client.lifecycle import JobCalls, JobStatus
from truba.client.reach import Reach
from truba.proto.v1 import jobs_pb2


class Clock:
    """A clock that only moves when the backoff sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def calls_with(
    scheduler: FakeScheduler, info: jobs_pb2.Job, clock: Clock, patience: float = 120.0
) -> JobCalls:
    backoff = Backoff(attempts=None, base=0.2, cap=5.0, sleep=clock.sleep, rng=lambda low, high: high)
    return JobCalls(scheduler.stub, info, reach=Reach(patience, backoff=backoff, clock=clock))


async def created(scheduler: FakeScheduler) -> jobs_pb2.Job:
    return (await scheduler.CreateJob(jobs_pb2.CreateJobRequest(handler="h:f", importance=1.0))).job


async def test_finish_is_retried_while_the_scheduler_is_unreachable() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    calls = calls_with(scheduler, await created(scheduler), clock)
    scheduler.fail("FinishJob", times=3)
    info = await calls.finish()
    assert info.state == jobs_pb2.JOB_STATE_FINISHED and calls.info.state == jobs_pb2.JOB_STATE_FINISHED
    assert clock.sleeps == [0.2, 0.4, 0.8]


async def test_finish_gives_up_after_its_patience() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    calls = calls_with(scheduler, await created(scheduler), clock, patience=30.0)
    scheduler.fail("FinishJob", times=1000)
    with pytest.raises(Unavailable):
        await calls.finish()
    assert 0 < clock.now <= 30.0 and max(clock.sleeps) == 5.0
    assert scheduler.calls.count("FinishJob") == len(clock.sleeps) + 1


async def test_finish_raises_other_errors_at_once() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    calls = calls_with(scheduler, await created(scheduler), clock)
    scheduler.fail("FinishJob", code=grpc.StatusCode.FAILED_PRECONDITION)
    with pytest.raises(FailedPrecondition):
        await calls.finish()
    assert clock.sleeps == []


async def test_each_call_keeps_the_schedulers_latest_word() -> None:
    scheduler, clock = FakeScheduler(), Clock()
    info = await created(scheduler)
    calls = calls_with(scheduler, info, clock)
    assert not JobStatus.of(info).closed
    closed = await calls.close(submitted=7)
    assert closed.state == jobs_pb2.JOB_STATE_CLOSED and closed.submitted == 7 and JobStatus.of(closed).closed
    assert (await calls.set_importance(2.5)).importance == 2.5
    with pytest.raises(InvalidArgument):
        await calls.set_importance(0)
    assert (await calls.get()).importance == 2.5 and calls.info.importance == 2.5
    assert (await calls.cancel()).state == jobs_pb2.JOB_STATE_CANCELLED
    assert calls.info.state == jobs_pb2.JOB_STATE_CANCELLED
    with pytest.raises(FailedPrecondition):
        await calls.set_importance(1.0)
    missing = JobCalls(scheduler.stub, jobs_pb2.Job(id="nosuchjob"), reach=Reach())
    with pytest.raises(NotFound):
        await missing.get()
