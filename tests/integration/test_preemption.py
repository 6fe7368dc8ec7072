"""Preemption with real processes: a new important job gets its share while a low-importance job
holds every slot with long tasks, at once (immediate), at the next task boundary (graceful) or
when a graceful job's grace is over, and no outcome is lost or duplicated."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path
from typing import cast

import pytest

from tests.integration.processes import running
from truba.client import Client
from truba.client.options import Preemption

pytestmark = pytest.mark.integration

SLOTS = 4  # 2 daemons x 2 slots
LOW_TASK = 4.0
GRACE = 1.0


@pytest.mark.parametrize(
    ("mode", "grace"),
    [("immediate", None), ("graceful", None), ("graceful", GRACE)],
    ids=["immediate", "graceful", "grace"],
)
async def test_an_important_job_gets_its_share_in_time_and_nothing_is_lost(
    rabbit_nodes: list[object], tmp_path: Path, mode: Preemption, grace: float | None
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            # Given a low-importance job running long tasks on every slot
            low = await client.create_job(
                "tests.handlers.timing:started_at", 1.0, preemption=mode, preemption_grace=grace
            )
            for _ in range(2 * SLOTS):
                await low.submit(LOW_TASK)
            await low.close()
            async with asyncio.timeout(30):
                while (await low.info()).counts.running < SLOTS:
                    await asyncio.sleep(0.1)
            # When a job three times as important arrives (its share: 3 of 4 slots)
            began = time.time()
            high = await client.create_job("tests.handlers.timing:started_at", 3.0)
            for _ in range(6):  # a backlog: a runner may hold one task per broker it is not running yet
                await high.submit(1.5)
            await high.close()
            starts = sorted([cast(float, o.result()) async for o in high.results()])
            low_outcomes = collections.Counter([o.task_id async for o in low.results()])
        # Then it runs on its three slots within the bound
        waited = [s - began for s in starts[:3]]
        print(f"{mode} {grace}: high job's tasks started after {', '.join(f'{w:.2f}' for w in waited)} s")
        bound = 1.0 if mode == "immediate" else (grace or LOW_TASK) + 1.0
        assert max(waited) <= bound
        # And the low job still has exactly one outcome per task
        assert len(low_outcomes) == 2 * SLOTS and set(low_outcomes.values()) == {1}
