from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.unit.scheduler.fakes import FakeCluster, ManualClock, no_sleep
from truba.backoff import Backoff
from truba.scheduler.assigner import Assigner
from truba.scheduler.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from truba.scheduler.events import EventKind
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.model import JobState
from truba.scheduler.registry import DaemonInfo, DaemonRegistry, DaemonSession
from truba.scheduler.store import SqliteJobStore

HANDLER = "examples.math:square"


@dataclass
class World:
    jobs: JobLifecycle
    assigner: Assigner
    janitor: QueueJanitor
    store: SqliteJobStore
    cluster: FakeCluster


@pytest.fixture
async def world(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> AsyncIterator[World]:
    assigner = Assigner(DaemonRegistry(), store.list, heartbeat_interval=1.0, clock=clock, event_delay=0)
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    # Dead-letter queues deleted with the others here; keeping them is in test_dead_keep.py.
    jobs = JobLifecycle(store, cluster.brokers, janitor, assigner, clock=clock, delete_wait=1.0, keep_dead=0)
    yield World(jobs, assigner, janitor, store, cluster)
    await janitor.close()


def queues_everywhere(world: World) -> set[str]:
    return {name for fake in world.cluster.fakes for name in fake.queues}


async def test_create_stores_an_open_job_with_its_queues_on_every_broker(world: World) -> None:
    job = await world.jobs.create(HANDLER, 2.0, " squares ")
    assert (job.state, job.handler, job.importance, job.name) == (JobState.OPEN, HANDLER, 2.0, "squares")
    assert world.store.get(job.id) == job
    for fake in world.cluster.fakes:
        assert set(fake.queues) == set(job.queues.all())
    assert list(world.store.stale()) == []


async def test_create_with_a_broker_down_leaves_nothing_behind(world: World) -> None:
    world.cluster.fakes[1].down = True
    with pytest.raises(Unavailable, match="broker b1"):
        await world.jobs.create(HANDLER, 1.0)
    assert list(world.store.list(include_done=True)) == []
    # b0's queues are deleted by the janitor once b1 is back (its delete is retried)
    world.cluster.fakes[1].down = False
    for job_id in world.janitor.pending():
        await world.janitor.reap_within(job_id, timeout=5)
    assert queues_everywhere(world) == set()
    assert list(world.store.stale()) == []


async def test_create_refuses_bad_fields_before_touching_a_broker(world: World) -> None:
    with pytest.raises(InvalidArgument, match="^handler: "):
        await world.jobs.create("x", 1.0)
    with pytest.raises(InvalidArgument, match="^importance: "):
        await world.jobs.create(HANDLER, -1.0)
    assert all(fake.connects == 0 for fake in world.cluster.fakes)


async def test_create_refuses_a_handler_no_connected_daemon_allows(world: World, clock: ManualClock) -> None:
    world.assigner.connect(DaemonSession(DaemonInfo("d1", 2, ("examples.*",)), {}, clock()))
    with pytest.raises(
        FailedPrecondition, match=r"^handler 'other.mod:f' is not allowed by any connected daemon"
    ):
        await world.jobs.create("other.mod:f", 1.0)
    job = await world.jobs.create(HANDLER, 1.0)
    assert world.assigner.slots_of(job.id) == 2


async def test_close_records_the_count_and_is_idempotent(world: World, clock: ManualClock) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    clock.advance(5)
    closed = world.jobs.close(job.id, 42)
    assert (closed.state, closed.submitted, closed.closed_at) == (JobState.CLOSED, 42, clock())
    assert world.jobs.close(job.id, 42) == closed
    with pytest.raises(FailedPrecondition, match="already closed with submitted=42, got 43"):
        world.jobs.close(job.id, 43)


async def test_finish_deletes_the_queues_and_ends_the_job(world: World) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    world.jobs.close(job.id, 3)
    finished = await world.jobs.finish(job.id)
    assert finished.state is JobState.FINISHED and finished.finished_at is not None
    assert queues_everywhere(world) == set()
    assert list(world.store.stale()) == []
    assert await world.jobs.finish(job.id) == finished  # repeated: no-op
    with pytest.raises(FailedPrecondition, match="is finished: it cannot be closed"):
        world.jobs.close(job.id, 3)
    with pytest.raises(FailedPrecondition, match="is finished: it cannot be cancelled"):
        await world.jobs.cancel(job.id)


async def test_cancel_deletes_the_queues_even_while_a_broker_is_down(world: World) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    world.cluster.fakes[0].down = True
    cancelled = await world.jobs.cancel(job.id)  # answers after delete_wait, deletion goes on
    assert cancelled.state is JobState.CANCELLED
    assert list(world.store.stale()) == [job.id]
    assert world.cluster.fakes[1].queues == {}
    world.cluster.fakes[0].down = False
    await world.janitor.reap_within(job.id, timeout=5)
    assert queues_everywhere(world) == set() and list(world.store.stale()) == []
    with pytest.raises(FailedPrecondition, match="is cancelled: it cannot be finished"):
        await world.jobs.finish(job.id)


async def test_unknown_and_malformed_ids(world: World) -> None:
    with pytest.raises(NotFound, match="^job 'xyz' not found$"):
        world.jobs.get("xyz")
    with pytest.raises(NotFound):
        world.jobs.close("xyz", 1)
    with pytest.raises(NotFound):
        await world.jobs.finish("xyz")
    with pytest.raises(InvalidArgument, match="^job_id: required$"):
        await world.jobs.cancel("")


async def test_a_cancelled_create_has_its_queues_deleted(world: World) -> None:
    world.cluster.fakes[1].hang = True
    creating = asyncio.create_task(world.jobs.create(HANDLER, 1.0))
    await asyncio.sleep(0.05)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    world.cluster.fakes[1].hang = False
    [job_id] = world.janitor.pending()
    assert await world.janitor.reap_within(job_id, timeout=5)
    assert queues_everywhere(world) == set() and list(world.store.list(include_done=True)) == []


async def test_an_open_job_whose_client_has_every_outcome_is_drained_for_its_watchers(world: World) -> None:
    job = await world.jobs.create(HANDLER, 1.0)
    watch = world.jobs.events.watch(job.id)
    changes = watch.changes()
    world.jobs.report_progress(job.id, 3, 2)
    assert await anext(changes) == [EventKind.PROGRESS]
    world.jobs.report_progress(job.id, 3, 3)  # nothing queued or running: seed 004's FINQ
    assert await anext(changes) == [EventKind.PROGRESS, EventKind.DRAINED]
    world.jobs.report_progress(job.id, 3, 3)  # the same counts again: no event
    world.jobs.report_progress(job.id, 5, 5)  # drained again after more submissions
    assert await anext(changes) == [EventKind.PROGRESS, EventKind.DRAINED]
    world.jobs.close(job.id, 6)
    world.jobs.report_progress(job.id, 6, 6)  # a closed job finishes instead
    kinds = await anext(changes)
    while EventKind.PROGRESS not in kinds:
        kinds = await anext(changes)
    assert EventKind.DRAINED not in kinds
    watch.close()
