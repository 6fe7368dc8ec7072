"""The one execution path (admit, one attempt, end each task, recycle) over a scripted fake slot,
for each way tasks reach a slot: one task, a chunk in one write, a batch call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from tests.unit.daemon.copies import uncopied
from tests.waiting import eventually
from truba.daemon.crew import Crew, Worker
from truba.daemon.execution import Execution
from truba.daemon.job_pipes import JobPipes
from truba.daemon.returns import Returns
from truba.daemon.settings import JobSettings
from truba.daemon.slot_process import SlotDied, SlotProcess, SlotReply
from truba.daemon.spans import SpanLog
from truba.daemon.stats import JobStats
from truba.daemon.task_endings import TaskEndings
from truba.daemon.terms import JobTerms, SlotPolicy
from truba.pipes.base import Confirmation, Delivery
from truba.pipes.errors import PipeBroken
from truba.pipes.prefetch import Window
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import ErrorInfo, GaveUpRecord, ResultMessage, TaskMessage


class FakeSlot:
    """A slot that answers each task by its payload: a value (the reply), "die" (the process
    exits) or "hang" (runs until killed). Records what it was handed and what was done to it."""

    index = 0
    pid = 4242
    reply_here = False
    cold = False
    alive = True

    def __init__(self) -> None:
        self.tasks_run = 0
        self.ran: list[str] = []
        """How tasks were handed over, in order: "run", "send 3", "batch 2"."""
        self.killed = 0
        self.restarted = 0
        self.handlers: list[str] = []
        """The handler names tasks were run with (``run`` only)."""
        self._owed: list[tuple[str, object]] = []

    def _answer(self, task_id: str, payload: object) -> SlotReply:
        if payload == "die":
            raise SlotDied(f"slot exited while running {task_id}")
        self.tasks_run += 1
        if isinstance(payload, list) and payload and payload[0] == "raise":  # ["raise", *class names]
            kinds = tuple(str(kind) for kind in payload[1:])
            return SlotReply(
                task_id, False, None, ErrorInfo(kinds[0].rpartition(".")[2], "boom"), 0.001, kinds
            )
        return SlotReply(task_id, True, payload, None, 0.001)

    async def run(self, handler: str, task_id: str, payload: object) -> SlotReply:
        self.ran.append("run")
        self.handlers.append(handler)
        if payload == "hang":
            await asyncio.Event().wait()
        return self._answer(task_id, payload)

    async def send(self, handler: str, tasks: Sequence[tuple[str, object]]) -> None:
        self.ran.append(f"send {len(tasks)}")
        self._owed = list(tasks)

    def reply_at_hand(self) -> SlotReply | None:
        return None

    async def reply(self, task_id: str) -> SlotReply:
        owed_id, payload = self._owed.pop(0)
        assert owed_id == task_id, "replies are read in the order the tasks were handed over"
        if payload == "hang":
            await asyncio.Event().wait()
        return self._answer(task_id, payload)

    async def run_batch(self, handler: str, tasks: list[tuple[str, object]]) -> list[SlotReply]:
        self.ran.append(f"batch {len(tasks)}")
        if any(payload == "hang" for _, payload in tasks):
            await asyncio.Event().wait()
        self.tasks_run += 1
        return [SlotReply(task_id, True, payload, None, 0.001) for task_id, payload in tasks]

    async def kill(self) -> None:
        self.killed += 1

    async def start(self) -> None:
        self.restarted += 1
        self.tasks_run = 0

    async def stop(self) -> None:
        pass

    def private_memory(self) -> int | None:
        return None


class BusyWatch:
    """A results sender (a FakeSender inside) that notes, for each result, whether its worker's
    slot was busy when it was published; ``fail`` makes every send raise."""

    def __init__(self) -> None:
        self.inner: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
        self.worker: Worker | None = None
        self.busy: dict[str, bool] = {}
        self.fail: PipeBroken | None = None

    @property
    def sent(self) -> list[ResultMessage]:
        return self.inner.sent

    async def send(self, message: ResultMessage) -> Confirmation:
        if self.fail is not None:
            raise self.fail
        assert self.worker is not None
        self.busy[message.task_id] = self.worker.busy
        return await self.inner.send(message)

    def unconfirmed(self) -> Sequence[ResultMessage]:
        return self.inner.unconfirmed()

    def drop_unconfirmed(self) -> None:
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        await self.inner.close()


class Rig:
    """An Execution over fake pipes and one worker on a fake slot."""

    def __init__(self, settings: JobSettings | None = None, policy: SlotPolicy | None = None) -> None:
        self.tasks: FakeListener[TaskMessage] = FakeListener()
        self.results = BusyWatch()
        self.requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
        self.dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        self.stats = JobStats()
        self.crew = Crew(1)
        terms = JobTerms("h", settings or JobSettings(), policy or SlotPolicy())
        ends = TaskEndings(JobPipes(self.tasks, self.results, self.requeue, self.dead), "d1", self.stats)
        returns = Returns("j1", self.tasks, ends, terms, self.crew.broke, stop_timeout=1.0, cancel_quiet=0.0)
        self.window = returns.window = Window(1)
        self.returns = returns
        self.spans = SpanLog()
        self.execution = Execution(
            terms, self.crew, self.stats, ends, returns, "d1", self.spans.for_job("j1")
        )
        self.slot = FakeSlot()
        self.worker = Worker(cast(SlotProcess, self.slot))
        self.results.worker = self.worker

    async def deliveries(self, *tasks: TaskMessage) -> list[Delivery[TaskMessage]]:
        got = []
        for task in tasks:
            self.tasks.push(task)
            delivery = await self.tasks.get(0.0)
            assert delivery is not None
            got.append(delivery)
        return got

    def outcomes(self) -> dict[str, object]:
        return {r.task_id: r.value for r in self.results.sent}


async def test_one_task_replies_and_its_result_goes_out_with_the_slot_already_free() -> None:
    rig = Rig(policy=SlotPolicy(max_tasks=1))
    [delivery] = await rig.deliveries(TaskMessage("t", 7, attempts=1))
    await rig.execution.run_one(rig.worker, delivery)
    [result] = rig.results.sent
    assert (result.value, result.attempts) == (7, 2)  # one spent before, this is the second
    assert rig.slot.ran == ["run"] and rig.results.busy == {"t": False}
    assert rig.stats.busy == 0 and not rig.worker.busy
    assert rig.slot.restarted == 1  # recycled after max_tasks
    await eventually(lambda: rig.tasks.acked == [delivery.message])
    assert rig.execution.task_seconds == 0.001


async def test_a_chunk_goes_in_one_write_and_each_task_ends_while_the_slot_runs_the_next() -> None:
    rig = Rig(policy=SlotPolicy(max_tasks=3))
    deliveries = await rig.deliveries(*(TaskMessage(f"t{i}", i) for i in range(3)))
    await rig.execution.run_chunk(rig.worker, deliveries)
    assert rig.slot.ran == ["send 3"]
    assert rig.outcomes() == {"t0": 0, "t1": 1, "t2": 2}
    assert rig.results.busy == {"t0": True, "t1": True, "t2": True}  # busy until the last reply
    assert rig.stats.busy == 0 and not rig.worker.busy and rig.slot.restarted == 1


async def test_a_slot_lost_mid_chunk_spends_that_task_and_puts_the_rest_back_unstarted() -> None:
    rig = Rig(policy=SlotPolicy(max_tasks=1))
    tasks = [TaskMessage("t0", 0), TaskMessage("t1", "die"), TaskMessage("t2", 2), TaskMessage("t3", 3)]
    await rig.execution.run_chunk(rig.worker, await rig.deliveries(*tasks))
    assert rig.outcomes() == {"t0": 0}
    await eventually(lambda: len(rig.requeue.sent) == 3)
    assert {t.task_id: t.attempts for t in rig.requeue.sent} == {"t1": 1, "t2": 0, "t3": 0}
    assert rig.slot.killed == 0 and rig.slot.restarted == 0  # not recycled: it did not reply to all
    await eventually(lambda: len(rig.tasks.acked) == 4)


@pytest.mark.parametrize("chunk", [True, False])
async def test_a_publish_that_fails_kills_the_slot_only_while_it_still_owes_replies(chunk: bool) -> None:
    rig = Rig()
    rig.results.fail = PipeBroken("results pipe lost")
    deliveries = await rig.deliveries(TaskMessage("a", 1), TaskMessage("b", 2))
    with pytest.raises(PipeBroken):
        if chunk:
            await rig.execution.run_chunk(rig.worker, deliveries)
        else:
            await rig.execution.run_one(rig.worker, deliveries[0])
    assert rig.slot.killed == (1 if chunk else 0)  # b's reply is still due from a chunk
    assert rig.stats.busy == 0 and not rig.worker.busy


async def test_a_chunk_left_with_one_task_after_admission_runs_it_as_one_task() -> None:
    rig = Rig(settings=JobSettings(max_attempts=2))
    spent = TaskMessage("spent", 1, attempts=2)  # every attempt spent: given up at admission
    await rig.execution.run_chunk(rig.worker, await rig.deliveries(spent, TaskMessage("t", 5)))
    assert rig.slot.ran == ["run"] and rig.outcomes() == {"spent": None, "t": 5}
    assert rig.results.sent[0].gave_up and rig.dead.sent[0].task_id == "spent"


async def test_a_batch_reply_gives_each_task_its_own_result_and_share_of_the_time() -> None:
    rig = Rig()
    await rig.execution.run_batch(rig.worker, await rig.deliveries(TaskMessage("a", 1), TaskMessage("b", 2)))
    assert rig.slot.ran == ["batch 2"] and rig.outcomes() == {"a": 1, "b": 2}
    assert rig.results.busy == {"a": False, "b": False}
    assert all(r.attempts == 1 and r.ok for r in rig.results.sent)


@pytest.mark.parametrize("batch", [True, False])
async def test_an_interrupt_puts_every_running_task_back_unspent(batch: bool) -> None:
    rig = Rig()
    hanging = (TaskMessage("a", "hang", attempts=1), TaskMessage("b", "hang", attempts=1))
    deliveries = await rig.deliveries(*hanging)
    asyncio.get_running_loop().call_later(0.05, rig.worker.interrupt.set)
    if batch:
        await rig.execution.run_batch(rig.worker, deliveries)
    else:
        await rig.execution.run_one(rig.worker, deliveries[0])
    count = 2 if batch else 1
    await eventually(lambda: len(rig.requeue.sent) == count)
    assert uncopied(rig.requeue.sent) == [d.message for d in deliveries[:count]]  # same counts: nothing spent
    assert rig.stats.preempted == count and rig.results.sent == []
    assert rig.slot.restarted == 1  # the watch restarted the slot it stopped


async def test_a_worker_taken_away_now_puts_a_delivery_back_without_running_it() -> None:
    rig = Rig()
    rig.crew.now = True
    [delivery] = await rig.deliveries(TaskMessage("t", 1))
    await rig.execution.run_one(rig.worker, delivery)
    assert rig.slot.ran == [] and uncopied(rig.requeue.sent) == [TaskMessage("t", 1)]


RETRYING = JobSettings(max_attempts=3, retry_on=frozenset({"TimeoutError", "mypkg.Busy"}), backoff=(0.2, 0.2))


async def test_a_listed_exception_frees_the_slot_and_requeues_the_task_after_its_backoff() -> None:
    rig = Rig(RETRYING)
    # Given a handler that raised a subclass of a listed exception (its MRO names it)
    [delivery] = await rig.deliveries(TaskMessage("t", ["raise", "mypkg.Sub", "mypkg.Busy", "Exception"]))
    await rig.execution.run_one(rig.worker, delivery)
    # Then the slot is free at once, no outcome goes out, and the task waits, its delivery unacked
    assert not rig.worker.busy and rig.results.sent == [] and rig.requeue.sent == []
    assert rig.returns.retrying == 1 and rig.tasks.acked == []
    await eventually(lambda: rig.window.size == 2)  # widened: the waiting delivery holds no slot's credit
    # And after the backoff (0.1-0.2 s with jitter) it goes back with the attempt counted
    await eventually(lambda: len(rig.requeue.sent) == 1)
    assert rig.requeue.sent[0].attempts == 1 and rig.stats.retried == 1
    await eventually(lambda: rig.tasks.acked == [delivery.message])
    assert rig.returns.retrying == 0 and rig.window.size == 1


async def test_an_unlisted_exception_is_the_outcome_at_once() -> None:
    rig = Rig(RETRYING)
    [delivery] = await rig.deliveries(TaskMessage("t", ["raise", "ValueError", "Exception"]))
    await rig.execution.run_one(rig.worker, delivery)
    [result] = rig.results.sent
    assert not result.ok and result.attempts == 1 and rig.returns.retrying == 0


async def test_a_listed_exception_on_the_last_attempt_is_the_outcome_with_every_attempt_counted() -> None:
    rig = Rig(RETRYING)
    [delivery] = await rig.deliveries(TaskMessage("t", ["raise", "TimeoutError"], attempts=2))
    await rig.execution.run_one(rig.worker, delivery)
    [result] = rig.results.sent
    assert not result.ok and not result.gave_up and result.attempts == 3
    assert result.error is not None and result.error.type == "TimeoutError"


async def test_a_task_waiting_to_be_retried_goes_back_at_once_when_the_job_leaves() -> None:
    settings = JobSettings(max_attempts=3, retry_on=frozenset({"TimeoutError"}), backoff=(60.0, 60.0))
    rig = Rig(settings)
    [delivery] = await rig.deliveries(TaskMessage("t", ["raise", "TimeoutError"]))
    await rig.execution.run_one(rig.worker, delivery)
    rig.returns.stop_taking()
    await asyncio.wait_for(rig.returns.put_back_done(), 5.0)
    assert [t.attempts for t in rig.requeue.sent] == [1]


async def test_a_pickle_job_on_a_daemon_without_allow_pickle_gets_a_pickle_refused_outcome_at_once() -> None:
    rig = Rig(JobSettings(pickle=True))
    [delivery] = await rig.deliveries(TaskMessage("t", 1))
    await rig.execution.run_one(rig.worker, delivery)
    [result] = rig.results.sent
    assert not result.ok and result.error is not None and result.error.type == "PickleRefused"
    assert "--allow-pickle" in result.error.message and rig.slot.ran == []
    await eventually(lambda: rig.tasks.acked == [delivery.message])


async def test_a_pickle_job_on_a_daemon_with_allow_pickle_runs_with_pickled_payloads() -> None:
    rig = Rig(JobSettings(pickle=True), SlotPolicy(allow_pickle=True))
    [delivery] = await rig.deliveries(TaskMessage("t", 1))
    await rig.execution.run_one(rig.worker, delivery)
    assert rig.slot.handlers == ["h|pickle"] and rig.outcomes() == {"t": 1}


async def test_an_expired_task_is_given_up_unrun_and_one_not_expired_runs() -> None:
    rig = Rig(JobSettings(max_attempts=1))
    late, timely = await rig.deliveries(
        TaskMessage("late", 1, expires=1.0), TaskMessage("ok", 2, expires=4e9)
    )
    await rig.execution.run_one(rig.worker, late)
    await rig.execution.run_one(rig.worker, timely)
    expired, ran = rig.results.sent
    assert expired.gave_up and expired.error is not None and expired.error.type == "RunExpired"
    assert (ran.ok, ran.value) == (True, 2) and rig.slot.tasks_run == 1
    assert rig.dead.sent == []  # nothing to inspect: it never ran
    await eventually(lambda: rig.tasks.acked == [late.message, timely.message])
