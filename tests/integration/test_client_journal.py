"""The client's journal end to end: crashes of the client and of brokers lose no task and
deliver every outcome once; callbacks that raise lose nothing; ``map`` is ordered and bounded.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from tests.integration.processes import running
from truba.client import CallbackFailed, Client, Outcome
from truba.pipes.rabbit import RabbitConnection

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("journal_client_proc.py")


async def test_a_client_killed_mid_submit_and_resumed_gets_every_outcome_once(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    count, kill_after = 5000, 2000
    journal = tmp_path / "journal"
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), cluster.address, str(journal), str(count),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None
        job_id, said = "", -1
        async with asyncio.timeout(120):
            while said < kill_after:
                line = (await child.stdout.readline()).decode()
                assert line, f"the client exited early (rc {await child.wait()})"
                kind, _, value = line.strip().partition(" ")
                if kind == "job":
                    job_id = value
                elif kind == "submitted":
                    said = int(value)
        child.kill()
        await child.wait()
        for line in (await child.stdout.read()).decode().splitlines():  # said before it died
            kind, _, value = line.partition(" ")
            if kind == "submitted":
                said = int(value)

        async with Client(cluster.address, journal=journal) as client:
            job = await client.resume(job_id)
            # Every task whose submit returned is in; the one under way at the kill may be too.
            assert said + 1 <= job.submitted <= said + 2
            for i in range(job.submitted, count):
                await job.submit(i)
            await job.close()
            values: collections.Counter[int] = collections.Counter()
            try:
                async with asyncio.timeout(90):
                    async for outcome in job.results():
                        values[cast(int, outcome.value)] += 1
            except TimeoutError:
                info = await client.get_job_info(job_id)
                missing = sorted(set(range(count)) - set(values))
                stalled = f"stalled: {job.outstanding} outstanding, missing {missing[:20]}; {info}"
                raise AssertionError(stalled) from None
            assert job.received == count
    assert sorted(values) == list(range(count)), "lost outcomes"
    assert max(values.values()) == 1, f"duplicate outcomes: {[v for v, n in values.items() if n > 1][:10]}"
    assert not (journal / job_id).exists()  # the finished job's journal is gone


async def test_one_of_two_brokers_killed_mid_job_and_restarted_gives_every_outcome_once(
    fresh_nodes: object, tmp_path: Path
) -> None:
    brokers = fresh_nodes(2)  # type: ignore[operator]
    async with running(tmp_path / "cluster", brokers, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:sleep", name="broker-kill")
            ids = {await job.submit(0.002): i for i in range(2000)}
            await job.close()
            seen: collections.Counter[str] = collections.Counter()
            async for outcome in job.results():
                assert outcome.ok, outcome.error
                seen[outcome.task_id] += 1
                if sum(seen.values()) == 500:
                    brokers[0].kill()
                    await asyncio.to_thread(brokers[0].restart)
    assert set(seen) == set(ids) and max(seen.values()) == 1


async def test_a_wiped_broker_is_declared_lost_and_the_tasks_it_held_complete(
    fresh_nodes: object, tmp_path: Path
) -> None:
    brokers = fresh_nodes(2)  # type: ignore[operator]
    async with running(tmp_path / "cluster", brokers, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:sleep", name="broker-wipe")
            ids = {await job.submit(0.1): i for i in range(400)}
            await job.close()
            # Messages, not tasks: most carry a frame of tasks (up to 8 before the first outcome),
            # and the daemons already hold some; at least one must be lost with the broker.
            held = await ready(brokers[0].url, f"truba.job.{job.id}.tasks")
            assert held >= 1, f"no task message on the broker to wipe: {held}"
            brokers[0].kill()
            shutil.rmtree(brokers[0].base_dir / "mnesia")  # its disk is gone for good
            await asyncio.to_thread(brokers[0].restart)
            seen: collections.Counter[str] = collections.Counter()
            async with asyncio.timeout(120):
                async for outcome in job.results():
                    assert outcome.ok, outcome.error
                    seen[outcome.task_id] += 1
            assert job._submission.watch.losses >= 1
    assert set(seen) == set(ids), f"{len(set(ids) - set(seen))} tasks never completed"
    assert max(seen.values()) == 1


async def ready(url: str, queue: str) -> int:
    connection = await RabbitConnection.open(url, name="test-admin")
    try:
        return await connection.message_count(queue) or 0
    finally:
        await connection.close()


async def test_an_on_result_callback_that_raises_does_not_lose_its_outcome(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:echo")
            for i in range(20):
                await job.submit(i)
            await job.close()
            taken: list[object] = []

            def fussy(outcome: Outcome) -> None:
                if outcome.value == 7:
                    raise RuntimeError("the application choked on 7")
                taken.append(outcome.value)

            job.on_result(fussy)
            with pytest.raises(CallbackFailed) as failed:
                await asyncio.wait_for(job.wait(), 60)
            assert isinstance(failed.value.__cause__, RuntimeError)
            assert 7 not in taken
            job.on_result(lambda outcome: taken.append(outcome.value))
            await asyncio.wait_for(job.wait(), 60)
    assert sorted(cast(list[int], taken)) == list(range(20))  # 7 came again; nothing twice


async def test_map_over_10000_items_is_ordered_and_keeps_a_bounded_window(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    window = 500
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:echo")
            values: list[object] = []
            widest = 0
            began = time.perf_counter()
            async for outcome in job.map(range(10_000), window=window, progress=False):
                values.append(outcome.value)
                # Memory is what is submitted and not yet yielded: tasks in the journal and
                # outcomes waiting for their turn.
                widest = max(widest, job.submitted - len(values), job.outstanding)
            seconds = time.perf_counter() - began
    print(f"map of 10000: {seconds:.1f} s, widest window {widest}")
    assert values == list(range(10_000))
    assert widest <= window
