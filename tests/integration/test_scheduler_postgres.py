"""A scheduler on PostgreSQL, killed with -9 mid-job and restarted on the same database.

A periodic schedule created before the kill fires on after the restart (it is in PostgreSQL).

The scheduler's state directory is wiped between the two runs, so everything the restarted
scheduler knows comes from PostgreSQL: the job, its settings and counters, and the stale-queue
ledger. The data plane does not need the scheduler, so the job completes with every outcome
once, and a new job can be created afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import ALLOW, ANY_HTTP
from tests.postgres import LocalPostgres
from truba.client import Client, Schedule, ScheduleRun
from truba.client.errors import Unavailable
from truba.local.cluster import LocalCluster
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

TASKS = 200


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    server = LocalPostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


async def test_a_scheduler_on_postgresql_killed_and_restarted_keeps_its_job_and_loses_nothing(
    rabbit_nodes: list[object], tmp_path: Path, postgres: LocalPostgres
) -> None:
    url = postgres.create_database()
    brokers = [b.url for b in rabbit_nodes]  # type: ignore[attr-defined]
    local = LocalCluster(tmp_path)
    seen: collections.Counter[str] = collections.Counter()

    def start_scheduler(listen: str) -> None:
        local.start_scheduler(brokers, listen, "--heartbeat-interval", "0.5", "--store", url, *ANY_HTTP)

    try:
        await asyncio.to_thread(start_scheduler, "127.0.0.1:0")
        scheduler = local.processes[0]
        address = local.address
        for i in range(2):
            local.start_daemon(f"d{i}", 2, ALLOW)
        await asyncio.to_thread(local.wait_for_daemons, 2)
        async with Client(address, journal=tmp_path / "journal") as client:
            schedule = await client.create_schedule("tests.handlers.basic:square", every=0.5, payload=3)
            job = await client.create_job("tests.handlers.basic:sleep", importance=1.0)
            for _ in range(TASKS):
                await job.submit(0.005)
            await job.close()
            halfway = asyncio.Event()

            async def consume() -> None:
                async for outcome in job.results():
                    assert outcome.ok, outcome.error
                    seen[outcome.task_id] += 1
                    if sum(seen.values()) >= TASKS // 4:
                        halfway.set()

            consumer = asyncio.create_task(consume())
            await asyncio.wait_for(halfway.wait(), 60)
            fired = (await schedule.refresh()).runs
            # When the scheduler dies with -9 and comes back with an empty state directory
            scheduler.kill()
            shutil.rmtree(tmp_path / "scheduler")
            await asyncio.to_thread(start_scheduler, address)
            restarted = time.time()
            assert local.address == address
            # Then it knows the job from PostgreSQL (once the client's channel is back), and the
            # job completes
            info = await _job_info_once_back(client, job.id)
            assert info.state in (jobs_pb2.JOB_STATE_CLOSED, jobs_pb2.JOB_STATE_FINISHED)
            await asyncio.wait_for(consumer, 120)
            info = await client.get_job_info(job.id)
            assert info.state == jobs_pb2.JOB_STATE_FINISHED
            # And new jobs can be created on the restarted scheduler
            second = await client.create_job("tests.handlers.basic:sleep", importance=1.0)
            await second.submit(0.001)
            await second.close()
            async with asyncio.timeout(60):  # its own bound: a hang fails here, with the logs
                outcomes = [outcome async for outcome in second.results()]
            assert [o.ok for o in outcomes] == [True]
            # And the schedule, kept in PostgreSQL, fires on. Not at once: a run under way at the
            # kill keeps its lease until its deadline and grace, then a second more to read its
            # outcome (docs/scheduler.md, Restarts), and runs of one schedule never overlap. A run
            # whose send the kill cut may be lost, so only runs due after the restart are judged.
            (kept,) = await client.schedules()
            assert kept.id == schedule.id
            ended = await _eventually_ended_runs(kept, due_after=restarted, count=3)
            assert {run.outcome for run in ended} == {"ok"}, ended
            assert (await kept.refresh()).runs > fired
    except BaseException:
        print("\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in local.processes))
        raise
    finally:
        await asyncio.to_thread(local.stop)
    assert len(seen) == TASKS, f"{len(seen)} outcomes of {TASKS}"
    assert set(seen.values()) == {1}, "an outcome was delivered twice"


async def _eventually_ended_runs(
    schedule: Schedule, *, due_after: float, count: int, timeout: float = 10.0
) -> list[ScheduleRun]:
    """The schedule's ended runs due after ``due_after``, once there are ``count`` (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        ended = [r for r in await schedule.runs() if r.due > due_after and r.outcome != "running"]
        if len(ended) >= count:
            return ended
        assert time.monotonic() < deadline, f"{len(ended)} runs ended after the restart, not {count}"
        await asyncio.sleep(0.1)


async def _job_info_once_back(client: Client, job_id: str, timeout: float = 30.0) -> jobs_pb2.Job:
    """The job's info, retrying UNAVAILABLE while the channel reconnects (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.get_job_info(job_id)
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
