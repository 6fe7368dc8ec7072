"""Schedules' lifecycle over a real SQLite store, fake brokers and fake pipes: each schedule owns
a job made for it, which ends only with the schedule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.unit.scheduler.fakes import FakeCluster, FakePipes, ManualClock, no_sleep
from truba.backoff import Backoff
from truba.scheduler.assigner import Assigner
from truba.scheduler.errors import FailedPrecondition, InvalidArgument, NotFound
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.model import JobState
from truba.scheduler.registry import DaemonRegistry
from truba.scheduler.schedule_loop import FiringLoop
from truba.scheduler.schedule_model import ScheduleState
from truba.scheduler.schedules import ScheduleBook
from truba.scheduler.store import SqliteJobStore

HANDLER = "examples.math:square"


@dataclass
class World:
    book: ScheduleBook
    jobs: JobLifecycle
    loop: FiringLoop
    store: SqliteJobStore
    clock: ManualClock


@pytest.fixture
async def world(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> AsyncIterator[World]:
    assigner = Assigner(DaemonRegistry(), store.list, heartbeat_interval=1.0, clock=clock, event_delay=0)
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    jobs = JobLifecycle(store, cluster.brokers, janitor, assigner, clock=clock, delete_wait=1.0, keep_dead=0)
    loop = FiringLoop(store.schedules, FakePipes(), clock=clock)
    yield World(
        ScheduleBook(store.schedules, jobs, loop, consumer_timeout=1800.0, clock=clock),
        jobs,
        loop,
        store,
        clock,
    )
    await loop.close()
    await janitor.close()


async def test_a_schedule_gets_a_job_of_one_slot_one_attempt_and_its_deadline(world: World) -> None:
    schedule = await world.book.create(HANDLER, every=1.0, deadline=0.8, payload=b"\x01", name="tick")
    job = world.jobs.get(schedule.job_id)
    assert (job.handler, job.name, job.state) == (HANDLER, "schedule tick", JobState.OPEN)
    settings = job.settings
    assert (settings.min_slots, settings.max_slots, settings.max_attempts) == (1, 1, 1)
    assert (settings.task_timeout, settings.frames) == (0.8, False)
    assert schedule.next_due == world.clock() and schedule.importance == 1.0
    assert world.book.get(schedule.id) == schedule
    assert world.loop.cached(schedule.id) == schedule


async def test_bad_arguments_are_refused_before_a_job_is_made(world: World) -> None:
    for kwargs, field in [
        ({"every": 1.0, "cron": "* * * * *"}, "every"),
        ({"every": 1.0, "deadline": 2.0}, "deadline"),
        ({"cron": "nonsense"}, "cron"),
        ({"every": 1.0, "importance": -1.0}, "importance"),
        ({"every": 1.0, "payload": b"x" * (1024 * 1024 + 1)}, "payload"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            await world.book.create(HANDLER, **kwargs)  # type: ignore[arg-type]
        assert refused.value.field == field
    with pytest.raises(InvalidArgument, match="handler"):
        await world.book.create("no colon", every=1.0)
    assert world.jobs.list() == [] and world.book.list() == []


async def test_a_schedule_s_job_ends_only_with_the_schedule(world: World) -> None:
    schedule = await world.book.create(HANDLER, every=1.0)
    with pytest.raises(FailedPrecondition, match=f"schedule '{schedule.id}'"):
        await world.jobs.cancel(schedule.job_id)
    with pytest.raises(FailedPrecondition):
        await world.jobs.finish(schedule.job_id)
    await world.book.delete(schedule.id)
    assert world.jobs.get(schedule.job_id).state is JobState.CANCELLED
    assert world.book.list() == [] and world.loop.cached(schedule.id) is None
    with pytest.raises(NotFound):
        world.book.get(schedule.id)


async def test_pause_and_resume_keep_the_phase_and_skip_missed_times(world: World) -> None:
    schedule = await world.book.create(HANDLER, every=2.0)
    paused = world.book.pause(schedule.id)
    assert paused.state is ScheduleState.PAUSED and world.book.pause(schedule.id) == paused
    world.clock.advance(5.0)  # due at +0, +2, +4 while paused
    resumed = world.book.resume(schedule.id)
    assert resumed.state is ScheduleState.ACTIVE and resumed.next_due == schedule.next_due + 6.0
    assert world.loop.cached(schedule.id) == resumed


async def test_stored_schedules_are_tracked_again_at_start(world: World) -> None:
    one = await world.book.create(HANDLER, every=1.0)
    two = await world.book.create(HANDLER, cron="*/5 * * * *")
    again = FiringLoop(world.store.schedules, FakePipes(), clock=world.clock)
    book = ScheduleBook(world.store.schedules, world.jobs, again, consumer_timeout=1800.0, clock=world.clock)
    assert book.restore() == 2
    assert again.cached(one.id) == one and again.cached(two.id) == two
    await again.close()


async def test_a_schedule_whose_job_ended_is_not_fired_at_start_and_can_be_deleted(world: World) -> None:
    # a crash during a delete: the job was cancelled, the schedule not yet removed
    schedule = await world.book.create(HANDLER, every=1.0)
    await world.loop.untrack(schedule.id)
    await world.jobs.cancel(schedule.job_id)
    again = FiringLoop(world.store.schedules, FakePipes(), clock=world.clock)
    book = ScheduleBook(world.store.schedules, world.jobs, again, consumer_timeout=1800.0, clock=world.clock)
    assert book.restore() == 0 and again.cached(schedule.id) is None
    assert [s.id for s in book.list()] == [schedule.id]
    await book.delete(schedule.id)
    assert book.list() == []
    await again.close()


async def test_an_unknown_or_malformed_schedule_id_is_refused(world: World) -> None:
    with pytest.raises(NotFound):
        world.book.get("abc123")
    with pytest.raises(InvalidArgument) as refused:
        world.book.get("../x")
    assert refused.value.field == "schedule_id"
