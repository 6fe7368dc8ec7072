"""Submit-and-wait and groups on a real cluster: many concurrent calls each get their own
result; a group of 1,000 tasks with failures inside completes with exactly its outcomes and
fires once; a group's callback fires once across a client killed and resumed."""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path
from typing import Any

import pytest

import truba
from tests.integration.processes import running
from truba.client import Client, Outcome, TaskFailed
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("group_client_proc.py")


async def test_a_thousand_concurrent_calls_on_one_job_each_get_their_own_result(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:square", name="calls")
            async with asyncio.timeout(180):
                values = await asyncio.gather(*(job.call(n, timeout=150) for n in range(1000)))
                with pytest.raises(TaskFailed, match="negative one"):
                    await job.call(-1, timeout=60)
            assert values == [n * n for n in range(1000)]
            await job.close()
            assert [o async for o in job.results()] == []  # every outcome went to its call
            assert job.done and job.received == 1001


async def test_a_group_of_a_thousand_tasks_with_failures_completes_with_every_outcome_and_fires_once(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:behave", name="group")
            group = job.group()
            fired: list[list[Outcome[Any]]] = []
            group.on_done(fired.append)
            ids = [await group.submit(["raise", n] if n % 10 == 0 else ["ok", n]) for n in range(1000)]
            await group.close()
            outcomes = await group.wait(timeout=180)
            await job.close()
            assert [o async for o in job.results()] == []
            await asyncio.sleep(0.1)
    assert [o.task_id for o in outcomes] == ids  # exactly one per task, in submission order
    assert sum(not o.ok for o in outcomes) == 100
    assert [o.value for o in outcomes if o.ok] == [n for n in range(1000) if n % 10]
    assert len(fired) == 1 and len(fired[0]) == 1000


async def test_a_group_callback_fires_once_across_a_client_killed_and_resumed(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), cluster.address, str(journal), stdout=asyncio.subprocess.PIPE
        )
        assert child.stdout is not None
        said: list[str] = []
        job_id = ""
        async with asyncio.timeout(120):
            while "half big" not in said:
                line = (await child.stdout.readline()).decode().strip()
                assert line, f"the client exited early (rc {await child.wait()}): {said}"
                said.append(line)
                if line.startswith("job "):
                    job_id = line.removeprefix("job ")
        child.kill()
        await child.wait()
        said += (await child.stdout.read()).decode().split("\n")
        assert "fired small" in said and "fired big" not in said

        async with Client(cluster.address, journal=journal) as client:
            job = await client.resume(job_id)
            assert sorted(g.name for g in job.groups()) == ["big", "small"]
            fired: collections.Counter[str] = collections.Counter()
            job.group("small").on_done(lambda outcomes: fired.update(["small"]))
            big = job.group("big")
            big.on_done(lambda outcomes: fired.update(["big"]))
            outcomes = await big.wait(timeout=120)
            await job.close()
            assert [o async for o in job.results()] == []
            await asyncio.sleep(0.1)
    assert len(outcomes) == 200 and len({o.task_id for o in outcomes}) == 200
    assert sum(not o.ok for o in outcomes) == 20
    assert fired == {"big": 1}  # small fired before the kill: never again
    assert not (journal / job_id).exists()


async def test_an_open_job_with_every_outcome_in_is_drained_in_watch_and_on_drained(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:square", name="drained")
            drained = asyncio.Event()
            job.on_drained(drained.set)
            job.on_result(lambda outcome: None)
            events = job.watch()

            async def first_drained() -> int:
                async for event in events:
                    if event.kind == jobs_pb2.JOB_EVENT_KIND_DRAINED:
                        return event.job.counts.submitted
                raise AssertionError("the watch ended without a drained event")

            watching = asyncio.create_task(first_drained())
            for n in range(20):
                await job.submit(n)
            async with asyncio.timeout(60):
                await drained.wait()
                assert await watching == 20
            await events.aclose()
            await job.close()
            await asyncio.wait_for(job.wait(), 60)


async def test_the_blocking_job_calls_too(rabbit_nodes: list[object], tmp_path: Path) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=2) as cluster:

        def use() -> tuple[list[int], bool]:
            with truba.connect(cluster.address, journal=tmp_path / "journal") as client:
                job = client.create_job("tests.handlers.basic:square", name="blocking-calls")
                values = [job.call(n, timeout=60) for n in range(5)]
                job.close()  # every outcome went to a call: the job finishes here
                return values, job.done

        assert await asyncio.wait_for(asyncio.to_thread(use), 120) == ([0, 1, 4, 9, 16], True)
