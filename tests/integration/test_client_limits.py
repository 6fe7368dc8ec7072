"""Limits of the client: oversized payloads are refused before anything is sent; a blocked
broker makes ``submit`` wait (backpressure), and ``submit(timeout=...)`` gives up cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.client import Client, SubmitTimeout
from truba.pipes.errors import MessageTooLarge

pytestmark = pytest.mark.integration


async def test_an_oversized_payload_is_refused_and_nothing_is_lost(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path / "cluster", rabbit_nodes, daemons=1, slots=1) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal", max_payload=1000) as client:
            job = await client.create_job("tests.handlers.basic:echo")
            small = await job.submit("a")
            with pytest.raises(MessageTooLarge, match="max_payload=1000"):
                await job.submit("x" * 2000)
            assert job.submitted == 1  # the refused one was never in the journal
            last = await job.submit("b")
            await job.close()
            outcomes = {o.task_id: o.value async for o in job.results()}
    assert outcomes == {small: "a", last: "b"}


async def test_a_blocked_broker_makes_submit_wait_and_a_timeout_withdraws_the_task(
    fresh_nodes: object, tmp_path: Path
) -> None:
    (broker,) = fresh_nodes(1)  # type: ignore[operator]
    async with running(tmp_path / "cluster", [broker], daemons=1, slots=1) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal", max_unconfirmed=4) as client:
            job = await client.create_job("tests.handlers.basic:echo")
            first = await job.submit(0)
            await asyncio.to_thread(broker.set_memory_alarm, True)
            taken = [first]
            with pytest.raises(SubmitTimeout):
                for i in range(1, 100):  # the window fills up; then submit waits, up to its timeout
                    taken.append(await job.submit(i, timeout=2.0))
            assert 1 <= len(taken) <= 5, len(taken)
            assert job.submitted == len(taken)  # the timed-out task was withdrawn
            await asyncio.to_thread(broker.set_memory_alarm, False)
            await job.close()
            async with asyncio.timeout(60):
                outcomes = {o.task_id async for o in job.results()}
    assert outcomes == set(taken)
