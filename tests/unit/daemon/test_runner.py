"""The task life on one daemon, over in-memory pipes and real slot processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from tests.unit.daemon.copies import uncopied
from tests.waiting import eventually
from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner, SlotPolicy
from truba.daemon.settings import JobSettings
from truba.daemon.slot_process import SlotProcess
from truba.pipes.base import Confirmation
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import GaveUpRecord, ResultMessage, TaskCodec, TaskMessage

MIB = 1024 * 1024


@dataclass
class Rig:
    """A runner over fake pipes, with the slots it was given."""

    runner: JobRunner
    tasks: FakeListener[TaskMessage]
    results: FakeSender[ResultMessage]
    requeue: FakeSender[TaskMessage]
    dead: FakeSender[GaveUpRecord]
    slots: list[SlotProcess]
    released: list[SlotProcess] = field(default_factory=list)

    def add(self, count: int = 1) -> None:
        for _ in range(count):
            slot = SlotProcess(len(self.slots))
            self.slots.append(slot)
            self.runner.add_worker(slot)

    def pushed_back(self) -> list[TaskMessage]:
        """What the runner published back into the task queue (requeues)."""
        return list(self.requeue.sent)


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(
        handler: str,
        *,
        target: int = 1,
        settings: JobSettings | None = None,
        policy: SlotPolicy | None = None,
        auto_confirm: bool = True,
    ) -> Rig:
        tasks: FakeListener[TaskMessage] = FakeListener()
        results: FakeSender[ResultMessage] = FakeSender(auto_confirm)
        requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        released: list[SlotProcess] = []
        runner = JobRunner(
            "j1",
            handler,
            "d1",
            JobPipes(tasks, results, requeue, dead),
            released.append,
            target=target,
            settings=settings,
            policy=policy,
        )
        made.append(Rig(runner, tasks, results, requeue, dead, [], released))
        made[-1].add(target)
        return made[-1]

    yield make
    for made_rig in made:
        made_rig.runner.stop_now()
        await made_rig.runner.close()
        for slot in made_rig.slots:
            await slot.stop()


async def test_a_task_is_acked_only_after_its_result_is_confirmed(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.basic:square", auto_confirm=False)
    r.tasks.push(TaskMessage("t1", 3))
    await eventually(lambda: r.results.sent)
    assert r.results.sent[0] == ResultMessage("t1", True, 9, None, "d1", r.results.sent[0].seconds, 1)
    await asyncio.sleep(0.05)
    assert r.tasks.acked == []  # the result is not confirmed yet
    r.results.confirm()
    await eventually(lambda: r.tasks.acked)
    assert r.tasks.acked == [TaskMessage("t1", 3)]
    assert r.runner.stats.done == 1 and r.runner.stats.service_time > 0
    await r.runner.close()
    assert r.released == r.slots and r.tasks.closed and r.results.closed


async def test_an_error_outcome_is_a_result_and_a_rejected_result_requeues_the_task(
    rig: Callable[..., Rig],
) -> None:
    r = rig("tests.handlers.basic:square")
    r.tasks.push(TaskMessage("bad", -1))
    await eventually(lambda: r.tasks.acked)
    error = r.results.sent[0].error
    assert not r.results.sent[0].ok and error is not None and error.type == "ValueError"
    assert r.runner.stats.failed == 1
    # A broker nack of the result: the task goes back to its queue instead of being acked.
    r.results.auto_confirm = False
    r.tasks.push(TaskMessage("t2", 2))
    await eventually(lambda: len(r.results.sent) == 2)
    r.results.reject()
    await eventually(lambda: r.tasks.rejected)
    assert r.tasks.rejected[0] == (TaskMessage("t2", 2), True)
    r.results.auto_confirm = True
    r.results.confirm()
    await eventually(lambda: TaskMessage("t2", 2) in r.tasks.acked)


async def test_a_slot_crash_spends_an_attempt_then_the_task_is_given_up(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.basic:crash", settings=JobSettings(max_attempts=2))
    r.tasks.push(TaskMessage("t1", None))
    await eventually(lambda: r.tasks.acked)
    # Attempt 1 died: the task is published again with one attempt spent, the original acked.
    assert uncopied(r.pushed_back()) == [TaskMessage("t1", None, attempts=1)]
    assert r.results.sent == [] and r.tasks.rejected == []
    r.tasks.push(r.pushed_back()[0])
    await eventually(lambda: len(r.tasks.acked) == 2)
    # Attempt 2 died too: given up, with a dead letter and a give-up outcome.
    [result] = r.results.sent
    assert result.gave_up and not result.ok and result.attempts == 2
    assert (
        result.error is not None
        and result.error.type == "SlotDied"
        and "exited with 13" in result.error.message
    )
    [record] = r.dead.sent
    assert record.task_id == "t1" and record.attempts == 2 and record.error == result.error
    assert uncopied([TaskCodec().decode(record.body)]) == [TaskMessage("t1", None, attempts=2)]
    assert r.runner.stats.failed == 1 and r.runner.stats.gave_up == 1
    # The slot came back for the next task.
    r.runner.handler = "tests.handlers.basic:echo"
    r.tasks.push(TaskMessage("t2", "alive"))
    await eventually(lambda: len(r.results.sent) == 2)
    assert r.results.sent[1].value == "alive"


async def test_a_task_over_its_timeout_is_killed_on_time_then_retried_or_given_up(
    rig: Callable[..., Rig],
) -> None:
    r = rig("tests.handlers.basic:sleep", settings=JobSettings(task_timeout=0.3, max_attempts=3))
    r.tasks.push(TaskMessage("slow", 30))
    began = time.monotonic()
    await eventually(lambda: r.tasks.acked)
    assert time.monotonic() - began < 1.5
    assert uncopied(r.pushed_back()) == [TaskMessage("slow", 30, attempts=1)]
    assert r.runner.stats.timed_out == 1
    # The last attempt times out too: given up with TaskTimeout.
    r.tasks.push(TaskMessage("slow", 30, attempts=2))
    await eventually(lambda: r.results.sent)
    [result] = r.results.sent
    assert result.gave_up and result.attempts == 3
    assert result.error is not None and result.error.type == "TaskTimeout"
    # A quick task on the restarted slot is not affected by the timeout.
    r.tasks.push(TaskMessage("quick", 0.01))
    await eventually(lambda: len(r.results.sent) == 2)
    assert r.results.sent[1].ok and r.results.sent[1].attempts == 1


async def test_redeliveries_count_as_spent_attempts(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.basic:echo", settings=JobSettings(max_attempts=3))
    # Classic queue: redelivered, no delivery count: recounted (published with one more), not run.
    r.tasks.push(TaskMessage("c", 1), redelivered=True)
    await eventually(lambda: r.tasks.acked)
    assert uncopied(r.pushed_back()) == [TaskMessage("c", 1, attempts=1)] and r.results.sent == []
    # Quorum queue: the broker's count is exact, so the task runs at once with it.
    r.tasks.push(TaskMessage("q", 2, attempts=1), redelivered=True, headers={"x-delivery-count": 1})
    await eventually(lambda: r.results.sent)
    assert r.results.sent[0].ok and r.results.sent[0].attempts == 3
    # Spent to the limit by deaths: given up as lost.
    r.tasks.push(TaskMessage("g", 3, attempts=1), redelivered=True, headers={"x-delivery-count": 2})
    await eventually(lambda: len(r.results.sent) == 2)
    gave_up = r.results.sent[1]
    assert gave_up.gave_up and gave_up.attempts == 3
    assert gave_up.error is not None and gave_up.error.type == "AttemptLost"


async def test_immediate_preemption_interrupts_the_task_and_spends_no_attempt(
    rig: Callable[..., Rig],
) -> None:
    r = rig("tests.handlers.basic:sleep", settings=JobSettings(immediate=True))
    r.tasks.push(TaskMessage("long", 30, attempts=1))
    await eventually(lambda: r.runner.stats.busy == 1)
    await asyncio.sleep(0.2)
    pid = r.slots[0].pid
    began = time.monotonic()
    r.runner.resize(0)
    await eventually(lambda: r.released)
    assert time.monotonic() - began < 0.5, "the slot was not freed at once"
    await eventually(lambda: r.tasks.acked)
    assert uncopied(r.pushed_back()) == [TaskMessage("long", 30, attempts=1)]  # same count: nothing spent
    assert r.results.sent == [] and r.tasks.rejected == []
    assert r.runner.stats.preempted == 1
    assert r.slots[0].alive and r.slots[0].pid != pid  # a fresh process, ready for the next job


async def test_graceful_preemption_lets_the_task_finish(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.basic:sleep", target=2)
    r.tasks.push(TaskMessage("t", 0.5))
    await eventually(lambda: r.runner.stats.busy == 1)
    r.runner.resize(0)
    await eventually(lambda: len(r.released) == 1)  # the idle worker leaves at once
    assert r.runner.stats.busy == 1
    await eventually(lambda: len(r.released) == 2)
    assert [m.task_id for m in r.results.sent] == ["t"] and r.pushed_back() == []


async def test_stop_now_interrupts_and_puts_every_running_task_back(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.basic:sleep", target=2)
    r.tasks.push(TaskMessage("a", 30))
    r.tasks.push(TaskMessage("b", 30))
    await eventually(lambda: r.runner.stats.busy == 2)
    began = time.monotonic()
    r.runner.stop_now()
    await r.runner.close()
    assert time.monotonic() - began < 1.0
    assert sorted(t.task_id for t in r.pushed_back()) == ["a", "b"]
    assert sorted(t.task_id for t in r.tasks.acked) == ["a", "b"]


async def test_a_slot_over_the_hard_memory_limit_is_killed_and_the_attempt_spent(
    rig: Callable[..., Rig],
) -> None:
    r = rig("tests.handlers.faults:hog", policy=SlotPolicy(memory_hard=100 * MIB))
    r.tasks.push(TaskMessage("hog", [200, 5]))
    await eventually(lambda: r.tasks.acked, timeout=5)
    assert uncopied(r.pushed_back()) == [TaskMessage("hog", [200, 5], attempts=1)]
    r.tasks.push(TaskMessage("fits", [10, 0]))
    await eventually(lambda: r.results.sent)
    assert r.results.sent[0].value == 10


async def test_a_slot_is_recycled_after_a_task_over_the_soft_memory_limit(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.faults:leak", policy=SlotPolicy(memory_soft=60 * MIB))
    for i in range(4):
        r.tasks.push(TaskMessage(f"t{i}", 25))
        await eventually(lambda i=i: len(r.results.sent) == i + 1)  # type: ignore[misc]
    # Kept: 25, 50, 75 MiB -> over 60: the slot is replaced after the third task; the fourth starts anew.
    assert [m.value for m in r.results.sent] == [25, 50, 75, 25]


async def test_a_slot_is_recycled_after_n_tasks(rig: Callable[..., Rig]) -> None:
    r = rig("tests.handlers.faults:pid", policy=SlotPolicy(max_tasks=3))
    for i in range(7):
        r.tasks.push(TaskMessage(f"t{i}", 0))
        await eventually(lambda i=i: len(r.results.sent) == i + 1)  # type: ignore[misc]
    pids = [m.value for m in r.results.sent]
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]


class CancellableListener(FakeListener[TaskMessage]):
    """A fake listener that can stop consuming (the capability the runner asks pipes for)."""

    cancelled = False

    async def cancel(self) -> None:
        self.cancelled = True


async def test_closing_hands_back_unstarted_deliveries_unspent_when_the_listener_can_cancel() -> None:
    tasks = CancellableListener()
    results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
    requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
    dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
    runner = JobRunner(
        "j1", "tests.handlers.basic:echo", "d1", JobPipes(tasks, results, requeue, dead), print
    )
    tasks.push(TaskMessage("held-1", 1))
    tasks.push(TaskMessage("held-2", 2, attempts=1), redelivered=True, headers={"x-delivery-count": 0})
    await runner.close()
    assert tasks.cancelled
    # Each goes back as a new copy of itself (see test_hand_back_record for the hand-back record).
    assert uncopied(requeue.sent) == [TaskMessage("held-1", 1), TaskMessage("held-2", 2, attempts=1)]
    assert tasks.acked == [TaskMessage("held-1", 1), TaskMessage("held-2", 2, attempts=1)] and tasks.closed


class StuckSender(FakeSender[ResultMessage]):
    """A results pipe that never takes a message: a retry layer with every broker down."""

    async def send(self, message: ResultMessage) -> Confirmation:
        self.sent.append(message)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_stop_now_closes_within_its_bound_while_a_result_cannot_be_sent() -> None:
    """A daemon stopped now with its brokers gone (a result retried forever) still exits: the
    worker sending is given up after ``stop_timeout`` and its task left unacked (the broker
    redelivers it), instead of the daemon waiting for brokers that may never return."""
    tasks: FakeListener[TaskMessage] = FakeListener()
    results = StuckSender()
    requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
    dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
    slot = SlotProcess(0)
    runner = JobRunner(
        "j1",
        "tests.handlers.basic:square",
        "d1",
        JobPipes(tasks, results, requeue, dead),
        print,
        target=1,
        stop_timeout=0.5,
    )
    runner.add_worker(slot)
    try:
        tasks.push(TaskMessage("t1", 3))
        await eventually(lambda: results.sent)
        runner.stop_now()
        async with asyncio.timeout(10):  # closing never returned before (stop_timeout is 0.5)
            await runner.close()
        assert tasks.acked == [] and tasks.closed  # left for the broker to redeliver
    finally:
        await slot.stop()
