"""Cancelling a job: the queues go, and every task without an outcome gets a cancelled one."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from tests.integration.processes import queues_of, running
from truba.client import Client, TaskCancelled
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration

TASKS = 40


async def test_cancel_gives_every_pending_task_a_cancelled_outcome(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=1, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            job = await client.create_job("tests.handlers.basic:sleep")
            for _ in range(TASKS):
                await job.submit(0.2)
            await job.close()
            outcomes: collections.Counter[str] = collections.Counter()
            cancelled = []
            async for outcome in job.results():
                outcomes[outcome.task_id] += 1
                if outcome.cancelled:
                    cancelled.append(outcome)
                elif sum(outcomes.values()) == 3:
                    await job.cancel()
            info = await client.get_job_info(job.id)
        assert len(outcomes) == TASKS and set(outcomes.values()) == {1}
        assert len(cancelled) >= TASKS // 2  # most never ran
        with pytest.raises(TaskCancelled, match="cancelled with its job"):
            cancelled[0].result()
        assert info.state == jobs_pb2.JOB_STATE_CANCELLED
        # Deleted at once but for the dead-letter queue, kept for --keep-dead; a daemon that took
        # the new assignment late may declare one again, which the scheduler's sweep removes.
        async with asyncio.timeout(10):
            while [
                q for q in await asyncio.to_thread(queues_of, job.id, rabbit_nodes) if not q.endswith(".dead")
            ]:
                await asyncio.sleep(0.5)
        assert not (tmp_path / "journal" / job.id).exists()
