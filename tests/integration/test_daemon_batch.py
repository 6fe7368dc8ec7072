"""Batch handlers with real processes: a scheduler, a daemon with two slots, the session's brokers."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.client import Client

pytestmark = pytest.mark.integration


async def test_batches_give_one_correct_outcome_per_task_and_a_raising_batch_an_error_each(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=1, slots=2) as cluster:
        # (checked inside: a failure prints the cluster's logs)
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.batching:double_all")
            ids = {await job.submit(i): i for i in range(500)}
            await job.close()
            async with asyncio.timeout(60):
                outcomes = [o async for o in job.results()]
            seen = collections.Counter(o.task_id for o in outcomes)
            assert len(outcomes) == 500 and set(seen) == set(ids) and set(seen.values()) == {1}
            assert all(o.ok and o.value[0] == 2 * ids[o.task_id] for o in outcomes)  # type: ignore[index]
            sizes = collections.Counter(o.value[1] for o in outcomes)  # type: ignore[index]
            print(f"batch sizes seen (size: tasks): {dict(sorted(sizes.items()))}")
            assert max(sizes) > 1 and max(sizes) <= 16

            failing = await client.create_job("tests.handlers.batching:fail_all")
            failing_ids = {await failing.submit(i) for i in range(20)}
            await failing.close()
            async with asyncio.timeout(60):
                failed = [o async for o in failing.results()]
            assert {o.task_id for o in failed} == failing_ids and len(failed) == 20
            assert all(not o.ok and o.error is not None and o.error.type == "RuntimeError" for o in failed)
            unexpected = [
                (o.task_id, o.gave_up, o.attempts, o.error) for o in failed if o.gave_up or o.attempts != 1
            ]
            assert not unexpected, f"{failing.id}: {unexpected}"
