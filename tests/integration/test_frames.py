"""Frames end to end on a real daemon: each task of a frame gets its own outcome."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_daemon_harness import JobQueues, dump_logs, eventually, job_slots, scripted
from truba.wire import TaskMessage

pytestmark = pytest.mark.integration
HANDLER = "tests.handlers.basic:behave"


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


@pytest.fixture
async def one_broker_job(urls: list[str], request: pytest.FixtureRequest) -> AsyncIterator[JobQueues]:
    # One broker only: what is submitted together is then packed into one frame, not spread.
    queues = JobQueues(f"{request.node.name[:40]}-{secrets.token_hex(3)}", urls[:1], frame=64)
    await queues.declare()
    try:
        yield queues
    finally:
        await queues.delete()


async def test_a_frame_of_successes_errors_and_a_timeout_gives_each_task_its_own_outcome(
    urls: list[str], one_broker_job: JobQueues, tmp_path: Path
) -> None:
    job = one_broker_job
    framed = [
        TaskMessage("ok-1", ["ok", 1]),
        TaskMessage("error-1", ["raise", "no good"]),
        TaskMessage("ok-2", ["ok", {"two": 2}]),
        TaskMessage("slow", ["sleep", 30]),
        TaskMessage("ok-3", ["ok", "three"]),
        TaskMessage("error-2", ["raise", "bad too"]),
    ]
    tasks = [TaskMessage("alone", ["ok", 0]), *framed]
    await job.submit(*tasks)  # the first goes alone; the others, sent while it is in flight, in one frame
    assert job.counts()[job.tasks] == 2
    async with scripted(urls[:1], tmp_path) as (scheduler, start_daemon):  # the daemon on that broker too
        start_daemon("d-frames", 2)
        await eventually(lambda: scheduler.connected("d-frames"), what="daemon connected")
        scheduler.assign("d-frames", job_slots(job, HANDLER, 2, task_timeout=0.5, max_attempts=1))
        await job.collect([t.task_id for t in tasks], timeout=20, linger=0.3)
        logs = dump_logs(tmp_path)
    outcomes = {t.task_id: job.outcome(t.task_id) for t in tasks}
    for task_id, value in (("alone", 0), ("ok-1", 1), ("ok-2", {"two": 2}), ("ok-3", "three")):
        outcome = outcomes[task_id]
        assert outcome.ok and outcome.value == value and outcome.attempts == 1, (outcome, logs)
    for task_id, message in (("error-1", "no good"), ("error-2", "bad too")):
        outcome = outcomes[task_id]
        assert not outcome.ok and not outcome.gave_up and outcome.attempts == 1, outcome
        assert outcome.error is not None and outcome.error.type == "ValueError"
        assert outcome.error.message == message
    slow = outcomes["slow"]
    assert slow.gave_up and not slow.ok and slow.attempts == 1, slow
    assert slow.error is not None and slow.error.type == "TaskTimeout"
    assert job.duplicates() == 0
    assert job.counts() == {job.tasks: 0, job.results: 0, job.dead: 1}  # the frame was acked
