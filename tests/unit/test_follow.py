"""Clients and the CLI given several scheduler addresses follow the leader: past a dead address,
to where a standby (the real StandbyFace) says the leader is; all dead: a typed error in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from truba.channel import open_blocking_channel, scheduler_target
from truba.client import Client
from truba.client.errors import Unavailable
from truba.follow import scheduler_addresses
from truba.local import free_port
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.scheduler.standby import StandbyFace


def test_addresses_split_on_commas_keep_order_and_drop_repeats() -> None:
    assert scheduler_addresses(" a:1, b:2,,a:1 ") == ["a:1", "b:2"]
    assert scheduler_addresses("ipv4:1.2.3.4:5,6.7.8.9:5") == ["ipv4:1.2.3.4:5,6.7.8.9:5"]
    assert scheduler_target("a, b:7") == "a:50051,b:7"
    with pytest.raises(ValueError, match="no address"):
        scheduler_addresses(" , ")


class Leader(jobs_pb2_grpc.JobServiceServicer):
    async def GetClusterInfo(
        self, request: jobs_pb2.GetClusterInfoRequest, context: object
    ) -> jobs_pb2.ClusterInfo:
        return jobs_pb2.ClusterInfo(daemons=3)


async def _cluster() -> AsyncIterator[tuple[str, str]]:
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(Leader(), server)  # type: ignore[abstract]
    leader = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    standby = StandbyFace("127.0.0.1:0", None, leader=lambda: leader, services=())
    await standby.start()
    try:
        yield leader, standby.address
    finally:
        await standby.stop()
        await server.stop(0)


async def test_a_client_follows_the_leader_a_standby_names_past_a_dead_address() -> None:
    async for leader, standby in _cluster():
        async with Client(f"127.0.0.1:{free_port()},{standby}", journal=False, unavailable_after=5) as client:
            assert (await client.cluster_info()).daemons == 3
            assert client._channel is not None
            assert client._channel.current == leader  # type: ignore[attr-defined]
            assert client._electing()  # a standby answered: the client's retries wait briefly


async def test_the_command_line_channel_follows_the_leader_too() -> None:
    async for _, standby in _cluster():
        addresses = f"{standby},127.0.0.1:{free_port()}"

        def ask(addresses: str = addresses) -> int:
            with open_blocking_channel(addresses) as channel:
                stub = jobs_pb2_grpc.JobServiceStub(channel)
                return stub.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=3).daemons

        assert await asyncio.to_thread(ask) == 3


async def test_a_standby_alone_answers_unavailable_naming_the_leader() -> None:
    standby = StandbyFace("127.0.0.1:0", None, leader=lambda: "10.0.0.9:50051", services=())
    await standby.start()
    try:
        async with grpc.aio.insecure_channel(standby.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await jobs_pb2_grpc.JobServiceStub(channel).GetClusterInfo(
                    jobs_pb2.GetClusterInfoRequest(), timeout=3
                )
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == "standby; the leader is at 10.0.0.9:50051"
    finally:
        await standby.stop()


async def test_no_scheduler_reachable_is_a_typed_error_within_the_patience() -> None:
    dead = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    started = time.monotonic()
    async with Client(dead, journal=False, unavailable_after=1.0) as client:
        with pytest.raises(Unavailable, match="did not answer within 1 s"):
            await client.cluster_info()
        assert not client._electing()  # dead addresses are no election: the backoff grows
    assert time.monotonic() - started < 3.0
