"""The scheduler's list of attempts in progress: the latest heartbeat of each connected daemon,
gone with the daemon, read per job oldest first, served over gRPC and HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.scheduler.fakes import FakeCluster, ManualClock, no_sleep
from truba.backoff import Backoff
from truba.proto.v1 import daemons_pb2, jobs_pb2, jobs_pb2_grpc
from truba.scheduler import Scheduler, SchedulerConfig
from truba.scheduler.assigner import Assigner
from truba.scheduler.errors import NotFound
from truba.scheduler.history import JobHistory
from truba.scheduler.http_api import build_app
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.registry import DaemonInfo, DaemonRegistry, DaemonSession
from truba.scheduler.running import DaemonRunning, running_of
from truba.scheduler.store import SqliteJobStore
from truba.scheduler.view import ClusterView


def attempt(
    job_id: str, task_id: str, start: float, slot: int = 0, number: int = 1
) -> daemons_pb2.RunningAttempt:
    return daemons_pb2.RunningAttempt(job_id=job_id, task_id=task_id, slot=slot, attempt=number, start=start)


def beat(*attempts: daemons_pb2.RunningAttempt, left_out: dict[str, int] | None = None) -> DaemonRunning:
    """What the scheduler keeps of a heartbeat carrying ``attempts``."""
    return DaemonRunning.of(daemons_pb2.Heartbeat(attempts=attempts, attempts_left_out=left_out or {}))


@dataclass
class FakeDaemon:
    daemon_id: str
    hostname: str = "host"
    running: DaemonRunning = field(default_factory=DaemonRunning)


def test_a_jobs_attempts_come_from_every_daemon_oldest_first_with_what_was_left_out() -> None:
    d1 = FakeDaemon("d1", "h1", beat(attempt("j", "late", 30.0, slot=1), attempt("other", "x", 1.0)))
    d2 = FakeDaemon("d2", "h2", beat(attempt("j", "early", 10.0, number=2), left_out={"j": 3, "other": 9}))
    found, left_out = running_of([d1, d2, FakeDaemon("idle")], "j")
    assert [tuple(r) for r in found] == [("d2", "h2", 0, "early", 2, 10.0), ("d1", "h1", 1, "late", 1, 30.0)]
    assert left_out == 3
    found, left_out = running_of([d1, d2], "j", limit=1)
    assert [r.task_id for r in found] == ["early"] and left_out == 3 + 1
    assert running_of([d1, d2], "nobody") == ([], 0)


@dataclass
class World:
    jobs: JobLifecycle
    assigner: Assigner
    view: ClusterView


@pytest.fixture
async def world(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> AsyncIterator[World]:
    assigner = Assigner(DaemonRegistry(), store.list, heartbeat_interval=1.0, clock=clock, event_delay=0)
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    jobs = JobLifecycle(store, cluster.brokers, janitor, assigner, clock=clock, delete_wait=1.0, keep_dead=0)
    yield World(jobs, assigner, ClusterView(jobs, assigner, clock))
    await janitor.close()


async def test_the_latest_heartbeat_replaces_a_daemons_list_and_the_list_goes_with_the_daemon(
    world: World, clock: ManualClock
) -> None:
    job = await world.jobs.create("examples.math:square", 1.0)
    session = DaemonSession(DaemonInfo("d1", 2, ("examples.*",), hostname="h1"), {}, clock())
    world.assigner.connect(session)
    assert world.view.running(job.id).running == []
    session.running = beat(attempt(job.id, "a", 5.0), attempt(job.id, "b", 6.0, slot=1))
    answer = world.view.running(job.id)
    assert [(r.task_id, r.daemon_id, r.hostname, r.slot) for r in answer.running] == [
        ("a", "d1", "h1", 0),
        ("b", "d1", "h1", 1),
    ]
    assert answer.job_id == job.id and answer.left_out == 0 and answer.at > 0
    session.running = beat(attempt(job.id, "b", 6.0, slot=1))  # a ended
    assert [r.task_id for r in world.view.running(job.id).running] == ["b"]
    world.assigner.disconnect(session, "test")
    assert world.view.running(job.id).running == []
    with pytest.raises(NotFound):
        world.view.running("nope")


async def test_the_http_api_serves_a_jobs_running_list_next_to_the_job(
    world: World, clock: ManualClock
) -> None:
    job = await world.jobs.create("examples.math:square", 1.0)
    session = DaemonSession(DaemonInfo("d1", 2, ("examples.*",), hostname="h1"), {}, clock())
    world.assigner.connect(session)
    session.running = beat(attempt(job.id, "a", 5.0, number=2))
    app = build_app(world.view, SchedulerMetrics(), JobHistory(world.view))
    async with TestClient(TestServer(app)) as client:
        response = await client.get(f"/api/v1/jobs/{job.id}/running")
        assert response.status == 200
        body = await response.json()
        assert body["running"] == [
            {"daemon_id": "d1", "hostname": "h1", "slot": 0, "task_id": "a", "attempt": 2, "started_at": 5.0}
        ]
        assert body["job_id"] == job.id and body["left_out"] == 0
        assert (await client.get(f"/api/v1/jobs/{job.id}/running?limit=x")).status == 400
        assert (await client.get("/api/v1/jobs/nope/running")).status == 404


async def test_the_running_list_of_an_unknown_job_is_refused_over_grpc_and_http(tmp_path: Path) -> None:
    config = SchedulerConfig(
        brokers=["amqp://guest:guest@127.0.0.1:1/"],
        state_dir=tmp_path,
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
    )
    async with Scheduler(config) as scheduler:
        async with grpc.aio.insecure_channel(scheduler.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListRunning(jobs_pb2.ListRunningRequest(job_id="nope"))
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        url = f"http://{scheduler.http_address}/api/v1/jobs/nope/running"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 404
