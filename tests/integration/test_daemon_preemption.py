"""Taking slots away from a real daemon: immediate preemption, draining on SIGTERM or on request."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.integration.test_daemon_harness import JobQueues, dump_logs, eventually, job_slots, scripted
from truba.pipes import base
from truba.wire import TaskMessage

pytestmark = pytest.mark.integration
ONCE = "tests.handlers.faults:sleep_once"
CAN_CANCEL = hasattr(base.Listener, "cancel")


def expect_unspent(attempts: dict[str, int], logs: str = "") -> None:
    """Every task handed back by a daemon that let go of it has spent nothing (attempts == 1).

    Exact only when the task listener can stop consuming before the daemon puts tasks back
    (``Listener.cancel()``, see truba.daemon.returns): without it, what the
    listener held comes back marked redelivered and counts one attempt. Then this xfails, with
    every other property of the test already checked.
    """
    spent = {task_id: n for task_id, n in attempts.items() if n != 1}
    if not spent:
        return
    if not CAN_CANCEL:
        pytest.xfail(f"counted {spent}: exact hand-back needs Listener.cancel() in truba.pipes")
    raise AssertionError(f"attempts spent by tasks that were only handed back: {spent}\n{logs}")


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


@pytest.fixture
async def make_job(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., object]]:
    made: list[JobQueues] = []

    async def make(urls: list[str], name: str = "") -> JobQueues:
        queues = JobQueues(f"{name}{request.node.name[:32]}-{secrets.token_hex(3)}", urls)
        await queues.declare()
        made.append(queues)
        return queues

    try:
        yield make
    finally:
        for queues in made:
            await queues.delete()


async def test_immediate_preemption_interrupts_requeues_unspent_and_starts_the_new_job_within_a_second(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    old: JobQueues = await make_job(urls, "old-")  # type: ignore[misc]
    new: JobQueues = await make_job(urls, "new-")  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        start_daemon("d-preempt", 1)
        await eventually(lambda: scheduler.connected("d-preempt"), what="daemon connected")
        old_job = job_slots(old, ONCE, 1, immediate=True)
        scheduler.assign("d-preempt", old_job)
        await old.submit(TaskMessage("long", [str(tmp_path / "long"), 60, 0.05]))
        await eventually(lambda: scheduler.busy("d-preempt", old.job_id) == 1, what="long task running")
        await new.submit(TaskMessage("first", [str(tmp_path / "first"), 0, 0]))
        await asyncio.sleep(0.3)
        reassigned = scheduler.assign("d-preempt", job_slots(new, ONCE, 1))
        await new.collect(["first"], timeout=10)
        delay = new.outcome("first").value["began"] - reassigned  # type: ignore[index]
        logs = dump_logs(tmp_path)
        assert delay < 1.0, f"the new job's first task started {delay:.2f} s after the reassignment\n{logs}"
        # The old job's consumers are gone and its task is back in its queue, not spent.
        await eventually(lambda: old.consumers() == 0 and old.counts()[old.tasks] == 1, what="requeued")
        assert old.received == {}
        # The old job comes back: the task runs once more (quickly now) and gets exactly one result.
        scheduler.assign("d-preempt", old_job)
        await old.collect(["long"], timeout=10, linger=0.5)
        outcome = old.outcome("long")
        assert outcome.ok and outcome.value["slept"] == 0.05, outcome  # type: ignore[index]
        assert len(old.received["long"]) == 1 and old.duplicates() == 0  # its result, once
        assert '"daemon.task.preempted"' in logs
        expect_unspent({"long": outcome.attempts}, logs)


async def test_sigterm_drains_finishes_the_running_task_and_exits_0(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job(urls)  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        draining = start_daemon("d-drain", 1)
        await eventually(lambda: scheduler.connected("d-drain"), what="daemon connected")
        scheduler.assign("d-drain", job_slots(job, ONCE, 1))
        running = TaskMessage("running", [str(tmp_path / "running"), 1.5, 1.5])
        await job.submit(running)
        await eventually(lambda: scheduler.busy("d-drain", job.job_id) == 1, what="task running")
        queued = [TaskMessage(f"q{i}", [str(tmp_path / f"q{i}"), 0, 0]) for i in range(6)]
        await job.submit(*queued)  # the daemon holds some of these (prefetch), runs none
        began = time.monotonic()
        draining.signal(signal.SIGTERM)
        await eventually(lambda: scheduler.beats["d-drain"].draining, timeout=2, what="draining heartbeat")
        code = await draining.wait(timeout=10)
        logs = dump_logs(tmp_path)
        assert code == 0 and time.monotonic() - began < 4, logs
        await job.collect(["running"], timeout=5)
        assert job.outcome("running").ok and job.outcome("running").attempts == 1
        # All back, none run (the queue holds them in frames: its message count says less).
        assert job.counts()[job.tasks] >= 1, logs
        assert not any(t.task_id in job.received for t in queued), logs
        heir = "d-heir"
        start_daemon(heir, 1)
        await eventually(lambda: scheduler.connected(heir), what="heir connected")
        scheduler.assign(heir, job_slots(job, ONCE, 1))
        await job.collect([t.task_id for t in queued], timeout=10)
        assert all(job.outcome(t.task_id).ok and job.outcome(t.task_id).daemon_id == heir for t in queued)
        # What the drained daemon held but never started went back unspent.
        expect_unspent({t.task_id: job.outcome(t.task_id).attempts for t in queued}, logs)


async def test_a_second_sigterm_stops_at_once_and_the_task_goes_back_unspent(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job(urls)  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-stop", 1)
        await eventually(lambda: scheduler.connected("d-stop"), what="daemon connected")
        scheduler.assign("d-stop", job_slots(job, ONCE, 1))
        await job.submit(TaskMessage("long", [str(tmp_path / "long"), 60, 0.05]))
        await eventually(lambda: scheduler.busy("d-stop", job.job_id) == 1, what="task running")
        daemon.signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert daemon.alive()  # draining: waits for the 60 s task
        began = time.monotonic()
        daemon.signal(signal.SIGTERM)
        code = await daemon.wait(timeout=10)
        assert code == 0 and time.monotonic() - began < 3, dump_logs(tmp_path)
        start_daemon("d-next", 1)
        await eventually(lambda: scheduler.connected("d-next"), what="next connected")
        scheduler.assign("d-next", job_slots(job, ONCE, 1))
        await job.collect(["long"], timeout=10, linger=0.3)
        outcome = job.outcome("long")
        assert outcome.ok and outcome.daemon_id == "d-next", outcome
        assert job.duplicates() == 0
        expect_unspent({"long": outcome.attempts}, dump_logs(tmp_path))


async def test_the_schedulers_drain_makes_an_idle_daemon_exit_at_once(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job(urls)  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-idle", 2)
        await eventually(lambda: scheduler.connected("d-idle"), what="daemon connected")
        scheduler.assign("d-idle", job_slots(job, "tests.handlers.basic:echo", 2))
        await job.submit(TaskMessage("t", 1))
        await job.collect(["t"], timeout=10)
        began = time.monotonic()
        scheduler.drain("d-idle")
        code = await daemon.wait(timeout=10)
        assert code == 0 and time.monotonic() - began < 2.0, dump_logs(tmp_path)
        assert '"daemon.draining"' in daemon.log() and '"daemon.stopped"' in daemon.log()
