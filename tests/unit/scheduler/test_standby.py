"""A standby's faces: health says NOT_SERVING for the truba services, HTTP answers 503 naming
the leader; and a leader past its fence refuses calls as a standby does (LeaderGate)."""

from __future__ import annotations

import aiohttp
import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from truba.follow import from_standby, leader_hint
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.scheduler.server import SERVICES
from truba.scheduler.standby import LeaderGate, StandbyFace


async def test_a_standby_is_not_serving_and_its_http_answers_503_naming_the_leader() -> None:
    face = StandbyFace("127.0.0.1:0", "127.0.0.1:0", leader=lambda: "10.0.0.9:50051", services=SERVICES)
    await face.start()
    try:
        async with grpc.aio.insecure_channel(face.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in SERVICES:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
                assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
            whole = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
            assert whole.status == health_pb2.HealthCheckResponse.SERVING
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{face.http_address}/api/v1/jobs") as response:
                assert response.status == 503
                assert response.headers["X-Truba-Leader"] == "10.0.0.9:50051"
                body = await response.json()
        assert body == {"error": "standby; the leader is at 10.0.0.9:50051", "leader": "10.0.0.9:50051"}
    finally:
        await face.stop()


class Answering(jobs_pb2_grpc.JobServiceServicer):
    async def GetClusterInfo(
        self, request: jobs_pb2.GetClusterInfoRequest, context: object
    ) -> jobs_pb2.ClusterInfo:
        return jobs_pb2.ClusterInfo(daemons=1)


async def test_a_leader_past_its_fence_refuses_calls_naming_the_new_leader() -> None:
    leading = [True]
    server = grpc.aio.server(interceptors=[LeaderGate(lambda: leading[0], lambda: "b:50051")])
    jobs_pb2_grpc.add_JobServiceServicer_to_server(Answering(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            assert (await stub.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=3)).daemons == 1
            leading[0] = False
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=3)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == "standby; the leader is at b:50051"
        assert leader_hint(caught.value) == "b:50051" and from_standby(caught.value)
    finally:
        await server.stop(0)


async def test_a_standby_that_knows_no_leader_is_still_told_from_a_failing_server() -> None:
    face = StandbyFace("127.0.0.1:0", None, leader=lambda: "", services=SERVICES)
    await face.start()
    try:
        async with grpc.aio.insecure_channel(face.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetClusterInfo(jobs_pb2.GetClusterInfoRequest(), timeout=3)
    finally:
        await face.stop()
    with pytest.raises(grpc.aio.AioRpcError) as down:  # the same address, nothing serving it
        async with grpc.aio.insecure_channel(face.address) as channel:
            await jobs_pb2_grpc.JobServiceStub(channel).GetClusterInfo(
                jobs_pb2.GetClusterInfoRequest(), timeout=3
            )
    assert refused.value.details() == "standby; no leader yet"
    assert leader_hint(refused.value) == "" and from_standby(refused.value)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE and not from_standby(down.value)
