"""A fork-server template killed -9 while its slots run tasks (issue 18, an open case: "slots do
not survive a kill of their fork template").

Bounded, not fixed: the slots die with their template by design (``PR_SET_PDEATHSIG``, so that
nothing outlives a daemon killed -9), and each task they were running ends without a reply. The
daemon sees them die as any slot death: each of those tasks spends one attempt and is put back,
a new template is started for the next slots, and every task has exactly one outcome with its
value. What this test pins: the cost is one attempt per task the template's slots were running,
and nothing else (no task lost, none given up, the other tasks untouched).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from pathlib import Path

import pytest

from tests.chaos import procs
from tests.integration.test_daemon_harness import JobQueues, dump_logs, eventually, job_slots, scripted
from truba.wire import TaskMessage

pytestmark = pytest.mark.integration
HANDLER = "tests.handlers.faults:count_runs"


async def test_a_template_killed_under_running_tasks_costs_each_one_attempt_and_loses_none(
    rabbit_nodes: list[object], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    urls = [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]
    job = JobQueues(f"{request.node.name[:36]}-{secrets.token_hex(3)}", urls)
    await job.declare()
    try:
        runs = tmp_path / "runs"
        runs.mkdir()
        # Two long tasks (running when the template dies), then four short ones.
        tasks = [TaskMessage(f"long{i}", [str(runs / f"long{i}"), 3.0]) for i in range(2)]
        tasks += [TaskMessage(f"short{i}", [str(runs / f"short{i}"), 0.05]) for i in range(4)]
        async with scripted(urls, tmp_path) as (scheduler, start_daemon):
            daemon = start_daemon("d-template", 2)
            await eventually(lambda: scheduler.connected("d-template"), what="daemon connected")
            scheduler.assign("d-template", job_slots(job, HANDLER, 2, max_attempts=3))
            await job.submit(*tasks[:2])
            await eventually(lambda: all((runs / f"long{i}").exists() for i in range(2)), what="both running")
            [template] = procs.templates(daemon.pid)
            os.kill(template, signal.SIGKILL)
            await job.submit(*tasks[2:])
            await job.collect([t.task_id for t in tasks], timeout=60)
            logs = dump_logs(tmp_path)
            for task in tasks:
                outcome = job.outcome(task.task_id)
                assert outcome.ok and outcome.value == task.payload[1], (task.task_id, outcome, logs)  # type: ignore[index]
                ran = len((runs / task.task_id).read_text().split())
                died = task.task_id.startswith("long")
                assert outcome.attempts == (2 if died else 1), (task.task_id, outcome.attempts, logs)
                assert ran == (2 if died else 1), (task.task_id, ran, logs)
                assert not outcome.gave_up
            await asyncio.sleep(0.5)
            assert procs.templates(daemon.pid) not in ([], [template]), logs
            assert '"daemon.forkserver.template_died"' in daemon.log() and daemon.alive()
    finally:
        await job.delete()
