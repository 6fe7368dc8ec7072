"""The running list against a real cluster: a job's long tasks on four slots of two daemons are
listed exactly (task, daemon, slot, attempt, since when) by ``job.running()`` and by
``truba job ID --running --json``, and the list empties once they ended."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.processes import running
from truba.client import Client, RunningTasks
from truba.client.job import Job

pytestmark = pytest.mark.integration

SECONDS = 5.0
"""How long each task sleeps: long enough to be seen running by the SDK and the CLI in turn."""


def truba(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``truba ARGS`` as a user runs it, the scheduler named by ``$TRUBA_SCHEDULER``."""
    env = {**os.environ, "TRUBA_SCHEDULER": address}
    return subprocess.run(
        [sys.executable, "-m", "truba", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def listed_when(job: Job, wanted: set[str], among: set[str], timeout: float) -> RunningTasks:
    """The job's running list once its task ids are ``wanted`` (heartbeats bring them); until
    then, every list holds only tasks ``among`` those submitted."""
    async with asyncio.timeout(timeout):
        while True:
            listed = await job.running()
            if {task.task_id for task in listed} == wanted:
                return listed
            assert {task.task_id for task in listed} <= among, listed
            await asyncio.sleep(0.1)


async def test_the_tasks_running_now_are_listed_with_their_daemon_slot_and_start_then_the_list_empties(
    rabbit_nodes: list[object], tmp_path: Path
) -> None:
    async with running(tmp_path, rabbit_nodes, daemons=2, slots=2) as cluster:
        async with Client(cluster.address, journal=tmp_path / "journal") as client:
            # Given a job of four long tasks on a cluster of two daemons with two slots each
            job = await client.create_job("tests.handlers.basic:sleep", 1.0)
            began = time.time()
            ids = {await job.submit(SECONDS) for _ in range(4)}
            await job.close()
            # When they all run, its running list holds exactly them, one per slot
            listed = await listed_when(job, ids, ids, timeout=SECONDS)
            seen = time.time()
            assert {(task.daemon_id, task.slot) for task in listed} == {
                (d, s) for d in ("d0", "d1") for s in (0, 1)
            }
            assert all(task.attempt == 1 for task in listed), listed
            assert all(began - 1 <= task.started_at.timestamp() <= seen for task in listed)
            assert all(0 <= task.for_seconds < SECONDS for task in listed)
            starts = [task.started_at for task in listed]
            assert starts == sorted(starts) and listed.left_out == 0
            # And the CLI's --json says the same
            shown = await asyncio.to_thread(truba, cluster.address, "job", job.id, "--running", "--json")
            assert shown.returncode == 0, shown.stderr
            answer = json.loads(shown.stdout)
            assert answer["job_id"] == job.id and answer["left_out"] == 0
            by_cli = {(t["task_id"], t["daemon_id"], t["slot"], t["attempt"]) for t in answer["running"]}
            assert by_cli == {(t.task_id, t.daemon_id, t.slot, t.attempt) for t in listed}
            # Then, once every outcome is in, nothing runs any more
            assert sorted([o.ok async for o in job.results()]) == [True] * 4
            await listed_when(job, set(), ids, timeout=5)
            assert (await client.job(job.id).running()).tasks == ()
        table = await asyncio.to_thread(truba, cluster.address, "job", job.id, "--running")
        assert table.returncode == 0 and table.stdout == f"job {job.id}: nothing running\n", table.stderr
        missing = await asyncio.to_thread(truba, cluster.address, "job", "nope", "--running")
        assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "NOT_FOUND" in missing.stderr
