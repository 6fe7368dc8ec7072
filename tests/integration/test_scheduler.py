"""The scheduler in-process on a free port, against two real RabbitMQ nodes.

Each test gets its own scheduler and state directory; the nodes (fixture ``rabbit_nodes`` from
conftest.py) are shared by the session, so tests look only at their own jobs' queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from truba.scheduler import Scheduler, SchedulerConfig

pytestmark = pytest.mark.integration

HANDLER = "examples.math:square"
HEARTBEAT = 0.5


class Node(Protocol):
    """What these tests need of a RabbitMQ node (truba.local.node.LocalRabbitNode)."""

    @property
    def url(self) -> str: ...

    def list_queues(self, vhost: str = "/") -> dict[str, int]: ...


def queue_names(job: jobs_pb2.Job) -> set[str]:
    return {job.queues.tasks, job.queues.results, job.queues.dead}


async def queues_on(nodes: Sequence[Node]) -> list[set[str]]:
    """The queue names on each node (rabbitmqctl is slow: run it off the event loop)."""
    return [set(await asyncio.to_thread(node.list_queues)) for node in nodes]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.2)


def config(nodes: Sequence[Node], state_dir: Path, *extra_brokers: str) -> SchedulerConfig:
    return SchedulerConfig(
        brokers=[node.url for node in nodes] + list(extra_brokers),
        state_dir=state_dir,
        listen="127.0.0.1:0",
        heartbeat_interval=HEARTBEAT,
        broker_timeout=5.0,
    )


@pytest.fixture
async def scheduler(rabbit_nodes: Sequence[Node], tmp_path: Path) -> AsyncIterator[Scheduler]:
    server = Scheduler(config(rabbit_nodes, tmp_path / "state"))
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


async def create(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, handler: str = HANDLER, importance: float = 1.0
) -> jobs_pb2.CreateJobResponse:
    return await jobs.CreateJob(jobs_pb2.CreateJobRequest(handler=handler, importance=importance, name="t"))


async def refused(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


class FakeDaemon:
    """A daemon's side of the Connect stream, driven by the test."""

    def __init__(self, channel: grpc.aio.Channel, daemon_id: str, slots: int, allow: Sequence[str]) -> None:
        self.hello = daemons_pb2.Hello(daemon_id=daemon_id, hostname="test", pid=1, slots=slots, allow=allow)
        self._outgoing: asyncio.Queue[daemons_pb2.DaemonMessage | None] = asyncio.Queue()
        self.version = 0
        stub: daemons_pb2_grpc.DaemonServiceAsyncStub = daemons_pb2_grpc.DaemonServiceStub(channel)
        self.call = stub.Connect(self._requests())

    async def _requests(self) -> AsyncIterator[daemons_pb2.DaemonMessage]:
        yield daemons_pb2.DaemonMessage(hello=self.hello)
        while (message := await self._outgoing.get()) is not None:
            yield message

    async def receive(self, timeout: float = 10.0) -> daemons_pb2.SchedulerMessage:
        message = await asyncio.wait_for(self.call.read(), timeout)
        assert isinstance(message, daemons_pb2.SchedulerMessage), message
        return message

    async def assignment(self) -> dict[str, int]:
        message = await self.receive()
        assert message.HasField("assignment"), message
        self.version = message.assignment.version
        return {entry.job_id: entry.slots for entry in message.assignment.jobs}

    def heartbeat(self) -> None:
        self.send_heartbeat()

    def send_heartbeat(self, *, stats: Sequence[daemons_pb2.JobStats] = (), draining: bool = False) -> None:
        heartbeat = daemons_pb2.Heartbeat(applied_version=self.version, stats=stats, draining=draining)
        self._outgoing.put_nowait(daemons_pb2.DaemonMessage(heartbeat=heartbeat))

    def end(self) -> None:
        self._outgoing.put_nowait(None)

    @contextlib.asynccontextmanager
    async def beating(
        self, stats: Sequence[daemons_pb2.JobStats] = (), every: float = 0.2
    ) -> AsyncIterator[None]:
        """Keeps the daemon alive while the block runs, however slow the machine: a heartbeat
        every ``every`` seconds (creating a job declares queues on every broker; under load a
        test outlived three heartbeat intervals with none sent and the scheduler dropped it)."""

        async def beat() -> None:
            while True:
                self.send_heartbeat(stats=stats)
                await asyncio.sleep(every)

        beating = asyncio.create_task(beat())
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating


async def test_create_declares_three_queues_on_every_broker_and_finish_deletes_all_but_the_dead_letters(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, rabbit_nodes: Sequence[Node]
) -> None:
    response = await create(jobs)
    job = response.job
    assert [(b.name, b.url) for b in response.brokers] == [
        ("b0", rabbit_nodes[0].url),
        ("b1", rabbit_nodes[1].url),
    ]
    assert (job.state, job.handler, job.importance, job.name) == (jobs_pb2.JOB_STATE_OPEN, HANDLER, 1.0, "t")
    assert job.queues.tasks == f"truba.job.{job.id}.tasks"
    for names in await queues_on(rabbit_nodes):
        assert queue_names(job) <= names
    closed = await jobs.CloseJob(jobs_pb2.CloseJobRequest(job_id=job.id, submitted=3))
    assert (closed.state, closed.submitted) == (jobs_pb2.JOB_STATE_CLOSED, 3)
    finished = await jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=job.id))
    assert finished.state == jobs_pb2.JOB_STATE_FINISHED and finished.finished_at >= finished.closed_at > 0
    for names in await queues_on(rabbit_nodes):  # the dead letters are kept (--keep-dead)
        assert queue_names(job) & names == {job.queues.dead}
    listed = await jobs.ListJobs(jobs_pb2.ListJobsRequest())
    assert job.id not in {j.id for j in listed.jobs}
    listed = await jobs.ListJobs(jobs_pb2.ListJobsRequest(include_done=True))
    assert job.id in {j.id for j in listed.jobs}


async def test_cancel_deletes_the_queues_but_the_dead_letters_from_every_broker(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, rabbit_nodes: Sequence[Node]
) -> None:
    job = (await create(jobs)).job
    cancelled = await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    assert cancelled.state == jobs_pb2.JOB_STATE_CANCELLED
    for names in await queues_on(rabbit_nodes):
        assert queue_names(job) & names == {job.queues.dead}
    code, details = await refused(jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=job.id)))
    assert (
        code == grpc.StatusCode.FAILED_PRECONDITION
        and details == f"job {job.id!r} is cancelled: it cannot be finished"
    )
    code, _ = await refused(jobs.CloseJob(jobs_pb2.CloseJobRequest(job_id=job.id, submitted=1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("handler", "importance", "details"),
    [
        ("x", 1.0, "handler: must look like 'package.module:function', got 'x'"),
        ("", 1.0, "handler: required"),
        (HANDLER, -1.0, "importance: must be a finite number > 0, got -1"),
        (HANDLER, 0.0, "importance: required: a finite number > 0 (got 0 or none)"),
        (HANDLER, math.nan, "importance: must be a finite number > 0, got nan"),
        (HANDLER, math.inf, "importance: must be a finite number > 0, got inf"),
    ],
)
async def test_bad_create_requests_are_invalid_arguments_naming_the_field(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, handler: str, importance: float, details: str
) -> None:
    assert await refused(create(jobs, handler, importance)) == (grpc.StatusCode.INVALID_ARGUMENT, details)


async def test_job_ids_are_required_and_unknown_ones_are_not_found(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub,
) -> None:
    calls: list[Callable[[str], Awaitable[object]]] = [
        lambda job_id: jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id)),
        lambda job_id: jobs.CloseJob(jobs_pb2.CloseJobRequest(job_id=job_id, submitted=1)),
        lambda job_id: jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=job_id)),
        lambda job_id: jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job_id)),
    ]
    for call in calls:
        assert await refused(call("")) == (grpc.StatusCode.INVALID_ARGUMENT, "job_id: required")
        assert await refused(call("xyz")) == (grpc.StatusCode.NOT_FOUND, "job 'xyz' not found")


async def test_health_answers_serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "truba.v1.JobService", "truba.v1.DaemonService"):
        response = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_daemon_is_welcomed_and_gets_its_share_as_jobs_come_and_go(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub, rabbit_nodes: Sequence[Node]
) -> None:
    # Given a daemon with 4 slots that allows examples.*
    daemon = FakeDaemon(channel, "node-a", 4, ["examples.*"])
    welcome = await daemon.receive()
    assert welcome.HasField("welcome")
    assert [b.url for b in welcome.welcome.brokers] == [n.url for n in rabbit_nodes]
    assert welcome.welcome.heartbeat_interval == HEARTBEAT
    assert await daemon.assignment() == {}
    info = await jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())
    assert (info.daemons, info.slots, len(info.brokers)) == (1, 4, 2)
    # When a job is created, the daemon gets all its slots for it at once
    first = (await create(jobs)).job
    assert await daemon.assignment() == {first.id: 4}
    version = daemon.version
    # And a second job splits them, with a newer version
    second = (await create(jobs, "examples.other:f", 2.0)).job
    assert await daemon.assignment() == {first.id: 2, second.id: 2}
    assert daemon.version > version
    got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=first.id))
    assert got.assigned_slots == 2 and got.problem == ""
    # A handler the daemon does not allow is refused while it is connected
    code, details = await refused(create(jobs, "other.mod:f"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        details
        == "handler 'other.mod:f' is not allowed by any connected daemon (their --allow patterns: examples.*)"
    )
    # Cancelling a job gives its slots back
    await jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=second.id))
    assert await daemon.assignment() == {first.id: 4}
    # When the daemon ends its stream, it is forgotten and the job has a problem
    daemon.end()
    assert await daemon.call.code() == grpc.StatusCode.OK

    async def forgotten() -> bool:
        info = await jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())
        return info.daemons == 0

    await eventually(forgotten)

    async def replanned() -> bool:  # daemons leaving are planned for together, a moment later
        got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=first.id))
        return got.assigned_slots == 0 and got.problem == "no daemon is connected"

    await eventually(replanned, timeout=2.0)
    await jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=first.id))


async def test_a_daemon_that_stops_heartbeating_is_dropped(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    daemon = FakeDaemon(channel, "node-b", 2, ["*"])
    await daemon.receive()
    await daemon.assignment()
    # Heartbeats keep it connected well past 3 intervals
    for _ in range(8):
        daemon.heartbeat()
        await asyncio.sleep(HEARTBEAT / 2)
    info = await jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())
    assert info.daemons == 1
    # The scheduler counts what it read and sent (load measurements divide CPU by them)
    assert info.heartbeats >= 7 and info.assignments >= 1
    # Silence ends its stream with UNAVAILABLE
    started = time.monotonic()
    assert await asyncio.wait_for(daemon.call.code(), 10) == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 3 * HEARTBEAT + 2
    assert (await jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())).daemons == 0


async def test_a_second_connect_with_the_same_id_replaces_the_first(
    channel: grpc.aio.Channel, jobs: jobs_pb2_grpc.JobServiceAsyncStub
) -> None:
    old = FakeDaemon(channel, "node-c", 2, ["*"])
    await old.receive()
    await old.assignment()
    new = FakeDaemon(channel, "node-c", 6, ["*"])
    await new.receive()
    await new.assignment()
    assert await asyncio.wait_for(old.call.code(), 10) == grpc.StatusCode.ABORTED
    info = await jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())
    assert (info.daemons, info.slots) == (1, 6)
    new.end()


async def test_a_stream_without_hello_is_refused(channel: grpc.aio.Channel) -> None:
    stub: daemons_pb2_grpc.DaemonServiceAsyncStub = daemons_pb2_grpc.DaemonServiceStub(channel)

    async def heartbeat_first() -> AsyncIterator[daemons_pb2.DaemonMessage]:
        yield daemons_pb2.DaemonMessage(heartbeat=daemons_pb2.Heartbeat())

    call = stub.Connect(heartbeat_first())
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await call.details()).startswith("hello: required as the first message")


async def test_jobs_survive_a_scheduler_restart_on_the_same_state_dir(
    rabbit_nodes: Sequence[Node], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    async with Scheduler(config(rabbit_nodes, state)) as first:
        async with grpc.aio.insecure_channel(first.address) as channel:
            stub: jobs_pb2_grpc.JobServiceAsyncStub = jobs_pb2_grpc.JobServiceStub(channel)
            open_job = (await create(stub)).job
            closed_job = (await create(stub, importance=3.0)).job
            await stub.CloseJob(jobs_pb2.CloseJobRequest(job_id=closed_job.id, submitted=5))
            done_job = (await create(stub)).job
            await stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=done_job.id))
        # A second scheduler cannot take the same state directory while the first runs
        with pytest.raises(RuntimeError, match="in use by another scheduler"):
            await Scheduler(config(rabbit_nodes, state)).start()
    async with Scheduler(config(rabbit_nodes, state)) as second:
        async with grpc.aio.insecure_channel(second.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            got = await stub.GetJob(jobs_pb2.GetJobRequest(job_id=closed_job.id))
            assert (got.state, got.submitted, got.importance) == (jobs_pb2.JOB_STATE_CLOSED, 5, 3.0)
            listed = await stub.ListJobs(jobs_pb2.ListJobsRequest())
            assert [j.id for j in listed.jobs] == [open_job.id, closed_job.id]
            everything = await stub.ListJobs(jobs_pb2.ListJobsRequest(include_done=True))
            assert [j.state for j in everything.jobs][-1] == jobs_pb2.JOB_STATE_CANCELLED
            for names in await queues_on(rabbit_nodes):
                assert queue_names(open_job) | queue_names(closed_job) <= names
            for job in (open_job, closed_job):
                await stub.FinishJob(jobs_pb2.FinishJobRequest(job_id=job.id))


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_down_broker_fails_create_with_unavailable_and_leaves_no_job(
    rabbit_nodes: Sequence[Node], tmp_path: Path
) -> None:
    port = dead_port()
    down = f"amqp://guest:guest@127.0.0.1:{port}/"
    before = await queues_on(rabbit_nodes)
    async with Scheduler(config(rabbit_nodes, tmp_path / "state", down)) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub: jobs_pb2_grpc.JobServiceAsyncStub = jobs_pb2_grpc.JobServiceStub(channel)
            code, details = await refused(create(stub))
            assert code == grpc.StatusCode.UNAVAILABLE
            assert details.startswith(
                f"broker b2 (amqp://guest@127.0.0.1:{port}/) is unavailable: ConnectionLost"
            )
            assert list((await stub.ListJobs(jobs_pb2.ListJobsRequest(include_done=True))).jobs) == []

            # The queues it declared on the live brokers are deleted again
            async def cleaned() -> bool:
                after = await queues_on(rabbit_nodes)
                return all(not now - then for now, then in zip(after, before, strict=True))

            await eventually(cleaned)


def test_the_cli_prints_its_address_and_stops_cleanly_on_sigterm(
    rabbit_nodes: Sequence[Node], tmp_path: Path
) -> None:
    script = (
        "import argparse, sys\n"
        "from truba.scheduler import cli\n"
        "parser = argparse.ArgumentParser(prog='truba')\n"
        "cli.register(parser.add_subparsers(dest='command', required=True))\n"
        "args = parser.parse_args(sys.argv[1:])\n"
        "sys.exit(args.func(args))\n"
    )
    argv = [
        sys.executable,
        "-c",
        script,
        "scheduler",
        "--listen",
        "127.0.0.1:0",
        "--state",
        str(tmp_path / "s"),
    ]
    for node in rabbit_nodes:
        argv += ["--broker", node.url]
    with (tmp_path / "stderr.log").open("w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("truba scheduler listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
