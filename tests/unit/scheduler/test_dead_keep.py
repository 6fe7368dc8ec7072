"""An ended job keeps its dead-letter queue for the keep time, then the janitor deletes it."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.scheduler.fakes import FakeCluster, ManualClock, no_sleep
from truba.backoff import Backoff
from truba.scheduler import cli
from truba.scheduler.assigner import Assigner
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.lifecycle import DEFAULT_KEEP_DEAD, JobLifecycle
from truba.scheduler.registry import DaemonRegistry
from truba.scheduler.server import SchedulerConfig
from truba.scheduler.store import SqliteJobStore

HANDLER = "examples.math:square"
KEEP = 3600.0


@dataclass
class World:
    jobs: JobLifecycle
    janitor: QueueJanitor
    store: SqliteJobStore
    cluster: FakeCluster


def _janitor(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> QueueJanitor:
    return QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep), clock=clock)


@pytest.fixture
async def world(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> AsyncIterator[World]:
    assigner = Assigner(DaemonRegistry(), store.list, heartbeat_interval=1.0, clock=clock, event_delay=0)
    janitor = _janitor(cluster, store, clock)
    jobs = JobLifecycle(
        store, cluster.brokers, janitor, assigner, clock=clock, delete_wait=1.0, keep_dead=KEEP
    )
    yield World(jobs, janitor, store, cluster)
    await janitor.close()


def queues_everywhere(world: World) -> list[set[str]]:
    return [set(fake.queues) for fake in world.cluster.fakes]


async def test_a_finished_jobs_dead_letter_queue_is_kept_and_the_others_are_deleted(world: World) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    world.jobs.close(job.id, 1)
    finished = await world.jobs.finish(job.id)
    assert queues_everywhere(world) == [{job.queues.dead}, {job.queues.dead}]
    assert finished.finished_at is not None
    assert world.store.dead_until(job.id) == finished.finished_at + KEEP
    assert list(world.store.stale()) == []


async def test_the_dead_letter_queue_goes_once_the_keep_time_is_past(
    world: World, clock: ManualClock
) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    await world.jobs.cancel(job.id)  # a cancelled job keeps its evidence too
    clock.advance(KEEP - 1)
    assert await world.janitor.expire_dead() == []
    assert queues_everywhere(world) == [{job.queues.dead}, {job.queues.dead}]
    clock.advance(1)
    assert await world.janitor.expire_dead() == [job.id]
    assert queues_everywhere(world) == [set(), set()]
    assert world.store.dead_kept() == []


async def test_the_keep_time_survives_a_scheduler_restart(
    world: World, cluster: FakeCluster, tmp_path: Path, clock: ManualClock
) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    await world.jobs.finish(job.id)
    await world.janitor.close()
    world.store.close()
    # A new scheduler on the same store: the deadline is still there, and it is honoured
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    janitor = _janitor(cluster, store, clock)
    try:
        janitor.resume()
        assert await janitor.expire_dead() == []
        clock.advance(KEEP)
        assert await janitor.expire_dead() == [job.id]
        assert queues_everywhere(world) == [set(), set()]
    finally:
        await janitor.close()
        store.close()


async def test_a_broker_down_at_the_deadline_is_tried_again_at_the_next_pass(
    world: World, clock: ManualClock
) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    await world.jobs.finish(job.id)
    clock.advance(KEEP)
    world.cluster.fakes[1].down = True
    assert await world.janitor.expire_dead() == []
    assert world.store.dead_kept() == [(job.id, clock())]  # finished at clock() - KEEP
    world.cluster.fakes[1].down = False
    assert await world.janitor.expire_dead() == [job.id]
    assert queues_everywhere(world) == [set(), set()]


async def test_a_stale_ledger_entry_resumed_after_a_crash_still_keeps_the_dead_letters(
    world: World, cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock
) -> None:
    # Given a job ended but whose queues were not deleted yet (the scheduler died in between)
    job = await world.jobs.create(HANDLER, 1.0)
    cluster.fakes[0].down = True
    await world.jobs.finish(job.id)
    await world.janitor.close()
    cluster.fakes[0].down = False
    # When a new janitor resumes the deletion
    janitor = _janitor(cluster, store, clock)
    try:
        janitor.resume()
        await janitor.reap_within(job.id, timeout=5)
    finally:
        await janitor.close()
    # Then the dead-letter queue is still kept on every broker
    assert queues_everywhere(world) == [{job.queues.dead}, {job.queues.dead}]


def test_the_keep_time_is_a_scheduler_option_of_7_days_by_default(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["scheduler", "--broker", "amqp://h/", "--keep-dead", "60"])
    assert args.keep_dead == 60.0
    assert (
        parser.parse_args(["scheduler", "--broker", "amqp://h/"]).keep_dead == DEFAULT_KEEP_DEAD == 7 * 86400
    )
    with pytest.raises(ValueError, match="keep_dead: must be >= 0"):
        SchedulerConfig(brokers=["amqp://h/"], state_dir=tmp_path, keep_dead=-1)
