"""The scheduler's HTTP face without brokers: metrics, the JSON API, the token, the CLI default."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.scheduler import Scheduler, SchedulerConfig
from truba.scheduler.cli import http_address
from truba.scheduler.plan_observer import observe_revocations as _observe_revocations
from truba.scheduler.planner import JobSpec

NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"


def config(state_dir: Path, *, token: str | None = None) -> SchedulerConfig:
    return SchedulerConfig(
        brokers=[NO_BROKER], state_dir=state_dir, listen="127.0.0.1:0", http="127.0.0.1:0", token=token
    )


async def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.text()


async def test_metrics_json_api_and_health_are_served(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path)) as scheduler:
        base = f"http://{scheduler.http_address}"
        assert await get(f"{base}/healthz") == (200, "ok\n")
        status, text = await get(f"{base}/metrics")
        assert status == 200
        assert "truba_scheduler_daemons 0.0" in text
        assert "# TYPE truba_scheduler_plan_duration_seconds histogram" in text
        assert await get(f"{base}/api/v1/jobs") == (200, '{"jobs": []}')
        assert await get(f"{base}/api/v1/daemons") == (200, '{"daemons": []}')
        status, text = await get(f"{base}/api/v1/jobs/nope")
        assert status == 404 and "nope" in text
        status, text = await get(f"{base}/api/v1/jobs/no-such")
        assert status == 400 and "job_id" in text
        assert await get(f"{base}/api/v1/schedules") == (200, '{"schedules": []}')
        status, text = await get(f"{base}/api/v1/schedules/nope/runs")
        assert status == 404 and "nope" in text


async def test_the_dashboard_and_its_files_are_served_open_even_with_a_token(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path, token="s3cret")) as scheduler:
        base = f"http://{scheduler.http_address}"
        status, page = await get(f"{base}/")
        assert status == 200 and 'src="static/dashboard.js"' in page
        status, script = await get(f"{base}/static/dashboard.js")
        assert status == 200 and "api/v1/jobs" in script
        assert (await get(f"{base}/static/nothing.js"))[0] == 404
        assert (await get(f"{base}/static/..%2Fhttp_api.py"))[0] == 404
        # the data behind it is not open
        assert (await get(f"{base}/api/v1/history"))[0] == 401
        assert await get(f"{base}/api/v1/history", token="s3cret") == (200, "{}")


async def test_grpc_calls_are_counted_by_method_and_code(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path)) as scheduler:
        async with grpc.aio.insecure_channel(scheduler.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            await stub.ListJobs(jobs_pb2.ListJobsRequest())
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetJob(jobs_pb2.GetJobRequest(job_id="nope"))
        # An abort reaches the client before the servicer's frame unwinds (and counts): poll.
        expected = (
            'truba_scheduler_grpc_calls_total{code="OK",method="ListJobs"} 1.0',
            'truba_scheduler_grpc_calls_total{code="NOT_FOUND",method="GetJob"} 1.0',
        )
        for _ in range(50):
            _, text = await get(f"http://{scheduler.http_address}/metrics")
            if all(line in text for line in expected):
                break
            await asyncio.sleep(0.05)
    for line in expected:
        assert line in text


async def test_with_a_token_only_health_is_open(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path, token="s3cret")) as scheduler:
        base = f"http://{scheduler.http_address}"
        assert (await get(f"{base}/metrics"))[0] == 401
        assert (await get(f"{base}/api/v1/jobs", token="wrong"))[0] == 401
        assert (await get(f"{base}/metrics", token="s3cret"))[0] == 200
        assert (await get(f"{base}/healthz"))[0] == 200


async def test_a_taken_http_port_fails_start_naming_it(tmp_path: Path) -> None:
    async with Scheduler(config(tmp_path / "a")) as first:
        taken = SchedulerConfig(
            brokers=[NO_BROKER], state_dir=tmp_path / "b", listen="127.0.0.1:0", http=first.http_address
        )
        with pytest.raises(RuntimeError, match=f"cannot serve http on {first.http_address}"):
            await Scheduler(taken).start()


async def test_promtool_accepts_the_metrics(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/bootstrap installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    async with Scheduler(config(tmp_path)) as scheduler:
        _, text = await get(f"http://{scheduler.http_address}/metrics")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_http_address_defaults_to_the_next_port_of_listen() -> None:
    assert http_address(None, "127.0.0.1:50051") == "127.0.0.1:50052"
    assert http_address(None, "0.0.0.0:0") == "0.0.0.0:0"
    assert http_address("off", "127.0.0.1:50051") is None
    assert http_address("10.0.0.1:9000", "127.0.0.1:50051") == "10.0.0.1:9000"


class Revocations:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, bool]] = []

    def planned(self, seconds: float, live_jobs: Sequence[str]) -> None:
        pass

    def revoked(self, job_id: str, slots: int, *, preempted: bool) -> None:
        self.seen.append((job_id, slots, preempted))

    def pushed(self) -> None:
        pass


def spec(job_id: str, demand: int | None) -> JobSpec:
    return JobSpec(id=job_id, handler="m:f", importance=1.0, created_at=0.0, demand=demand)


def test_slots_taken_from_a_job_with_work_are_preemptions_and_without_are_releases() -> None:
    before = {"d1": {"busy": 3, "idle": 2}, "d2": {"busy": 1}}
    after = {"d1": {"busy": 1, "new": 4}, "d2": {"busy": 1}}
    observer = Revocations()
    _observe_revocations(observer, before, after, [spec("busy", 10), spec("idle", 0), spec("new", None)])
    assert sorted(observer.seen) == [("busy", 2, True), ("idle", 2, False)]
