"""An unreachable cluster: every wait that needs it ends with Unavailable within the client's
``unavailable_after``, and each outage is told once (when it begins, and when it ends)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

import grpc
import grpc.aio
import pytest

from tests.unit.client.fakes import FakeScheduler, client_for, daemons_for
from truba.backoff import Backoff
from truba.client import Outcome, Unavailable
from truba.client.reach import Reach
from truba.follow import LEADER_KEY, STANDBY_RETRY
from truba.pipes.fake_broker import FakeBroker

BOUND = 0.3
"""The test clients' ``unavailable_after``."""


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("truba.client.watch.CHECK_INTERVAL", 0.02)


def stop(brokers: list[FakeBroker]) -> None:
    """Every broker goes away: connections break and new ones are refused."""
    for broker in brokers:
        broker.refuse()
        broker.break_connection()


async def drain(stream: AsyncGenerator[Outcome, None]) -> list[Outcome]:
    return [outcome async for outcome in stream]


def events(caplog: pytest.LogCaptureFixture, event: str) -> int:
    return sum(record.getMessage() == event for record in caplog.records)


async def test_a_client_whose_brokers_are_stopped_gets_unavailable_within_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="truba.client")
    scheduler = FakeScheduler([FakeBroker("fake://b0"), FakeBroker("fake://b1")])
    async with client_for(scheduler, unavailable_after=BOUND) as client:
        job = await client.create_job("h:f", frames=False)
        other = await client.create_job("h:f", frames=False)
        await job.submit(1)
        await job.close()
        stop(scheduler.brokers)
        async with asyncio.timeout(10 * BOUND + 5):  # not forever
            with pytest.raises(Unavailable, match="no broker"):
                await drain(job.results())
            with pytest.raises(Unavailable, match="no broker"):
                await other.submit(2)
    assert events(caplog, "client.brokers.unreachable") == 1  # one line per outage, not per try
    assert not any(record.exc_info for record in caplog.records if record.levelno >= logging.WARNING)


async def test_a_submit_or_close_waiting_on_stopped_brokers_gets_unavailable_within_its_bound() -> None:
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    async with client_for(scheduler, unavailable_after=BOUND) as client:
        job = await client.create_job("h:f", frames=False)
        scheduler.brokers[0].stall()  # taken, not confirmed
        await job.submit(1)
        stop(scheduler.brokers)
        async with asyncio.timeout(10 * BOUND + 5):
            with pytest.raises(Unavailable):
                await job.submit(2)  # waits for a broker, then gives up: it was not submitted
            assert job.submitted == 1
            with pytest.raises(Unavailable):
                await job.close()  # the first task's confirm cannot come


async def test_an_outage_that_ends_in_time_is_told_once_and_the_job_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="truba.client")
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    async with client_for(scheduler, unavailable_after=30.0) as client:
        job = await client.create_job("h:f", frames=False)
        await job.submit(1)
        await job.close()
        stop(scheduler.brokers)
        async with asyncio.timeout(10):
            while not events(caplog, "client.brokers.unreachable"):
                await asyncio.sleep(0.01)
        scheduler.brokers[0].refuse(False)
        async with asyncio.timeout(10):
            while not events(caplog, "client.brokers.reachable"):
                await asyncio.sleep(0.01)
        (daemon,) = daemons_for(scheduler, job)
        await daemon.run()
        async with asyncio.timeout(10):
            outcomes = await drain(job.results())
    assert [o.result() for o in outcomes] == [1]
    assert (
        events(caplog, "client.brokers.unreachable") == 1 and events(caplog, "client.brokers.reachable") == 1
    )


async def test_a_client_whose_scheduler_is_unreachable_gets_unavailable_within_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="truba.client")
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    async with client_for(scheduler, unavailable_after=BOUND) as client:
        scheduler.fail("CreateJob", times=1000)
        async with asyncio.timeout(10 * BOUND + 5):
            with pytest.raises(Unavailable, match="did not answer within"):
                await client.create_job("h:f")
            scheduler.fail("GetJob", times=1000)
            with pytest.raises(Unavailable):
                await client.job("job1").info()
    assert 2 <= scheduler.calls.count("CreateJob") < 1000  # tried again, then gave up
    assert events(caplog, "client.scheduler.unreachable") == 1


async def test_a_scheduler_back_within_the_bound_answers_the_waiting_call() -> None:
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    async with client_for(scheduler, unavailable_after=30.0) as client:
        scheduler.fail("CreateJob", times=2)
        job = await client.create_job("h:f")
        assert scheduler.calls.count("CreateJob") == 3 and job.id == "job1"


def test_an_outage_begins_when_the_last_broker_up_goes_down_not_at_an_old_failure() -> None:
    now = [0.0]
    reach = Reach(10.0, clock=lambda: now[0])
    reach.broker_down("amqp://old", ConnectionError("gone"))  # a broker of an earlier run, at 0
    reach.broker_up("amqp://new")
    now[0] = 100.0
    reach.broker_down("amqp://new", ConnectionError("stopped"))
    assert not reach.brokers_out  # out since 100, not since 0
    now[0] = 111.0
    assert reach.brokers_out
    with pytest.raises(Unavailable, match="no broker"):
        reach.check_brokers("results")


def test_a_broker_no_watch_checks_any_more_does_not_keep_an_outage_from_being_seen() -> None:
    now = [0.0]
    reach = Reach(10.0, clock=lambda: now[0])
    reach.watch(["amqp://old"])
    reach.broker_up("amqp://old")  # a finished job's broker, up when its watch stopped
    reach.unwatch(["amqp://old"])
    reach.watch(["amqp://new"])
    reach.broker_down("amqp://new", ConnectionError("stopped"))
    now[0] = 11.0
    assert reach.brokers_out


async def test_a_listing_asks_an_unreachable_scheduler_once() -> None:
    scheduler = FakeScheduler([FakeBroker("fake://b0")])
    async with client_for(scheduler, unavailable_after=30.0) as client:
        scheduler.fail("ListJobs", times=5)
        with pytest.raises(Unavailable):
            await client.list_jobs()
    assert scheduler.calls.count("ListJobs") == 1


async def test_a_broker_wait_ends_with_unavailable_when_an_outage_begun_under_it_lasts() -> None:
    reach = Reach(0.05)
    reach.broker_up("amqp://b0")
    began = asyncio.get_running_loop().time()
    with pytest.raises(Unavailable, match="submit"):
        async with reach.bounded("submit"):
            reach.broker_down("amqp://b0", ConnectionError("stopped"))  # while the wait is under way
            await asyncio.sleep(30)
    assert asyncio.get_running_loop().time() - began < 20  # the patience ended it, not the sleep
    assert not reach._guards  # nothing left armed


async def test_a_plain_with_bounds_a_wait_as_async_with_does() -> None:
    # The submit's hot path enters its bound with a plain ``with``: no coroutine to enter or leave.
    reach = Reach(0.05)
    reach.broker_up("amqp://b0")
    with pytest.raises(Unavailable, match="submit"):
        with reach.bounded("submit"):
            reach.broker_down("amqp://b0", ConnectionError("stopped"))
            await asyncio.sleep(30)
    assert not reach._guards
    reach.broker_up("amqp://b0")
    with reach.bounded("submit"):
        await asyncio.sleep(0)
    assert not reach._guards


async def test_a_broker_wait_goes_on_when_the_outage_ends_in_time() -> None:
    reach = Reach(0.05)
    reach.broker_down("amqp://b0", ConnectionError("stopped"))
    async with reach.bounded("submit"):  # armed on entry: the outage is under way
        reach.broker_up("amqp://b0")  # disarmed
        await asyncio.sleep(0.1)  # longer than the patience
    assert not reach._guards


async def test_a_broker_wait_lets_its_own_timeouts_and_cancellations_through() -> None:
    reach = Reach(30.0)
    with pytest.raises(TimeoutError):
        async with reach.bounded("submit"):
            raise TimeoutError("the body's own")
    task = asyncio.create_task(_wait_bounded(reach))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not reach._guards


async def _wait_bounded(reach: Reach) -> None:
    async with reach.bounded("submit"):
        await asyncio.sleep(30)


def test_a_broker_wait_finds_its_task_on_each_loop_it_runs_on() -> None:
    # The reach keeps the last wait's loop (no running-loop lookup per submit): a wait in another
    # task, or on a later loop, must still guard its own task.
    reach = Reach(0.05)

    async def guarded() -> asyncio.Task[object] | None:
        async with reach.bounded("submit"):
            return asyncio.current_task()

    async def two_tasks() -> None:
        first = asyncio.create_task(guarded())
        second = asyncio.create_task(guarded())
        assert await first is first and await second is second

    asyncio.run(two_tasks())

    async def an_outage_on_a_new_loop() -> None:
        reach.broker_up("amqp://b0")
        with pytest.raises(Unavailable, match="submit"):
            async with reach.bounded("submit"):
                reach.broker_down("amqp://b0", ConnectionError("stopped"))
                await asyncio.sleep(30)  # cancelled at the outage's bound, on this loop

    asyncio.run(an_outage_on_a_new_loop())
    assert not reach._guards


def _refusal(standby: bool) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((LEADER_KEY, "")) if standby else grpc.aio.Metadata()
    details = "standby; no leader yet" if standby else "failed to connect to all addresses"
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailing, details, None)


async def _call(reach: Reach, failures: list[grpc.aio.AioRpcError]) -> None:
    """A call through ``reach`` that fails with ``failures`` first, then is answered."""

    async def rpc(timeout: float) -> str:
        if failures:
            raise failures.pop(0)
        return "answered"

    assert await reach.call("GetJob", rpc) == "answered"


def _recording_backoff(waited: list[float]) -> Backoff:
    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    return Backoff(attempts=None, base=0.2, cap=5.0, sleep=sleep, rng=lambda low, high: high)


async def test_a_call_waits_a_standby_retry_not_a_grown_backoff_while_an_election_is_on() -> None:
    # Given the longest waits the backoff allows: refusals alone grow them (0.2, 0.4, 0.8, ... s)
    grown: list[float] = []
    alone = Reach(30.0, backoff=_recording_backoff(grown))
    await _call(alone, [_refusal(standby=False) for _ in range(5)])
    assert grown == [0.2, 0.4, 0.8, 1.6, 3.2]
    # When a standby answered first (an election is on), the refusals after it (the new leader
    # loading the store) wait a standby retry each
    flat: list[float] = []
    electing = Reach(30.0, backoff=_recording_backoff(flat))
    await _call(electing, [_refusal(standby=True), *(_refusal(standby=False) for _ in range(5))])
    assert flat == [STANDBY_RETRY[1]] * 6
    # And a channel over several addresses that saw the standby says so for the call
    told: list[float] = []
    following = Reach(30.0, backoff=_recording_backoff(told), electing=lambda: True)
    await _call(following, [_refusal(standby=False) for _ in range(3)])
    assert told == [STANDBY_RETRY[1]] * 3
