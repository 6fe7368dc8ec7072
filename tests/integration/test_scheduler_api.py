"""The scheduler's full control API against real brokers: job settings, importance, progress and
demand, WatchJob, daemons (list, drain), and optional bearer-token and TLS security."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.test_scheduler import FakeDaemon, Node, config, create, refused
from truba.channel import Credentials, open_channel
from truba.proto.v1 import common_pb2, daemons_pb2, daemons_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from truba.scheduler import Scheduler

pytestmark = pytest.mark.integration


@pytest.fixture
async def scheduler(rabbit_nodes: Sequence[Node], tmp_path: Path) -> AsyncIterator[Scheduler]:
    server = Scheduler(dataclasses.replace(config(rabbit_nodes, tmp_path / "state"), consumer_timeout=600))
    await server.start()
    yield server
    await server.stop(grace=0)


@pytest.fixture
async def channel(scheduler: Scheduler) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(scheduler.address) as channel:
        yield channel


@pytest.fixture
def jobs(channel: grpc.aio.Channel) -> jobs_pb2_grpc.JobServiceAsyncStub:
    return jobs_pb2_grpc.JobServiceStub(channel)


async def latest_assignment(daemon: FakeDaemon, want: dict[str, int], timeout: float = 5.0) -> None:
    """Reads assignments until one equals ``want``."""
    got: dict[str, int] = {}
    async with asyncio.timeout(timeout):
        while got != want:
            message = await daemon.receive(timeout)
            if message.HasField("assignment"):
                daemon.version = message.assignment.version
                got = {entry.job_id: entry.slots for entry in message.assignment.jobs}


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (common_pb2.JobSettings(task_timeout=601), "settings.task_timeout"),
        (common_pb2.JobSettings(task_timeout=-1), "settings.task_timeout"),
        (common_pb2.JobSettings(min_slots=4, max_slots=2), "settings.max_slots"),
        (common_pb2.JobSettings(max_attempts=100_000), "settings.max_attempts"),
        (common_pb2.JobSettings(preemption=7), "settings.preemption"),  # type: ignore[arg-type]
        (common_pb2.JobSettings(priorities=True), "settings.priorities"),
    ],
)
async def test_bad_settings_are_invalid_arguments_naming_the_field(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, settings: common_pb2.JobSettings, field: str
) -> None:
    request = jobs_pb2.CreateJobRequest(handler="examples.math:square", importance=1, settings=settings)
    code, details = await refused(jobs.CreateJob(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: ")


async def test_a_timeout_above_the_brokers_consumer_timeout_is_refused_with_the_way_out(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub,
) -> None:
    request = jobs_pb2.CreateJobRequest(
        handler="examples.math:square", importance=1, settings=common_pb2.JobSettings(task_timeout=3600)
    )
    _, details = await refused(jobs.CreateJob(request))
    assert "exceeds the brokers' consumer_timeout of 600s" in details and "--consumer-timeout" in details


async def test_settings_are_stored_defaulted_and_sent_to_daemons(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    daemon = FakeDaemon(channel, "node-s", 2, ["examples.*"])
    assert (await daemon.receive()).HasField("welcome")
    settings = common_pb2.JobSettings(
        preemption=common_pb2.PREEMPTION_IMMEDIATE,
        task_timeout=30,
        queue_type=common_pb2.QUEUE_TYPE_CLASSIC,
        max_slots=1,
    )
    request = jobs_pb2.CreateJobRequest(handler="examples.math:square", importance=1, settings=settings)
    async with daemon.beating():
        job = (await jobs.CreateJob(request)).job
        assert job.settings.max_attempts == 3  # the default, filled in
        assert job.settings.queue_type == common_pb2.QUEUE_TYPE_CLASSIC
        message = await daemon.receive()
        while not (message.HasField("assignment") and message.assignment.jobs):
            message = await daemon.receive()
    (entry,) = message.assignment.jobs
    assert (entry.slots, entry.settings.preemption, entry.settings.task_timeout) == (
        1,
        common_pb2.PREEMPTION_IMMEDIATE,
        30,
    )
    daemon.end()
    await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))


async def test_importance_sets_the_shares_and_can_change(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    daemon = FakeDaemon(channel, "node-i", 6, ["examples.*"])
    assert (await daemon.receive()).HasField("welcome")
    async with daemon.beating():
        low = (await create(jobs, importance=1.0)).job
        high = (await create(jobs, importance=2.0)).job
        await latest_assignment(daemon, {low.id: 2, high.id: 4})
        got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=high.id))
        assert got.fair_share == pytest.approx(4.0)
        changed = await jobs.SetImportance(jobs_pb2.SetImportanceRequest(job_id=low.id, importance=2.0))
        assert changed.importance == 2.0
        await latest_assignment(daemon, {low.id: 3, high.id: 3})
    code, details = await refused(jobs.SetImportance(jobs_pb2.SetImportanceRequest(job_id=low.id)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("importance: ")
    daemon.end()
    for job in (low, high):
        await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    code, _ = await refused(jobs.SetImportance(jobs_pb2.SetImportanceRequest(job_id=low.id, importance=1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_reported_progress_sets_demand_and_a_job_that_needs_less_gives_slots_away(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    daemon = FakeDaemon(channel, "node-p", 4, ["examples.*"])
    assert (await daemon.receive()).HasField("welcome")
    stats: list[daemons_pb2.JobStats] = []  # what the daemon reports, changed as the test goes
    async with daemon.beating(stats):
        small = (await create(jobs)).job
        big = (await create(jobs)).job
        await latest_assignment(daemon, {small.id: 2, big.id: 2})
        # The small job has one task left to run: it keeps one slot, the big one gets the rest
        await jobs.ReportProgress(jobs_pb2.ReportProgressRequest(job_id=small.id, submitted=1))
        await latest_assignment(daemon, {small.id: 1, big.id: 3})
        # Daemons report it done and the client took its outcome: no demand left, all slots go
        # to the big job (with the outcome not taken yet, the job would keep one slot to probe with)
        stats.append(daemons_pb2.JobStats(job_id=small.id, done=1))
        daemon.send_heartbeat(stats=stats)
        await jobs.ReportProgress(jobs_pb2.ReportProgressRequest(job_id=small.id, submitted=1, received=1))
        await latest_assignment(daemon, {big.id: 4})
        got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=small.id))
        assert (got.counts.submitted, got.counts.done, got.counts.backlog) == (1, 1, 0)
        code, details = await refused(
            jobs.ReportProgress(jobs_pb2.ReportProgressRequest(job_id=small.id, submitted=2**63))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("submitted: ")
    daemon.end()
    for job in (small, big):
        await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))


async def test_watch_job_streams_a_snapshot_then_changes_until_the_job_ends(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    job = (await create(jobs)).job
    stream = jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=job.id))
    events: list[jobs_pb2.JobEvent] = []

    async def collect() -> None:
        async for event in stream:
            events.append(event)

    collector = asyncio.create_task(collect())

    async def seen(kind: int) -> None:
        async with asyncio.timeout(5):
            while not any(e.kind == kind for e in events):
                await asyncio.sleep(0.05)

    await seen(jobs_pb2.JOB_EVENT_KIND_SNAPSHOT)
    assert events[0].job.id == job.id and events[0].job.state == jobs_pb2.JOB_STATE_OPEN
    daemon = FakeDaemon(channel, "node-w", 2, ["examples.*"])
    async with daemon.beating():
        await seen(jobs_pb2.JOB_EVENT_KIND_SLOTS)
        await jobs.SetImportance(jobs_pb2.SetImportanceRequest(job_id=job.id, importance=5))
        await seen(jobs_pb2.JOB_EVENT_KIND_IMPORTANCE)
        await jobs.ReportProgress(jobs_pb2.ReportProgressRequest(job_id=job.id, submitted=3))
        await seen(jobs_pb2.JOB_EVENT_KIND_PROGRESS)
        await jobs.CloseJob(jobs_pb2.CloseJobRequest(job_id=job.id, submitted=3))
        await jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=job.id))
        await asyncio.wait_for(collector, 5)  # the stream ended by itself
        assert events[-1].kind == jobs_pb2.JOB_EVENT_KIND_STATE
        assert events[-1].job.state == jobs_pb2.JOB_STATE_FINISHED
        assert any(e.job.assigned_slots == 2 for e in events)
    daemon.end()
    code, _ = await refused(anext(aiter(jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id="nosuchjob")))))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_daemons_are_listed_and_a_drained_one_is_told_and_loses_its_slots(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    stub: daemons_pb2_grpc.DaemonServiceAsyncStub = daemons_pb2_grpc.DaemonServiceStub(channel)
    a = FakeDaemon(channel, "node-a", 2, ["examples.*"])
    b = FakeDaemon(channel, "node-b", 2, ["examples.*"])
    for daemon in (a, b):
        assert (await daemon.receive()).HasField("welcome")
    job = (await create(jobs)).job
    await latest_assignment(a, {job.id: 2})
    listed = await stub.ListDaemons(daemons_pb2.ListDaemonsRequest())
    assert [(d.daemon_id, d.slots, d.draining) for d in listed.daemons] == [
        ("node-a", 2, False),
        ("node-b", 2, False),
    ]
    drained = await stub.DrainDaemon(daemons_pb2.DrainDaemonRequest(daemon_id="node-a"))
    assert drained.draining
    message = await a.receive()
    while not message.HasField("drain"):
        message = await a.receive()
    await latest_assignment(a, {})
    got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
    assert got.assigned_slots == 2  # all on node-b now
    code, _ = await refused(stub.DrainDaemon(daemons_pb2.DrainDaemonRequest(daemon_id="nobody")))
    assert code == grpc.StatusCode.NOT_FOUND
    for daemon in (a, b):
        daemon.end()
    await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))


async def test_with_a_token_every_call_but_health_needs_it(
    rabbit_nodes: Sequence[Node], tmp_path: Path
) -> None:
    secured = dataclasses.replace(config(rabbit_nodes, tmp_path / "state"), token="s3cret")
    async with Scheduler(secured) as scheduler:
        async with grpc.aio.insecure_channel(scheduler.address) as bare:
            stub: jobs_pb2_grpc.JobServiceAsyncStub = jobs_pb2_grpc.JobServiceStub(bare)
            code, _ = await refused(stub.ListJobs(jobs_pb2.ListJobsRequest()))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            code, _ = await refused(
                stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=(("authorization", "Bearer wrong"),))
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED
            health: health_pb2_grpc.HealthAsyncStub = health_pb2_grpc.HealthStub(bare)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            daemons: daemons_pb2_grpc.DaemonServiceAsyncStub = daemons_pb2_grpc.DaemonServiceStub(bare)
            code, _ = await refused(daemons.ListDaemons(daemons_pb2.ListDaemonsRequest()))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        async with open_channel(scheduler.address, Credentials(token="s3cret")) as good:
            listed = await jobs_pb2_grpc.JobServiceStub(good).ListJobs(jobs_pb2.ListJobsRequest())
            assert list(listed.jobs) == []


async def test_tls_serves_only_clients_that_trust_its_certificate(
    rabbit_nodes: Sequence[Node], tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    secured = dataclasses.replace(
        config(rabbit_nodes, tmp_path / "state"), tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem"
    )
    async with Scheduler(secured) as scheduler:
        async with open_channel(scheduler.address, Credentials(tls_ca=tmp_path / "ca.pem")) as good:
            listed = await jobs_pb2_grpc.JobServiceStub(good).ListJobs(jobs_pb2.ListJobsRequest())
            assert list(listed.jobs) == []
        async with grpc.aio.insecure_channel(scheduler.address) as plain:
            code, _ = await refused(
                jobs_pb2_grpc.JobServiceStub(plain).ListJobs(jobs_pb2.ListJobsRequest(), timeout=3)
            )
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
