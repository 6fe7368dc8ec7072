"""Process faults under a real daemon over real brokers: every task still gets exactly one outcome.

kill -9 of a slot mid-task, kill -9 of the whole daemon mid-task (another daemon takes over), and
SIGSTOP of the daemon until the broker drops its connection, then SIGCONT. The client's side
deduplicates by task id like truba's client: "exactly one outcome" means every task has a first
result and that first result is the right one; duplicates of execution are counted and bounded.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.integration.test_daemon_harness import FRAME, JobQueues, dump_logs, eventually, job_slots, scripted
from truba.pipes.frame import FrameLimits
from truba.pipes.stacks import send_stack
from truba.wire import TaskCodec, TaskMessage

pytestmark = pytest.mark.integration
HANDLER = "tests.handlers.faults:sleep_in_file"


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


@pytest.fixture
async def make_job(urls: list[str], request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., object]]:
    made: list[JobQueues] = []

    async def make(kind: str = "quorum") -> JobQueues:
        queues = JobQueues(f"{request.node.name[:36]}-{secrets.token_hex(3)}", urls, kind)
        await queues.declare()
        made.append(queues)
        return queues

    try:
        yield make
    finally:
        for queues in made:
            await queues.delete()


def _tasks(tmp_path: Path, count: int, seconds: float) -> list[TaskMessage]:
    return [TaskMessage(f"t{i}", [str(tmp_path / f"t{i}.pid"), seconds]) for i in range(count)]


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an exited slot stays one until something reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pid_of(tmp_path: Path, task_id: str) -> int | None:
    path = tmp_path / f"{task_id}.pid"
    text = path.read_text() if path.exists() else ""
    return int(text) if text.isdigit() else None


async def test_a_slot_killed_mid_task_spends_one_attempt_and_every_task_has_one_outcome(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job()  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-slotkill", 2)
        await eventually(lambda: scheduler.connected("d-slotkill"), what="daemon connected")
        scheduler.assign("d-slotkill", job_slots(job, HANDLER, 2))
        victim = TaskMessage("victim", [str(tmp_path / "victim.pid"), 1.0])
        tasks = [victim, *_tasks(tmp_path, 20, 0.02)]
        await job.submit(*tasks)
        await eventually(lambda: _pid_of(tmp_path, "victim"), what="victim running")
        pid = _pid_of(tmp_path, "victim")
        assert pid in daemon.slot_pids()
        os.kill(pid, signal.SIGKILL)
        await job.collect([t.task_id for t in tasks], timeout=20, linger=0.3)
        logs = dump_logs(tmp_path)
        assert job.duplicates() == 0, logs
        outcome = job.outcome("victim")
        assert outcome.ok and outcome.attempts == 2, (outcome, logs)
        assert all(job.outcome(t.task_id).ok and job.outcome(t.task_id).attempts == 1 for t in tasks[1:])
        assert '"daemon.task.slot_died"' in daemon.log() and daemon.alive()


@pytest.mark.parametrize("kind", ["quorum", "classic"])
async def test_a_daemon_killed_mid_task_loses_nothing_and_its_tasks_count_one_attempt(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path, kind: str
) -> None:
    job: JobQueues = await make_job(kind)  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        doomed = start_daemon("d-doomed", 2)
        await eventually(lambda: scheduler.connected("d-doomed"), what="daemon connected")
        scheduler.assign("d-doomed", job_slots(job, HANDLER, 2))
        # Enough work (4.8 s on two slots) that the kill below finds most of it still to do.
        tasks = _tasks(tmp_path, 24, 0.4)
        await job.submit(*tasks)
        await job.collect(["t0"], timeout=15)  # it works...
        slots = doomed.slot_pids()

        def started() -> set[str]:
            return {t.task_id for t in tasks if _pid_of(tmp_path, t.task_id) in slots}

        # Kill it just after a task started (a new pid file: that task has 0.4 s to go), not at a
        # moment where both slots are between tasks (a poll at an arbitrary time may land there).
        before = started()
        await eventually(lambda: started() - before, what="a task starting")
        fresh = started() - before
        doomed.kill()  # ...until it is killed with a task running
        # Its slots die with it instead of computing on as orphans.
        await eventually(lambda: not any(_running(pid) for pid in slots), timeout=5, what="slots gone")
        # Every task its slots started, read once they are gone (a task starting in the instant of
        # the kill counts too) and before the heir's slots overwrite the pid files of their reruns.
        ran_on_doomed = started()
        start_daemon("d-heir", 2)
        await eventually(lambda: scheduler.connected("d-heir"), what="heir connected")
        scheduler.assign("d-heir", job_slots(job, HANDLER, 2))
        await job.collect([t.task_id for t in tasks], timeout=30, linger=0.3)
        logs = dump_logs(tmp_path)
        outcomes = {t.task_id: job.outcome(t.task_id) for t in tasks}
        assert all(o.ok and not o.gave_up for o in outcomes.values()), logs
        # The tasks that died with the daemon spent one attempt, whatever the queue type.
        killed = {task_id for task_id in ran_on_doomed if outcomes[task_id].daemon_id == "d-heir"}
        assert fresh <= killed, (fresh, ran_on_doomed, outcomes)
        assert all(outcomes[task_id].attempts == 2 for task_id in killed), (killed, outcomes)
        # Deliveries it held without running them came back redelivered too: counted, bounded.
        assert all(o.attempts <= 2 for o in outcomes.values())
        # Duplicates: the two tasks it was running, and members of their frames it had finished
        # (the broker redelivers a frame whole; the client drops the duplicate outcomes).
        assert job.duplicates() <= 2 * FRAME
        assert '"redelivered": true' in (tmp_path / "d-heir.log").read_text()


async def test_a_frame_a_killed_daemon_had_half_done_runs_only_its_other_half(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job()  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        doomed = start_daemon("d-doomed", 1)
        await eventually(lambda: scheduler.connected("d-doomed"), what="daemon connected")
        # One slot: t0 goes alone (nothing in flight), t1..t4 in one frame, run in order; t4 is
        # still running when the daemon dies, with the results of t1..t3 confirmed.
        tasks = [TaskMessage(f"t{i}", [str(tmp_path / f"t{i}.runs"), 0.05]) for i in range(4)]
        tasks.append(TaskMessage("t4", [str(tmp_path / "t4.runs"), 30.0]))
        # All to one broker (balance would split them over both, and the frames with them).
        sender = send_stack(TaskCodec(), job.links[:1], job.tasks, frames=FrameLimits(max_messages=4)).sender
        await asyncio.gather(*[await sender.send(task) for task in tasks])
        await sender.close()
        scheduler.assign("d-doomed", job_slots(job, "tests.handlers.faults:count_runs", 1))
        await eventually(lambda: (tmp_path / "t4.runs").exists(), what="t4 running")
        await job.collect(["t0", "t1", "t2", "t3"], timeout=10)
        doomed.kill()
        start_daemon("d-heir", 1)
        await eventually(lambda: scheduler.connected("d-heir"), what="heir connected")
        scheduler.assign("d-heir", job_slots(job, "tests.handlers.faults:count_runs", 1))
        await eventually(lambda: len(_runs(tmp_path, "t4")) == 2, timeout=20, what="t4 run again")
        logs = dump_logs(tmp_path)
        # The heir found t1..t3 in the record and acked them without running them again.
        assert [len(_runs(tmp_path, f"t{i}")) for i in range(4)] == [1, 1, 1, 1], logs
        assert '"pipe.frame.done_before"' in (tmp_path / "d-heir.log").read_text(), logs
        assert job.duplicates() == 0, logs


async def test_members_a_killed_daemon_had_handed_back_run_only_as_their_copies(
    urls: list[str], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Issue 18: a member handed back (held behind a long task) and then redelivered with its
    # frame (the daemon killed before the frame's ack, and before the copy ran) ran twice: from
    # the frame and as its copy.
    # One broker: with two, a copy went to the broker whose prefetch the frame did not hold and
    # came back to the doomed daemon, held and handed back every 0.15 s; a kill between such a
    # lone copy's next copy and its ack ran it twice (the put-back's at-least-once window, not
    # the frame's case this test is about).
    job = JobQueues(f"{request.node.name[:36]}-{secrets.token_hex(3)}", urls[:1])
    await job.declare()
    try:
        await _handed_back_then_killed(job, urls[:1], tmp_path)
    finally:
        await job.delete()


async def _handed_back_then_killed(job: JobQueues, urls: list[str], tmp_path: Path) -> None:
    handler = "tests.handlers.faults:count_runs"
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        doomed = start_daemon("d-doomed", 1)
        await eventually(lambda: scheduler.connected("d-doomed"), what="daemon connected")
        # "alone" goes alone (nothing in flight); "running" and the two after it in one frame.
        # Tasks of 0.1 s and more: the prefetch is the one slot, so the unacked frame keeps the
        # copies handed back out of the doomed daemon (in the queue, not back and forth).
        tasks = [TaskMessage("alone", [str(tmp_path / "alone.runs"), 0.1])]
        tasks.append(TaskMessage("running", [str(tmp_path / "running.runs"), 30.0]))
        tasks += [TaskMessage(f"back-{i}", [str(tmp_path / f"back-{i}.runs"), 0.1]) for i in (1, 2)]
        sender = send_stack(TaskCodec(), job.links[:1], job.tasks, frames=FrameLimits(max_messages=3)).sender
        await asyncio.gather(*[await sender.send(task) for task in tasks])
        await sender.close()
        scheduler.assign("d-doomed", job_slots(job, handler, 1))
        await eventually(lambda: (tmp_path / "running.runs").exists(), what="running")
        await eventually(lambda: job.counts()[job.tasks] == 2, what="both copies in the queue")
        await asyncio.sleep(0.5)  # their hand-back records are sent and confirmed
        doomed.kill()  # the frame ("running" unsettled) is redelivered
        start_daemon("d-heir", 3)
        await eventually(lambda: scheduler.connected("d-heir"), what="heir connected")
        scheduler.assign("d-heir", job_slots(job, handler, 3))
        await eventually(lambda: len(_runs(tmp_path, "running")) == 2, timeout=20, what="running again")
        await job.collect(["alone", "back-1", "back-2"], timeout=10, linger=1.0)  # a second run shows
        logs = dump_logs(tmp_path)
        assert [len(_runs(tmp_path, t)) for t in ("alone", "back-1", "back-2")] == [1, 1, 1], logs
        assert '"pipe.frame.done_before"' in (tmp_path / "d-heir.log").read_text(), logs
        assert job.duplicates() == 0, logs


def _runs(tmp_path: Path, task_id: str) -> list[str]:
    path = tmp_path / f"{task_id}.runs"
    return path.read_text().split() if path.exists() else []


async def test_a_daemon_frozen_until_the_broker_drops_it_loses_nothing(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job()  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        frozen = start_daemon("d-frozen", 2, "--broker-heartbeat", "1")
        other = start_daemon("d-other", 1, "--broker-heartbeat", "1")
        await eventually(lambda: scheduler.connected("d-frozen") and scheduler.connected("d-other"))
        scheduler.assign("d-frozen", job_slots(job, HANDLER, 2))
        scheduler.assign("d-other", job_slots(job, HANDLER, 1))
        tasks = _tasks(tmp_path, 30, 0.3)
        await job.submit(*tasks)
        await job.collect(["t0", "t1"], timeout=15)
        await eventually(lambda: scheduler.busy("d-frozen", job.job_id) >= 1, what="frozen one busy")
        frozen.signal(signal.SIGSTOP)
        # Two missed heartbeats (1 s): the broker closes its connection and requeues its tasks.
        await asyncio.sleep(5.0)
        frozen.signal(signal.SIGCONT)
        await job.collect([t.task_id for t in tasks], timeout=30, linger=1.0)
        logs = dump_logs(tmp_path)
        assert all(job.outcome(t.task_id).ok for t in tasks), logs
        # What it held when frozen was delivered again elsewhere, so what it then computed is a
        # duplicate: at most its deliveries, a window of slots + 1 per broker. A delivery is a
        # frame: its members done before the freeze run again too (the broker requeues the
        # frame whole), so at most FRAME tasks each.
        assert job.duplicates() <= 2 * (2 + 1) * FRAME, logs
        assert frozen.alive() and other.alive()
        assert '"pipe.reopen.reopened"' in frozen.log() or '"pipe.rabbit.connected"' in frozen.log()
        # It serves again after thawing.
        more = [TaskMessage(f"after{i}", [str(tmp_path / f"after{i}.pid"), 0.01]) for i in range(6)]
        scheduler.assign("d-other")  # only the thawed daemon is left on the job
        await eventually(lambda: not scheduler.beats["d-other"].running, what="d-other left the job")
        await job.submit(*more)
        await job.collect([t.task_id for t in more], timeout=20)
        assert {job.outcome(t.task_id).daemon_id for t in more} == {"d-frozen"}, logs


PRELOADED = "tests.unit.daemon.preloaded:imported_elsewhere"


def _template_pids(daemon: object) -> list[int]:
    """The daemon's children running the template (its forked slots share its command line)."""
    daemon_pid: int = daemon.pid  # type: ignore[attr-defined]
    pids: list[int] = daemon.slot_pids()  # type: ignore[attr-defined]
    return [p for p in pids if b"truba.daemon.template" in _read(p, "cmdline") and _ppid(p) == daemon_pid]


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _ppid(pid: int) -> int:
    stat = _read(pid, "stat").rsplit(b")", 1)[-1].split()
    return int(stat[1]) if len(stat) > 1 else -1


async def test_slots_are_forked_with_the_handler_preloaded_and_a_killed_template_is_replaced(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job()  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-fork", 2, "--allow", "tests.unit.daemon.*")
        await eventually(lambda: scheduler.connected("d-fork"), what="daemon connected")
        scheduler.assign("d-fork", job_slots(job, PRELOADED, 2))
        first = [TaskMessage(f"a{i}", None) for i in range(6)]
        await job.submit(*first)
        await job.collect([t.task_id for t in first], timeout=20)
        # The handler's module was imported by the template, before the slots were forked.
        assert all(job.outcome(t.task_id).value is True for t in first), dump_logs(tmp_path)
        [template] = _template_pids(daemon)
        os.kill(template, signal.SIGKILL)  # its (idle) slots die with it
        await asyncio.sleep(0.3)
        second = [TaskMessage(f"b{i}", None) for i in range(6)]
        await job.submit(*second)
        await job.collect([t.task_id for t in second], timeout=20)
        logs = dump_logs(tmp_path)
        assert all(job.outcome(t.task_id).value is True for t in second), logs
        assert all(job.outcome(t.task_id).attempts == 1 for t in first + second), logs
        assert _template_pids(daemon) not in ([], [template]), logs
        assert '"daemon.forkserver.template_died"' in daemon.log() and daemon.alive()


async def test_without_the_fork_server_slots_are_spawned_and_import_the_handler_themselves(
    urls: list[str], make_job: Callable[..., object], tmp_path: Path
) -> None:
    job: JobQueues = await make_job()  # type: ignore[misc]
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-spawn", 1, "--allow", "tests.unit.daemon.*", "--no-fork-server")
        await eventually(lambda: scheduler.connected("d-spawn"), what="daemon connected")
        scheduler.assign("d-spawn", job_slots(job, PRELOADED, 1))
        await job.submit(TaskMessage("t", None))
        await job.collect(["t"], timeout=20)
        assert job.outcome("t").value is False, dump_logs(tmp_path)
        assert _template_pids(daemon) == []
