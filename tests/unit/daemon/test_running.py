"""The daemon's attempts in progress, as heartbeats carry them: set when an attempt starts,
gone when it ends however it ends, over the execution path's scripted fake slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.unit.daemon.test_execution import Rig
from tests.waiting import eventually
from truba.daemon.settings import JobSettings
from truba.daemon.spans import SpanLog
from truba.proto.v1 import daemons_pb2
from truba.wire import TaskMessage


def running(rig: Rig) -> list[tuple[str, int]]:
    """``(task_id, attempt)`` of what the next heartbeat says runs now, oldest first."""
    attempts, left_out = rig.spans.running_now()
    assert left_out == {}
    return [(a.task_id, a.attempt) for a in attempts]


def test_a_heartbeat_takes_the_oldest_attempts_and_counts_the_rest_per_job() -> None:
    log = SpanLog(running_limit=3)
    a, b = log.for_job("a"), log.for_job("b")
    a.started("a1", 0, 10.0, 1)
    b.started("b1", 1, 5.0, 2)
    a.started("a2", 2, 20.0, 1)
    b.started("b2", 3, 30.0, 1)
    a.started("a3", 4, 40.0, 3)
    attempts, left_out = log.running_now()
    assert [(r.job_id, r.task_id, r.slot, r.attempt, r.start) for r in attempts] == [
        ("b", "b1", 1, 2, 5.0),
        ("a", "a1", 0, 1, 10.0),
        ("a", "a2", 2, 1, 20.0),
    ]
    assert left_out == {"a": 1, "b": 1}
    # Read, not taken: the next heartbeat says the same until they end
    a.ended("a1", 0)
    b.ended("b1", 1)
    a.ended("never-began", 9)
    attempts, left_out = log.running_now()
    assert [r.task_id for r in attempts] == ["a2", "b2", "a3"] and left_out == {}
    assert isinstance(attempts[0], daemons_pb2.RunningAttempt)


async def test_one_task_is_in_progress_from_its_start_until_it_replies_or_is_interrupted() -> None:
    rig = Rig()
    [delivery] = await rig.deliveries(TaskMessage("t", "hang", attempts=2))
    before = time.time()
    running_one = asyncio.create_task(rig.execution.run_one(rig.worker, delivery))
    await eventually(lambda: running(rig) == [("t", 3)])
    [attempt] = rig.spans.running_now()[0]
    assert (attempt.job_id, attempt.slot) == ("j1", 0) and before <= attempt.start <= time.time()
    rig.worker.interrupt.set()
    await running_one
    assert running(rig) == []
    [quick] = await rig.deliveries(TaskMessage("q", 1))
    await rig.execution.run_one(rig.worker, quick)
    assert running(rig) == [] and rig.outcomes() == {"q": 1}


async def test_a_chunks_tasks_are_in_progress_one_at_a_time_each_from_the_end_of_the_one_before() -> None:
    rig = Rig()
    tasks = [TaskMessage("t0", 0), TaskMessage("t1", "hang"), TaskMessage("t2", 2)]
    chunk = asyncio.create_task(rig.execution.run_chunk(rig.worker, await rig.deliveries(*tasks)))
    await eventually(lambda: running(rig) == [("t1", 1)])  # t0 replied; t2 waits its turn in the slot
    [t1] = rig.spans.running_now()[0]
    [t0_span] = rig.spans.take()[0]
    assert t1.start == t0_span.end
    rig.worker.interrupt.set()
    await chunk
    assert running(rig) == []  # t1 preempted, t2 never started


async def test_a_batch_is_in_progress_for_each_of_its_tasks_from_one_start() -> None:
    rig = Rig()
    tasks = [TaskMessage("a", "hang"), TaskMessage("b", 1, attempts=1)]
    batch = asyncio.create_task(rig.execution.run_batch(rig.worker, await rig.deliveries(*tasks)))
    await eventually(lambda: running(rig) == [("a", 1), ("b", 2)] or running(rig) == [("b", 2), ("a", 1)])
    first, second = rig.spans.running_now()[0]
    assert first.start == second.start
    rig.worker.interrupt.set()
    await batch
    assert running(rig) == []


async def test_an_attempt_cancelled_under_way_is_no_longer_in_progress() -> None:
    rig = Rig()
    [delivery] = await rig.deliveries(TaskMessage("t", "hang"))
    running_one = asyncio.create_task(rig.execution.run_one(rig.worker, delivery))
    await eventually(lambda: running(rig) == [("t", 1)])
    running_one.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running_one
    assert running(rig) == []


async def test_a_task_given_up_at_admission_never_shows_as_in_progress() -> None:
    rig = Rig(JobSettings(max_attempts=2))
    [delivery] = await rig.deliveries(TaskMessage("spent", 1, attempts=2))
    await rig.execution.run_one(rig.worker, delivery)
    assert running(rig) == [] and rig.results.sent[0].gave_up
