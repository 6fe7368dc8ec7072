"""The daemon's link among several schedulers: it follows the leader a standby names, moves on
from a dead address, ignores assignments of an older epoch and leaves a stale leader.

The standby is the real :class:`~truba.scheduler.standby.StandbyFace`; the leader is a scripted
DaemonService on a real gRPC server (the link speaks gRPC, so the test does too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import cast

import grpc
import grpc.aio
import pytest

from truba.backoff import Backoff
from truba.daemon.control import SchedulerLink
from truba.local import free_port
from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc
from truba.scheduler.standby import StandbyFace


class ScriptedLeader(daemons_pb2_grpc.DaemonServiceServicer):
    """Welcomes with ``epoch``, then sends the scripted (epoch, version) assignments."""

    def __init__(self, epoch: int, assignments: Sequence[tuple[int, int]]) -> None:
        self.epoch = epoch
        self.assignments = assignments
        self.hellos = 0

    async def Connect(
        self, request_iterator: AsyncIterator[daemons_pb2.DaemonMessage], context: object
    ) -> AsyncIterator[daemons_pb2.SchedulerMessage]:
        await anext(request_iterator)
        self.hellos += 1
        yield daemons_pb2.SchedulerMessage(
            welcome=daemons_pb2.Welcome(heartbeat_interval=0.2, epoch=self.epoch)
        )
        for epoch, version in self.assignments:
            yield daemons_pb2.SchedulerMessage(
                assignment=daemons_pb2.Assignment(epoch=epoch, version=version)
            )
        async for _ in request_iterator:  # heartbeats, until the daemon goes
            pass


class Recorder:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def hello(self) -> daemons_pb2.Hello:
        return daemons_pb2.Hello(daemon_id="d", slots=1)

    def heartbeat(self) -> daemons_pb2.Heartbeat:
        return daemons_pb2.Heartbeat()

    def welcome(self, welcome: daemons_pb2.Welcome) -> None:
        pass

    def assign(self, assignment: daemons_pb2.Assignment) -> None:
        self.versions.append(assignment.version)

    def drain(self, reason: str = "scheduler") -> None:
        pass


@pytest.fixture
def servers() -> Iterator[list[grpc.aio.Server]]:
    started: list[grpc.aio.Server] = []
    yield started


async def _leader(servicer: ScriptedLeader, servers: list[grpc.aio.Server]) -> str:
    server = grpc.aio.server()
    daemons_pb2_grpc.add_DaemonServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servers.append(server)
    return f"127.0.0.1:{port}"


async def _run(link: SchedulerLink, until: object, timeout: float = 5.0) -> None:
    assert callable(until)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        async with asyncio.timeout(timeout):
            while not until():
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_the_link_goes_where_a_standby_says_the_leader_is(servers: list[grpc.aio.Server]) -> None:
    leader = ScriptedLeader(3, [(3, 1)])  # type: ignore[abstract]
    there = await _leader(leader, servers)
    standby = StandbyFace("127.0.0.1:0", None, leader=lambda: there, services=())
    await standby.start()
    try:
        daemon = Recorder()
        # Given only the standby's address (and a dead one): the standby's answer leads there
        link = SchedulerLink(f"127.0.0.1:{free_port()},{standby.address}", daemon)
        await _run(link, lambda: daemon.versions == [1])
        assert link.address == there and link.epoch == 3 and link.applied_epoch == 3
    finally:
        await standby.stop()
        for server in servers:
            await server.stop(0)


async def test_assignments_of_an_older_epoch_are_ignored_and_counted(servers: list[grpc.aio.Server]) -> None:
    leader = ScriptedLeader(5, [(5, 1), (4, 2), (5, 3), (0, 4)])  # type: ignore[abstract]
    address = await _leader(leader, servers)
    daemon = Recorder()
    link = SchedulerLink(address, daemon)
    try:
        await _run(link, lambda: len(daemon.versions) == 3)
        assert daemon.versions == [1, 3, 4], "epoch 4 came after 5: a former leader's"
        assert link.stale_assignments == 1 and link.epoch == 5
    finally:
        for server in servers:
            await server.stop(0)


async def test_a_scheduler_welcoming_with_an_older_epoch_is_left_for_the_next(
    servers: list[grpc.aio.Server],
) -> None:
    stale = ScriptedLeader(4, [(4, 1)])  # type: ignore[abstract]
    current = ScriptedLeader(9, [(9, 2)])  # type: ignore[abstract]
    first = await _leader(stale, servers)
    second = await _leader(current, servers)
    daemon = Recorder()
    link = SchedulerLink(f"{first},{second}", daemon)
    link.epoch = 9  # it saw epoch 9 before
    try:
        await _run(link, lambda: daemon.versions == [2])
        assert stale.hellos >= 1 and link.address == second
    finally:
        for server in servers:
            await server.stop(0)


class BreakingLeader(ScriptedLeader):
    """Welcomes, then breaks the stream with UNAVAILABLE after the first heartbeat."""

    async def Connect(
        self, request_iterator: AsyncIterator[daemons_pb2.DaemonMessage], context: object
    ) -> AsyncIterator[daemons_pb2.SchedulerMessage]:
        await anext(request_iterator)
        self.hellos += 1
        yield daemons_pb2.SchedulerMessage(welcome=daemons_pb2.Welcome(heartbeat_interval=0.05, epoch=1))
        await anext(request_iterator)
        await cast(grpc.aio.ServicerContext[object, object], context).abort(
            grpc.StatusCode.UNAVAILABLE, "stream broken by the test"
        )


def _grpc_request_pollers() -> list[asyncio.Task[object]]:
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and "_consume_request_iterator" in repr(task.get_coro())
    ]


async def test_a_broken_stream_leaves_no_request_task_behind(servers: list[grpc.aio.Server]) -> None:
    leader = BreakingLeader(1, [])  # type: ignore[abstract]
    address = await _leader(leader, servers)
    link = SchedulerLink(address, Recorder())
    try:
        # Given three sessions that the scheduler broke (the link reconnects after each)
        await _run(link, lambda: leader.hellos >= 3, timeout=15)
        await asyncio.sleep(0.1)
        # Then gRPC's task feeding each session's requests ended with it
        assert _grpc_request_pollers() == []
    finally:
        for server in servers:
            await server.stop(0)


async def test_a_leader_taking_over_is_reached_at_once_though_its_port_was_closed_for_a_while(
    servers: list[grpc.aio.Server],
) -> None:
    # Given a standby that names the dead leader, with the longest backoff the policy allows
    port = free_port()
    dead = f"127.0.0.1:{free_port()}"
    standby = StandbyFace(f"127.0.0.1:{port}", None, leader=lambda: dead, services=())
    await standby.start()
    longest = Backoff(attempts=None, base=0.2, cap=10.0, rng=lambda low, high: high)
    link = SchedulerLink(f"{dead},{standby.address}", Recorder(), backoff=longest)
    stop = asyncio.Event()
    running = asyncio.create_task(link.run(stop))
    leader = ScriptedLeader(2, [(2, 1)])  # type: ignore[abstract]
    try:
        await asyncio.sleep(0.5)
        assert link.electing
        # When the standby closes its port and serves as the leader 1.5 s later (it loaded the
        # store meanwhile), every address refusing in between
        await standby.stop()
        await asyncio.sleep(1.5)
        server = grpc.aio.server()
        daemons_pb2_grpc.add_DaemonServiceServicer_to_server(leader, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
        serving = asyncio.get_running_loop().time()
        # Then the link reaches it within a standby retry, not a grown backoff (1.6 s by then)
        await asyncio.wait_for(link.connected.wait(), 5)
        took = asyncio.get_running_loop().time() - serving
        assert took < 0.9, f"welcomed {took:.2f} s after the leader served"
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
        for server in servers:
            await server.stop(0)
