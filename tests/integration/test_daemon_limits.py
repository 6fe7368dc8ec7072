"""A real daemon's limits over real brokers: task timeouts and give-ups, memory recycling, garbage.

The scheduler is scripted (it sends the job settings the test needs); the daemon is a real
``python -m truba.daemon`` process; the client's side is truba's own pipe stacks.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from tests.integration.test_daemon_harness import JobQueues, dump_logs, eventually, job_slots, scripted
from truba.wire import ErrorInfo, GaveUpCodec, GaveUpRecord, TaskCodec, TaskMessage

pytestmark = pytest.mark.integration


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


@pytest.fixture
async def job(urls: list[str], request: pytest.FixtureRequest) -> AsyncIterator[JobQueues]:
    queues = JobQueues(f"{request.node.name[:40]}-{secrets.token_hex(3)}", urls)
    await queues.declare()
    try:
        yield queues
    finally:
        await queues.delete()


async def test_a_task_past_its_timeout_is_killed_on_time_retried_then_given_up(
    urls: list[str], job: JobQueues, tmp_path: Path
) -> None:
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-timeout", 2)
        await eventually(lambda: scheduler.connected("d-timeout"), what="daemon connected")
        scheduler.assign(
            "d-timeout",
            job_slots(job, "tests.handlers.faults:sleep_once", 2, task_timeout=0.5, max_attempts=2),
        )
        marker = tmp_path / "slow-once"
        tasks = [
            TaskMessage("quick", [str(tmp_path / "quick"), 0.05, 0.05]),
            TaskMessage("slow-once", [str(marker), 30, 0.05]),  # times out once, then quick
            TaskMessage("always-slow", [str(tmp_path / "nope"), 30, 30]),  # times out twice: gives up
        ]
        began = time.monotonic()
        await job.submit(*tasks)
        await job.collect([t.task_id for t in tasks], timeout=15, linger=0.3)
        took = time.monotonic() - began
        logs = dump_logs(tmp_path)
        quick, retried, gave_up = (job.outcome(t.task_id) for t in tasks)
        assert quick.ok and quick.attempts == 1, logs
        assert retried.ok and retried.attempts == 2 and retried.value["slept"] == 0.05  # type: ignore[index]
        assert gave_up.gave_up and not gave_up.ok and gave_up.attempts == 2, gave_up
        assert gave_up.error is not None and gave_up.error.type == "TaskTimeout"
        assert took < 5, f"two 0.5 s timeouts took {took:.1f} s in all"
        assert job.duplicates() == 0
        # The given-up task is kept in the dead-letter queue with its last error.
        await eventually(lambda: job.counts()[job.dead] == 1, what="dead record")
        [record] = job.take_dead()
        decoded = GaveUpCodec().decode(GaveUpCodec().encode(_record(record)))
        assert decoded.task_id == "always-slow" and decoded.attempts == 2
        assert decoded.error.type == "TaskTimeout"
        assert TaskCodec().decode(decoded.body).task_id == "always-slow"
        assert job.counts() == {job.tasks: 0, job.results: 0, job.dead: 0}
        log = daemon.log()
        assert log.count('"daemon.task.timed_out"') == 3 and '"daemon.task.gave_up"' in log


def _record(fields: dict[str, object]) -> GaveUpRecord:
    error = fields["error"]
    assert isinstance(error, list)
    return GaveUpRecord(
        str(fields["task_id"]),
        int(cast(int, fields["attempts"])),
        ErrorInfo(*error),
        str(fields["daemon_id"]),
        cast(bytes, fields["body"]),
    )


async def test_a_leaking_handler_is_recycled_before_its_hard_limit_and_the_job_completes(
    urls: list[str], job: JobQueues, tmp_path: Path
) -> None:
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-leak", 1, "--slot-memory-soft", "100", "--slot-memory-hard", "220")
        await eventually(lambda: scheduler.connected("d-leak"), what="daemon connected")
        scheduler.assign("d-leak", job_slots(job, "tests.handlers.faults:leak", 1))
        tasks = [TaskMessage(f"t{i}", 40) for i in range(12)]
        await job.submit(*tasks)
        await job.collect([t.task_id for t in tasks], timeout=30)
        outcomes = [job.outcome(t.task_id) for t in tasks]
        log = daemon.log()
        assert all(o.ok and o.attempts == 1 for o in outcomes), dump_logs(tmp_path)
        # Kept memory grows 40 MiB per task and starts over when the slot is replaced: never
        # past the soft limit by more than one task, so the hard limit is never reached.
        kept = [cast(int, o.value) for o in outcomes]
        assert max(kept) <= 160 and kept.count(40) >= 3, kept
        assert log.count('"daemon.slot.recycled"') >= 3 and '"memory"' in log
        assert "daemon.task.out_of_memory" not in log


async def test_a_task_over_the_hard_memory_limit_is_killed_and_given_up(
    urls: list[str], job: JobQueues, tmp_path: Path
) -> None:
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        start_daemon("d-hog", 1, "--slot-memory-hard", "150")
        await eventually(lambda: scheduler.connected("d-hog"), what="daemon connected")
        scheduler.assign("d-hog", job_slots(job, "tests.handlers.faults:hog", 1, max_attempts=2))
        await job.submit(TaskMessage("hog", [400, 30]), TaskMessage("fits", [20, 0]))
        await job.collect(["hog", "fits"], timeout=15)
        hog = job.outcome("hog")
        assert hog.gave_up and hog.attempts == 2, dump_logs(tmp_path)
        assert hog.error is not None and hog.error.type == "MemoryLimitExceeded"
        assert job.outcome("fits").value == 20


async def test_garbage_in_a_task_queue_is_dead_lettered_and_the_daemon_keeps_serving(
    urls: list[str], job: JobQueues, tmp_path: Path
) -> None:
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-garbage", 1)
        await eventually(lambda: scheduler.connected("d-garbage"), what="daemon connected")
        scheduler.assign("d-garbage", job_slots(job, "tests.handlers.basic:echo", 1))
        garbage = [b"\xc1\xc1 not msgpack", b'{"json": "is not a truba task"}', b"\x94\x01\xa1t\xc0\xa1x"]
        job.publish_raw(*garbage)
        await job.submit(TaskMessage("after", "still serving"))
        await job.collect(["after"], timeout=15)
        assert job.outcome("after").value == "still serving"
        await eventually(lambda: job.counts()[job.dead] == 3, what="3 poison records")
        records = job.take_dead()
        assert sorted(r["body"] for r in records) == sorted(garbage)  # type: ignore[type-var]
        assert all(r["kind"] == "poison" and str(r["error"]).startswith("task:") for r in records), records
        assert daemon.alive() and '"pipe.poison"' in daemon.log()
