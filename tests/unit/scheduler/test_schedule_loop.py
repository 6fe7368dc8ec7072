"""The firing loop's decisions, on a real SQLite store, fake pipes and an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.scheduler.fakes import FakePipe, FakePipes, ManualClock
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.schedule_loop import FiringLoop, outcome_of
from truba.scheduler.schedule_model import (
    LEASE_GRACE,
    START_WITHIN,
    RunOutcome,
    Schedule,
    ScheduleRun,
    ScheduleState,
)
from truba.scheduler.schedule_pipes import task_bytes
from truba.scheduler.schedule_store import ScheduleStore
from truba.scheduler.store import SqliteJobStore
from truba.wire import ErrorInfo, ResultMessage, TaskCodec

T0 = 1_750_000_000.0


@pytest.fixture
def schedules(tmp_path: Path) -> Iterator[ScheduleStore]:
    jobs = SqliteJobStore(tmp_path / "jobs.sqlite3")
    yield jobs.schedules
    jobs.close()


def every_second(**changes: object) -> Schedule:
    schedule = Schedule(
        id="s1",
        handler="m:f",
        job_id="job1",
        every=1.0,
        cron="",
        payload=b"\x2a",
        deadline=0.5,
        importance=1.0,
        created_at=T0,
        next_due=T0,
    )
    return replace(schedule, **changes)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def start(store: ScheduleStore, clock: ManualClock, schedule: Schedule) -> tuple[FiringLoop, FakePipe]:
    store.add(schedule)
    pipes = FakePipes()
    loop = FiringLoop(store, pipes, clock=clock)
    loop.track(schedule, read=False)
    return loop, pipes.pipes["truba.job.job1.tasks"]


def restarted(store: ScheduleStore, clock: ManualClock) -> FiringLoop:
    """A new scheduler's firing loop on the same store: it tracks every schedule there."""
    loop = FiringLoop(store, FakePipes(), clock=clock)
    for schedule in store.list():
        loop.track(schedule, read=False)
    return loop


async def test_a_schedule_fires_once_per_period_while_each_run_ends_in_time(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0)
    loop, pipe = await start(schedules, clock, every_second())
    fired: list[str] = []
    for step in range(50):  # 5 s in 100 ms ticks
        clock.now = T0 + step / 10
        fired += await loop.tick()
        await settle()
        if fired and step % 10 == 2:  # each run ends 200 ms after it started
            loop.record(ScheduleRun("s1", fired[-1], 0, 0, clock(), RunOutcome.OK, "", 0.2))
    assert fired == ["run-1", "run-2", "run-3", "run-4", "run-5"]
    assert [task_id for task_id, _ in pipe.sent] == fired and pipe.sent[0][1] == b"\x2a"
    assert pipe.expires == [T0 + k + START_WITHIN for k in range(5)]  # each may start within 0.75 s
    assert [r.outcome for r in schedules.runs("s1")] == [RunOutcome.OK] * 5
    await loop.close()


async def test_a_held_schedule_does_not_fire_and_missed_due_times_are_skipped(
    schedules: ScheduleStore,
) -> None:
    clock = ManualClock(T0)
    loop, pipe = await start(schedules, clock, every_second(deadline=1.0))
    assert await loop.tick() == ["run-1"]
    clock.advance(1.2)  # due at T0+1, but run-1 holds the lease until T0 + 1 + grace
    assert await loop.tick() == []
    loop.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.OK))
    assert await loop.tick() == ["run-2"]  # the due time T0+1 fires, late, once
    cached = loop.cached("s1")
    assert cached is not None and cached.next_due == T0 + 2  # the phase is kept
    await loop.close()


async def test_a_run_without_an_outcome_is_counted_lost_when_its_lease_expires(
    schedules: ScheduleStore,
) -> None:
    clock = ManualClock(T0)
    loop, _ = await start(schedules, clock, every_second())
    assert await loop.tick() == ["run-1"]
    clock.advance(0.5 + LEASE_GRACE - 0.01)
    assert await loop.tick() == []
    clock.advance(0.02)  # the lease expired: counted lost, and the next due time fires at once
    assert await loop.tick() == ["run-2"]
    runs = schedules.runs("s1")
    assert [(r.task_id, r.outcome) for r in runs] == [
        ("run-2", RunOutcome.RUNNING),
        ("run-1", RunOutcome.LOST),
    ]
    await loop.close()


async def test_a_send_that_fails_ends_the_run_as_an_error_and_frees_the_schedule(
    schedules: ScheduleStore,
) -> None:
    clock = ManualClock(T0)
    loop, pipe = await start(schedules, clock, every_second())
    pipe.fail = True
    assert await loop.tick() == ["run-1"]
    await settle()
    (run,) = schedules.runs("s1")
    assert run.outcome is RunOutcome.ERROR and run.error.startswith("SendFailed: PipeClosed")
    stored = schedules.get("s1")
    assert stored is not None and stored.lease_until == 0
    await loop.close()


async def test_a_paused_schedule_does_not_fire(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0)
    loop, _ = await start(schedules, clock, every_second(state=ScheduleState.PAUSED))
    clock.advance(5)
    assert await loop.tick() == []
    await loop.close()


async def test_a_restarted_loop_honours_the_lease_left_in_the_store(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0)
    first, _ = await start(schedules, clock, every_second())
    assert await first.tick() == ["run-1"]
    await first.close()  # the scheduler dies with run-1 under way
    clock.advance(1.0)
    second = restarted(schedules, clock)
    assert await second.tick() == []  # run-1's lease holds until T0 + 0.5 + grace
    second.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.OK))  # its outcome was waiting
    assert await second.tick() == ["run-2"]
    await second.close()


async def test_a_loop_started_after_a_lease_ran_out_gives_the_reader_time_to_record_the_outcome(
    schedules: ScheduleStore,
) -> None:
    clock = ManualClock(T0)
    first, _ = await start(schedules, clock, every_second())
    assert await first.tick() == ["run-1"]
    await first.close()  # the scheduler dies with run-1 under way, and is down past its lease
    clock.advance(0.5 + LEASE_GRACE + 3.0)
    second = restarted(schedules, clock)
    assert await second.tick() == []  # held for LEASE_GRACE from now: run-1's outcome may be queued
    assert second.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.OK))  # and it was
    assert await second.tick() == ["run-2"]  # once, for the due times missed meanwhile
    assert [(r.task_id, r.outcome) for r in schedules.runs("s1")] == [
        ("run-2", RunOutcome.RUNNING),
        ("run-1", RunOutcome.OK),
    ]
    await second.close()


async def test_a_run_whose_outcome_never_comes_after_a_restart_is_lost_after_the_held_grace(
    schedules: ScheduleStore,
) -> None:
    clock = ManualClock(T0)
    first, _ = await start(schedules, clock, every_second())
    assert await first.tick() == ["run-1"]
    await first.close()
    clock.advance(10.0)
    second = restarted(schedules, clock)
    clock.advance(LEASE_GRACE - 0.01)
    assert await second.tick() == []
    clock.advance(0.02)
    assert len(await second.tick()) == 1
    assert [r.outcome for r in schedules.runs("s1")] == [RunOutcome.RUNNING, RunOutcome.LOST]
    await second.close()


async def test_two_loops_on_one_store_fire_each_due_time_once(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0)
    one, _ = await start(schedules, clock, every_second())
    other = FiringLoop(schedules, FakePipes(), clock=clock)
    other.track(every_second(), read=False)
    assert await one.tick() == ["run-1"]
    assert await other.tick() == []
    await one.close()
    await other.close()


def test_results_map_to_outcomes() -> None:
    assert outcome_of(ResultMessage("t", True, 5)) == (RunOutcome.OK, "")
    boom = ErrorInfo("ValueError", "boom")
    assert outcome_of(ResultMessage("t", False, error=boom)) == (RunOutcome.ERROR, "ValueError: boom")
    late = ErrorInfo("TaskTimeout", "ran longer than 0.5 s")
    assert outcome_of(ResultMessage("t", False, error=late, gave_up=True))[0] is RunOutcome.TIMEOUT
    lost = ErrorInfo("AttemptLost", "its daemon died")
    assert outcome_of(ResultMessage("t", False, error=lost, gave_up=True))[0] is RunOutcome.LOST


def test_a_run_s_task_is_a_truba_task_message_with_the_payload_as_given() -> None:
    task = TaskCodec().decode(task_bytes("run-7", b"\x92\x01\xa1x"))
    assert (task.task_id, task.payload, task.attempts) == ("run-7", [1, "x"], 0)
    assert TaskCodec().decode(task_bytes("run-8", b"")).payload is None
    expiring = TaskCodec().decode(task_bytes("run-9", b"\x07", 1_750_000_000.5))
    assert (expiring.payload, expiring.expires) == (7, 1_750_000_000.5)


async def test_runs_are_counted_by_outcome_and_their_lateness_observed(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0 + 0.02)  # 20 ms after the first due time
    metrics = SchedulerMetrics()
    schedules.add(every_second())
    loop = FiringLoop(schedules, FakePipes(), clock=clock, observer=metrics)
    loop.track(every_second(), read=False)
    assert await loop.tick() == ["run-1"]
    loop.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.OK))
    loop.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.ERROR))  # a duplicate: not counted
    clock.advance(1.0)
    assert await loop.tick() == ["run-2"]
    loop.record(ScheduleRun("s1", "run-2", 0, 0, clock(), RunOutcome.TIMEOUT, "TaskTimeout: slow"))

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("truba_schedule_runs_total", schedule_id="s1", outcome="ok") == 1.0
    assert sample("truba_schedule_runs_total", schedule_id="s1", outcome="timeout") == 1.0
    assert sample("truba_schedule_runs_total", schedule_id="s1", outcome="error") is None
    assert sample("truba_schedule_fire_lateness_seconds_count") == 2.0
    assert sample("truba_schedule_fire_lateness_seconds_bucket", le="0.025") == 2.0
    assert sample("truba_schedule_fire_lateness_seconds_bucket", le="0.01") == 0.0
    await loop.untrack("s1")  # deleted: its series go
    assert sample("truba_schedule_runs_total", schedule_id="s1", outcome="ok") is None
    await loop.close()


async def test_runs_sent_and_ended_are_reported_as_the_job_s_progress(schedules: ScheduleStore) -> None:
    clock = ManualClock(T0)
    schedules.add(every_second())
    reports: list[tuple[str, int, int]] = []
    loop = FiringLoop(
        schedules,
        FakePipes(),
        clock=clock,
        progress=lambda s: reports.append((s.job_id, s.runs, s.runs - (1 if s.run_task else 0))),
    )
    loop.track(every_second(), read=False)
    assert await loop.tick() == ["run-1"]
    loop.record(ScheduleRun("s1", "run-1", 0, 0, clock(), RunOutcome.OK, "", 0.2))
    clock.advance(1.0)
    assert await loop.tick() == ["run-2"]
    clock.advance(0.5 + LEASE_GRACE + 0.01)  # run-2 is lost by its lease: an outcome too
    await loop.tick()
    assert reports[:4] == [("job1", 1, 0), ("job1", 1, 1), ("job1", 2, 1), ("job1", 2, 2)]
    await loop.close()
