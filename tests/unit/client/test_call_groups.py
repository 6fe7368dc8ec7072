"""job.call, groups and the drained moment over FakeBroker and a fake scheduler: each outcome
reaches exactly one taker (a call, a group, or results()), across a timeout and a resume."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.client.fakes import FakeScheduler, client_for, daemons_for
from tests.unit.client.test_client_job import collect, serve
from truba.client import (
    CallTimeout,
    Client,
    GroupClosed,
    Job,
    Outcome,
    TaskCancelled,
    TaskFailed,
    result_stream,
)
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


def double_or_fail(payload: object) -> object:
    if payload == "boom" or (isinstance(payload, int) and payload % 7 == 3):
        raise RuntimeError(f"failed on {payload}")
    return payload * 2  # type: ignore[operator]


@contextlib.asynccontextmanager
async def serving(scheduler: FakeScheduler, job: Job) -> AsyncIterator[None]:
    server = asyncio.create_task(serve(daemons_for(scheduler, job, handler=double_or_fail)))
    try:
        yield
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


async def test_a_call_returns_its_tasks_result_or_raises_its_error(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    async with serving(scheduler, job):
        assert await job.call(21, timeout=10) == 42
        with pytest.raises(TaskFailed, match="failed on boom"):
            await job.call("boom", timeout=10)
        await job.close()
        assert await collect(job.results()) == []  # the calls took both outcomes: none comes again
    assert job.done and job.received == 2


async def test_concurrent_calls_on_one_job_each_get_their_own_result(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    numbers = [n for n in range(300) if n % 7 != 3]
    async with serving(scheduler, job):
        async with asyncio.timeout(30):
            values = await asyncio.gather(*(job.call(n, timeout=20) for n in numbers))
        assert values == [n * 2 for n in numbers]
        await job.close()
        await collect(job.results())
    assert job.done and job.received == len(numbers)


async def test_a_call_that_times_out_leaves_its_outcome_to_results_once(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    with pytest.raises(CallTimeout) as raised:
        await job.call(5, timeout=0.2)  # no daemon yet
    assert isinstance(raised.value, TimeoutError)
    await job.close()
    async with serving(scheduler, job):
        outcomes = await collect(job.results())
    assert [(o.task_id, o.result()) for o in outcomes] == [(raised.value.task_id, 10)]


async def test_calls_get_their_outcomes_while_the_application_iterates_results(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    plain = [await job.submit(n) for n in (100, 101, 102)]
    seen: list[Outcome] = []
    job.on_result(seen.append)
    async with serving(scheduler, job):
        values = await asyncio.gather(*(job.call(n, timeout=10) for n in (1, 2, 4)))
        await job.close()
        await asyncio.wait_for(job.wait(), 10)
    assert values == [2, 4, 8]
    assert sorted(o.task_id for o in seen) == sorted(plain)  # results() never saw a call's outcome
    assert job.done and job.received == 6


async def test_outcomes_read_for_a_call_are_kept_for_results_not_taken(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    plain = [await job.submit(n) for n in (10, 11)]
    async with serving(scheduler, job):
        assert await job.call(1, timeout=10) == 2  # nobody iterates: the call's pump reads all
        assert job.outstanding == 2  # the plain ones were parked, not taken
        await job.close()
        outcomes = await collect(job.results())
    assert sorted(o.task_id for o in outcomes) == sorted(plain)
    assert job.done


async def test_a_group_completes_with_every_outcome_failures_inside_and_fires_once(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    group = job.group()
    fired: list[list[Outcome[Any]]] = []
    group.on_done(fired.append)
    other = await job.submit(1000)
    ids = [await group.submit(n) for n in range(50)]
    async with serving(scheduler, job):
        await asyncio.sleep(0.05)
        assert not group.done  # not closed: more may join
        await group.close()
        outcomes = await group.wait(timeout=10)
        with pytest.raises(GroupClosed):
            await group.submit(1)
        await job.close()
        rest = await collect(job.results())
    assert [o.task_id for o in outcomes] == ids
    assert sum(not o.ok for o in outcomes) == len([n for n in range(50) if n % 7 == 3])
    assert [o.task_id for o in rest] == [other]  # the group's outcomes went to the group only
    await asyncio.sleep(0)
    assert len(fired) == 1 and [o.task_id for o in fired[0]] == ids


async def test_a_group_callback_fires_once_across_a_resume(scheduler: FakeScheduler, tmp_path: Path) -> None:
    first = client_for(scheduler, journal=tmp_path)
    await first.connect()
    job = await first.create_job("h:f", frames=False)
    done_early, late = job.group("early"), job.group("late")
    for n in range(3):
        await done_early.submit(n)
        await late.submit(n + 20)
    await done_early.close()
    await late.close()
    (daemon,) = daemons_for(scheduler, job, handler=double_or_fail)
    tasks = await daemon.take()
    await daemon.answer([t for t in tasks if t.payload in (0, 1, 2, 20)])  # 21 and 22 still run
    fired_before: list[str] = []
    done_early.on_done(lambda outcomes: fired_before.append("early"))
    late.on_done(lambda outcomes: fired_before.append("late"))
    await done_early.wait(timeout=10)
    async with asyncio.timeout(10):
        while late.size - len(late.pending) < 1 or not fired_before:
            await asyncio.sleep(0.01)
    await job.detach()  # as if the process died here
    assert fired_before == ["early"]

    async with client_for(scheduler, journal=tmp_path) as second:
        resumed = await second.resume(job.id)
        assert [g.name for g in resumed.groups()] == ["early", "late"]
        fired_after: list[tuple[str, int]] = []
        resumed.group("early").on_done(lambda outcomes: fired_after.append(("early", len(outcomes))))
        again = resumed.group("late")
        again.on_done(lambda outcomes: fired_after.append(("late", len(outcomes))))
        assert len(again.pending) == 2 and not again.done
        await daemon.answer([t for t in tasks if t.payload in (21, 22)])
        outcomes = await again.wait(timeout=10)
        await asyncio.sleep(0.05)
        assert [o.value for o in outcomes] == [40, 42, 44]
        assert fired_after == [("late", 3)]  # early fired before the crash: never again
        await resumed.close()
        assert await collect(resumed.results()) == []
    assert not (tmp_path / job.id).exists()


async def test_on_drained_fires_when_every_outcome_is_in_and_again_after_more(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    drained = asyncio.Event()
    count: list[int] = []

    def on_drained() -> None:
        count.append(job.received)
        drained.set()

    job.on_drained(on_drained)
    job.on_result(lambda outcome: None)
    async with serving(scheduler, job):
        for n in range(5):
            await job.submit(n)
        await asyncio.wait_for(drained.wait(), 10)
        drained.clear()
        await job.call(9, timeout=10)
        await asyncio.wait_for(drained.wait(), 10)
        await job.close()
        await asyncio.wait_for(job.wait(), 10)
    assert count == [5, 6]  # once per drain, not once per outcome; none after close


async def test_a_call_waiting_when_its_job_is_cancelled_raises_task_cancelled(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        job = await client.create_job("h:f", frames=False)
        group = job.group("g")
        await group.submit(1)
        await group.close()
        waiting = asyncio.create_task(job.call(5, timeout=10))  # no daemon: it waits
        await asyncio.sleep(0.1)
        await job.cancel()
        with pytest.raises(TaskCancelled):
            await waiting
        (outcome,) = await group.wait(timeout=5)
        assert outcome.cancelled
    assert not (tmp_path / job.id).exists()  # the group's log did not bring the folder back


async def test_a_job_whose_calls_took_every_outcome_finishes_at_close(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    async with serving(scheduler, job):
        assert await job.call(4, timeout=10) == 8
    await job.close()  # nobody iterates results(): close itself ends the job
    assert job.ended and scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_FINISHED


async def test_a_group_outcome_that_comes_again_after_a_crash_is_not_given_to_results(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    first = client_for(scheduler, journal=tmp_path)
    await first.connect()
    job = await first.create_job("h:f", frames=False)
    group = job.group("g")
    member = await group.submit(4)
    await group.close()
    # The client died after writing the member's outcome to the group's log, before the journal
    # forgot its task: the result is still on the broker, and comes again after the resume.
    group.took(Outcome(member, ok=True, value=8))
    await job.detach()
    (daemon,) = daemons_for(scheduler, job, handler=double_or_fail)
    await daemon.run()
    async with client_for(scheduler, journal=tmp_path) as second:
        resumed = await second.resume(job.id)
        again = resumed.group("g")
        assert again.done and [o.value for o in await again.wait(timeout=5)] == [8]
        await resumed.close()
        assert await collect(resumed.results()) == []  # taken by the group, not given out twice
        assert resumed.ended


async def test_a_call_made_while_the_pump_acks_its_last_outcome_still_gets_its_own(
    scheduler: FakeScheduler, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made while the pump, with nobody waiting any more, was still acking the outcome of
    the call before (a slow broker) found the pump running, and nothing read its outcome: it
    timed out (a CI run: ``call(-1)`` right after 1,000 concurrent calls). The pump now runs
    again when it ends and a call waits."""
    original = result_stream._ack

    async def slow_ack(delivery: Any) -> None:
        await asyncio.sleep(0.05)
        await original(delivery)

    monkeypatch.setattr(result_stream, "_ack", slow_ack)
    job = await client.create_job("h:f", frames=False)
    async with serving(scheduler, job):
        values = [await job.call(n, timeout=3) for n in (1, 2, 4, 5, 6)]
    assert values == [2, 4, 8, 10, 12]
