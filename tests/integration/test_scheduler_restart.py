"""kill -9 of the scheduler in the middle of two running jobs: both complete, every outcome once.

The data plane does not need the scheduler: daemons keep running what they were assigned and
reconnect with what they run; clients keep taking results and report progress again once it is
back. The restarted scheduler reads its jobs from the store and reconciles.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from tests.integration.processes import ANY_HTTP, running
from truba.client import Client
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

TASKS = 400


async def test_a_scheduler_killed_mid_jobs_and_restarted_loses_and_duplicates_nothing(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    seen: dict[str, collections.Counter[str]] = {}
    async with running(tmp_path, rabbit_nodes, daemons=2, slots=2) as cluster:
        scheduler = cluster.local.processes[0]
        address = cluster.address
        async with Client(address, journal=tmp_path / "journal") as client:
            jobs = [
                await client.create_job("tests.handlers.basic:sleep", importance=1.0),
                await client.create_job("tests.handlers.basic:sleep", importance=2.0),
            ]
            for job in jobs:
                seen[job.id] = collections.Counter()
                for _ in range(TASKS):
                    await job.submit(0.005)
                await job.close()
            halfway = asyncio.Event()

            async def consume(job_index: int) -> None:
                job = jobs[job_index]
                async for outcome in job.results():
                    assert outcome.ok, outcome.error
                    seen[job.id][outcome.task_id] += 1
                    if job_index == 0 and sum(seen[job.id].values()) >= TASKS // 4:
                        halfway.set()

            consumers = [asyncio.create_task(consume(i)) for i in range(2)]
            await asyncio.wait_for(halfway.wait(), 60)
            scheduler.kill()
            await asyncio.sleep(1.0)
            await asyncio.to_thread(cluster.local.start_scheduler, cluster.broker_urls, address, *ANY_HTTP)
            assert cluster.address == address
            await asyncio.wait_for(asyncio.gather(*consumers), 120)
            for job in jobs:
                info = await client.get_job_info(job.id)
                assert info.state == jobs_pb2.JOB_STATE_FINISHED
    for job_id, counter in seen.items():
        assert len(counter) == TASKS, f"job {job_id}: {len(counter)} outcomes of {TASKS}"
        assert set(counter.values()) == {1}, f"job {job_id}: an outcome was delivered twice"
