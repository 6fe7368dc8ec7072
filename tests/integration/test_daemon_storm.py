"""A preemption storm: the scheduler flips a daemon between two jobs every 100 ms for 15 s under load.

One real daemon with 4 slots, two jobs A and B with a few thousand short tasks each (5-20 ms
sleeps). The scripted scheduler assigns {A: 4} and {B: 4} in turn every 100 ms for 15 s (each
flip closes one job's runner on the daemon and opens the other's), then gives both jobs 2 slots
until every task is done. The client's side keeps every raw result message.

What is asserted, per task of both jobs:

- exactly one outcome at the client, i.e. after deduplication by task id (what truba's client
  does, see truba.client.result_stream): none lost. Raw duplicates (the same task's result twice) are
  asserted to be zero as well: preemption never lets a task finish twice (an interrupted task
  has no result; a runner that leaves confirms and acks its ends before closing), so a raw
  duplicate here would be a daemon bug even though the client would hide it. Their count is
  printed either way;
- the outcome is a success with the task's own value, and no task was given up (empty dead
  letter queue, no ``gave_up`` result);
- attempts: being preempted or handed back should spend none. The cause of most spent ones
  was the broker: a quorum queue returns, marked redelivered and with ``x-delivery-count``
  raised, the deliveries it had already sent towards a consumer when basic.cancel arrives,
  before they reached the client (nothing in the daemon ever sees them). The runner now holds
  its acks back for ``CANCEL_QUIET`` before cancelling, so the consumer has no credit left
  (graceful storm: 0 spent, before ~1%; immediate: a few per run, before ~1%). The jobs here
  allow 10 attempts; the count is printed, and the test fails if any task spent more than 3.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.integration.test_daemon_harness import (
    JobQueues,
    ScriptedScheduler,
    dump_logs,
    eventually,
    job_slots,
    scripted,
)
from truba.wire import TaskMessage

pytestmark = pytest.mark.integration

HANDLER = "tests.handlers.basic:sleep"
MAX_ATTEMPTS = 10
"""Above the default 3: a known bug spends attempts under this storm (see the module docstring);
with 3, an unlucky task could be given up and the test would stop measuring loss."""
SLOTS = 4
TASKS_PER_JOB = 1000
FLIP_EVERY = 0.1
STORM_SECONDS = 15.0
STALL_TIMEOUT = 12.0
"""Seconds without a new outcome after which a job counts as stuck (a slow machine is no failure)."""
FINISH_CAP = 120.0
"""Seconds after the storm by which every task must have its outcome however slow the machine."""


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


def _broker_state(nodes: list[object], *jobs: JobQueues) -> str:
    """Where a job's messages are on each broker (ready, unacked, consumers; channels holding
    unacked messages): what a failure needs to tell a lost task from a held one."""
    names = {job.job_id for job in jobs}
    lines: list[str] = []
    for node in nodes:
        ctl = getattr(node, "ctl", None)
        if ctl is None:
            continue
        try:
            queues = ctl(
                "list_queues", "-q", "name", "messages_ready", "messages_unacknowledged", "consumers"
            )
            channels = ctl("list_channels", "-q", "name", "consumer_count", "messages_unacknowledged")
        except Exception as exc:  # diagnostics only
            lines.append(f"{node}: {exc!r}")
            continue
        lines.append(f"--- broker {getattr(node, 'url', node)}: queue ready unacked consumers")
        lines += [q for q in queues.splitlines() if any(n in q for n in names)]
        lines += [f"channel with unacked: {c}" for c in channels.splitlines() if c.split()[-1:] != ["0"]]
    return "\n".join(lines)


@pytest.fixture
async def make_job(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., object]]:
    made: list[JobQueues] = []

    async def make(urls: list[str], name: str) -> JobQueues:
        queues = JobQueues(f"{name}{request.node.name[:24]}-{secrets.token_hex(3)}", urls)
        await queues.declare()
        made.append(queues)
        return queues

    try:
        yield make
    finally:
        for queues in made:
            await queues.delete()


def _seconds(i: int) -> float:
    """The task's sleep: 5 to 20 ms, known from its index (the result must echo it)."""
    return round(0.005 + (i % 16) * 0.001, 3)


def _tasks(prefix: str) -> list[TaskMessage]:
    return [TaskMessage(f"{prefix}{i}", _seconds(i)) for i in range(TASKS_PER_JOB)]


def _events(log: str) -> Counter[str]:
    """How often each log event occurred in the daemon's JSON log lines."""
    counts: Counter[str] = Counter()
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            counts[str(record.get("event") or record.get("msg") or record.get("message"))] += 1
    return counts


async def _storm(scheduler: ScriptedScheduler, daemon_id: str, a: object, b: object) -> int:
    """Flips the daemon between {A: all} and {B: all} every FLIP_EVERY s for STORM_SECONDS s."""
    began = time.monotonic()
    flips = 0
    while time.monotonic() - began < STORM_SECONDS:
        scheduler.assign(daemon_id, a if flips % 2 == 0 else b)  # type: ignore[arg-type]
        flips += 1
        await asyncio.sleep(max(0.0, began + flips * FLIP_EVERY - time.monotonic()))
    return flips


@pytest.mark.parametrize("immediate", [True, False], ids=["immediate", "graceful"])
async def test_a_preemption_storm_loses_and_duplicates_no_outcome_and_spends_no_attempt(
    urls: list[str],
    rabbit_nodes: list[object],
    make_job: Callable[..., object],
    tmp_path: Path,
    immediate: bool,
) -> None:
    job_a: JobQueues = await make_job(urls, "storm-a-")  # type: ignore[misc]
    job_b: JobQueues = await make_job(urls, "storm-b-")  # type: ignore[misc]
    tasks_a, tasks_b = _tasks("a"), _tasks("b")
    await asyncio.gather(job_a.submit(*tasks_a), job_b.submit(*tasks_b))
    ids_a, ids_b = [t.task_id for t in tasks_a], [t.task_id for t in tasks_b]
    daemon_id = "d-storm"
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon(daemon_id, SLOTS)
        await eventually(lambda: scheduler.connected(daemon_id), what="daemon connected")
        all_a = job_slots(job_a, HANDLER, SLOTS, immediate=immediate, max_attempts=MAX_ATTEMPTS)
        all_b = job_slots(job_b, HANDLER, SLOTS, immediate=immediate, max_attempts=MAX_ATTEMPTS)
        began = time.monotonic()
        timeout = STORM_SECONDS + FINISH_CAP
        after_storm = began + STORM_SECONDS  # a stall counts once the flips stop
        collecting = asyncio.gather(
            job_a.collect(ids_a, timeout, stall=STALL_TIMEOUT, stall_from=after_storm),
            job_b.collect(ids_b, timeout, stall=STALL_TIMEOUT, stall_from=after_storm),
        )
        flips = await _storm(scheduler, daemon_id, all_a, all_b)
        done_in_storm = len(job_a.received) + len(job_b.received)
        half = SLOTS // 2
        scheduler.assign(
            daemon_id,
            job_slots(job_a, HANDLER, half, immediate=immediate, max_attempts=MAX_ATTEMPTS),
            job_slots(job_b, HANDLER, SLOTS - half, immediate=immediate, max_attempts=MAX_ATTEMPTS),
        )
        try:
            await collecting
        except AssertionError as exc:
            state = await asyncio.to_thread(_broker_state, rabbit_nodes, job_a, job_b)
            raise AssertionError(f"{exc}\n{state}\n{dump_logs(tmp_path)}") from exc
        # Any late duplicate would arrive within a moment of the last result.
        await asyncio.gather(job_a.collect(ids_a, 1.0, linger=0.5), job_b.collect(ids_b, 1.0, linger=0.5))
        seconds = time.monotonic() - began
        assert daemon.alive(), dump_logs(tmp_path)
        log = daemon.log()
        events = _events(log)
        print(
            f"\nstorm ({'immediate' if immediate else 'graceful'}): {flips} flips in {STORM_SECONDS:.0f} s, "
            f"{done_in_storm}/{2 * TASKS_PER_JOB} tasks done during the storm, all done in {seconds:.1f} s; "
            f"raw duplicates A={job_a.duplicates()} B={job_b.duplicates()}; "
            f"preempted={events['daemon.task.preempted']} runners opened={events['daemon.job.opened']} "
            f"slot deaths={events['daemon.task.slot_died']}"
        )

        problems: list[str] = []
        for job, tasks in ((job_a, tasks_a), (job_b, tasks_b)):
            # Exactly one outcome per task after the client's dedup by task id; and none raw twice.
            missing = [t.task_id for t in tasks if t.task_id not in job.received]
            unknown = set(job.received) - {t.task_id for t in tasks}
            doubled = {i: len(r) for i, r in job.received.items() if len(r) > 1}
            wrong = [
                (t.task_id, job.outcome(t.task_id))
                for t in tasks
                if t.task_id in job.received
                and not (job.outcome(t.task_id).ok and job.outcome(t.task_id).value == t.payload)
            ]
            gave_up = [i for i, results in job.received.items() if any(r.gave_up for r in results)]
            spent = {i: r[0].attempts for i, r in job.received.items() if r[0].attempts != 1}
            # Known (issue 5): under this storm about 1% of tasks spend one attempt (a delivery
            # reaches a runner that is closing and goes back to the broker marked redelivered).
            # Reported, and bounded: none may come near giving up.
            print(f"{job.job_id}: {len(spent)} tasks spent an attempt: {str(spent)[:200]}")
            exhausted = {i: n for i, n in spent.items() if n >= 4}
            dead = job.take_dead()
            left = job.counts()
            for name, bad in (
                ("missing", missing),
                ("unknown", sorted(unknown)),
                ("raw duplicates", doubled),
                ("wrong outcome", wrong[:5]),
                ("gave up", gave_up),
                ("more than 3 attempts", exhausted),
                ("dead-lettered", dead[:5]),
            ):
                if bad:
                    problems.append(f"{job.job_id}: {name}: {len(bad)} e.g. {str(bad)[:300]}")
            if left[job.tasks] or left[job.results]:
                problems.append(f"{job.job_id}: messages left in queues: {left}")
        if problems:
            crash = (
                f" ({events['daemon.task.slot_died']} slot deaths)" if events["daemon.task.slot_died"] else ""
            )
            raise AssertionError("\n".join(problems) + crash + "\n" + dump_logs(tmp_path, tail=20000))
