"""How task ends are settled: acks after confirms, and held back while consuming stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from tests.unit.pipes.two_turn_leaf import TwoTurnLeaf
from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner
from truba.daemon.stats import JobStats
from truba.daemon.task_endings import TaskEndings
from truba.logs import ContextFilter, bind
from truba.pipes.base import Confirmation, Delivery
from truba.pipes.batch import ack_each
from truba.pipes.errors import PipeError
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.serialize import SerializeSender
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import GaveUpRecord, ResultCodec, ResultMessage, TaskMessage


def pipes(tasks: FakeListener[TaskMessage]) -> JobPipes:
    results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
    requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
    dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
    return JobPipes(tasks, results, requeue, dead)


async def test_acks_wait_while_held_and_go_out_when_the_hold_ends() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    ends = TaskEndings(pipes(tasks), "d1", JobStats())
    tasks.push(TaskMessage("t1", 1))
    delivery = await tasks.get(0.0)
    assert delivery is not None
    async with ends.hold():
        async with ends.hold():  # nested: released by the outer one only
            await ends.complete(delivery, ResultMessage("t1", True, 1, None, "d1", 0.0, 1))
        await asyncio.sleep(0.05)
        assert tasks.acked == [] and ends.in_flight == 1  # confirmed, but not acked yet
    assert await ends.wait(0, 1.0)
    assert tasks.acked == [TaskMessage("t1", 1)]


class RecordingListener(FakeListener[TaskMessage]):
    """Records whether acks were held when the runner cancelled the consumer."""

    held_at_cancel: bool | None = None
    ends: TaskEndings | None = None

    async def cancel(self) -> None:
        assert self.ends is not None
        self.held_at_cancel = not self.ends._open.is_set()


async def test_the_runner_holds_acks_back_while_it_cancels_its_consumer() -> None:
    # A quorum queue returns deliveries already on their way to a cancelled consumer, counting
    # an attempt: acks (which give the consumer credit for more) must not go out around basic.cancel.
    tasks = RecordingListener()
    runner = JobRunner("j1", "tests.handlers.basic:echo", "d1", pipes(tasks), print, cancel_quiet=0.01)
    tasks.ends = runner.ends
    await runner.close()
    assert tasks.held_at_cancel is True
    assert runner.ends._open.is_set()


async def test_confirm_and_ack_events_name_their_own_task_when_acks_queue_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The acker runs in the background for many ends in a row: each end's events must carry the
    # ids of its own task (they carried those of the task the acker was started for).
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", JobStats())
    caplog.handler.addFilter(ContextFilter())
    with caplog.at_level(logging.DEBUG, logger="truba.daemon"):
        for task_id, slot in (("t1", 0), ("t2", 1), ("t3", 0)):
            tasks.push(TaskMessage(task_id, 1))
            delivery = await tasks.get(0.0)
            assert delivery is not None
            with bind(task_id=task_id, slot=slot):
                await ends.complete(delivery, ResultMessage(task_id, True, 1, None, "d1", 0.0, 1))
        results.confirm()
        assert await ends.wait(0, 1.0)
    told = [(r.message, r.task_id, r.slot) for r in caplog.records]  # type: ignore[attr-defined]
    # Ends confirmed by their turn are acked as a run: each is told confirmed before acked.
    for task_id, slot in (("t1", 0), ("t2", 1), ("t3", 0)):
        assert [event for event in told if event[1] == task_id] == [
            ("daemon.task.confirmed", task_id, slot),
            ("daemon.task.acked", task_id, slot),
        ]
    assert len(told) == 6


async def test_a_lone_result_is_on_the_socket_before_the_worker_goes_on() -> None:
    # One task at a time, the worker's bookkeeping after a result (its ack queued, the next take)
    # ran before the result left: on the W2 round trip. Under load (other ends in flight) the
    # worker goes on at once: the loop is sending anyway.
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: TwoTurnLeaf[ResultMessage] = TwoTurnLeaf()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", JobStats())
    sent = []
    for task_id in ("t1", "t2"):
        tasks.push(TaskMessage(task_id, 1))
        delivery = await tasks.get(0.0)
        assert delivery is not None
        result = ResultMessage(task_id, True, 1, None, "d1", 0.0, 1)
        await ends.complete(delivery, result)
        sent.append(result)
        assert results.written == sent[:1]  # t1 alone: written; t2 behind t1's confirm: not yet
    results.confirm()
    assert await ends.wait(0, 1.0)
    assert results.written == sent
    await results.close()


async def test_a_result_held_for_a_frame_does_not_wait_to_leave() -> None:
    # A worker running chunks holds results for frames: none leaves alone, so waiting turns for
    # it would only cost the chunk's tasks loop iterations.
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: TwoTurnLeaf[ResultMessage] = TwoTurnLeaf()
    frames = FrameLimits()
    ends = TaskEndings(
        JobPipes(tasks, results, FakeSender(True), FakeSender(True), result_frames=frames), "d1", JobStats()
    )
    tasks.push(TaskMessage("t1", 1))
    delivery = await tasks.get(0.0)
    assert delivery is not None
    frames.hold()
    await ends.complete(delivery, ResultMessage("t1", True, 1, None, "d1", 0.0, 1))
    assert results.written == []
    frames.release()
    results.confirm()
    assert await ends.wait(0, 1.0)
    await results.close()


async def test_ends_confirmed_before_their_turn_are_acked_in_order_and_a_failed_one_rejected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Under load a frame's confirm settles many results before the acker reaches them: those
    # are acked without waiting (no coroutine per end), still in order, still counted; one whose
    # confirm failed among them goes back to the broker, told with its own task.
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender()
    stats = JobStats()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", stats)
    with caplog.at_level(logging.INFO, logger="truba.daemon"):
        for task_id in ("t1", "t2", "t3", "t4"):
            tasks.push(TaskMessage(task_id, 1))
            delivery = await tasks.get(0.0)
            assert delivery is not None
            await ends.complete(delivery, ResultMessage(task_id, True, 1, None, "d1", 0.0, 1))
        results.confirm(1)  # t1
        results.reject(1)  # t2: nacked (it stays unconfirmed, first in line)
        results.confirm()  # t2 already failed; t3, t4 confirmed
        assert await ends.wait(0, 1.0)
    assert tasks.acked == [TaskMessage("t1", 1), TaskMessage("t3", 1), TaskMessage("t4", 1)]
    assert tasks.rejected == [(TaskMessage("t2", 1), True)]
    assert (stats.done, stats.failed) == (3, 0)
    unconfirmed = [r for r in caplog.records if r.message == "daemon.task.unconfirmed"]
    assert [r.task_id for r in unconfirmed] == ["t2"]  # type: ignore[attr-defined]


async def test_acks_of_ends_confirmed_meanwhile_still_wait_for_a_hold() -> None:
    tasks: FakeListener[TaskMessage] = FakeListener()
    results: FakeSender[ResultMessage] = FakeSender()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", JobStats())
    async with ends.hold():
        for task_id in ("t1", "t2"):
            tasks.push(TaskMessage(task_id, 1))
            delivery = await tasks.get(0.0)
            assert delivery is not None
            await ends.complete(delivery, ResultMessage(task_id, True, 1, None, "d1", 0.0, 1))
        results.confirm()
        await asyncio.sleep(0.02)
        assert tasks.acked == [] and ends.in_flight == 2
    assert await ends.wait(0, 1.0)
    assert tasks.acked == [TaskMessage("t1", 1), TaskMessage("t2", 1)]


class BatchResults(FakeSender[ResultMessage]):
    """Results taken in batches (``send_many``), each batch noted."""

    def __init__(self, auto_confirm: bool = False) -> None:
        super().__init__(auto_confirm)
        self.batches: list[list[str]] = []

    async def send_many(self, messages: Sequence[ResultMessage]) -> list[Confirmation]:
        self.batches.append([message.task_id for message in messages])
        return [await self.send(message) for message in messages]


class BatchAcks(FakeListener[TaskMessage]):
    """Tasks acked in batches (``ack_many``), each batch noted."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def ack_many(self, deliveries: Sequence[Delivery[TaskMessage]]) -> list[PipeError]:
        self.batches.append([delivery.message.task_id for delivery in deliveries])
        return await ack_each(deliveries)


async def _deliveries(tasks: FakeListener[TaskMessage], *task_ids: str) -> list[Delivery[TaskMessage]]:
    for task_id in task_ids:
        tasks.push(TaskMessage(task_id, 1))
    got = [await tasks.get(0.0) for _ in task_ids]
    return [delivery for delivery in got if delivery is not None]


def _result(task_id: str) -> ResultMessage:
    return ResultMessage(task_id, True, 1, None, "d1", 0.0, 1)


async def test_results_completed_together_go_in_one_batch_and_are_acked_in_one_after_their_confirms() -> None:
    tasks = BatchAcks()
    results = BatchResults()
    stats = JobStats()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", stats)
    deliveries = await _deliveries(tasks, "t1", "t2", "t3")
    await ends.complete_many([(d, _result(d.message.task_id)) for d in deliveries])
    assert results.batches == [["t1", "t2", "t3"]]
    await asyncio.sleep(0.02)
    assert tasks.acked == [] and ends.in_flight == 3  # nothing acked before its confirm
    results.confirm()
    assert await ends.wait(0, 1.0)
    assert tasks.batches == [["t1", "t2", "t3"]]
    assert [t.task_id for t in tasks.acked] == ["t1", "t2", "t3"] and stats.done == 3


async def test_a_batch_acks_only_the_confirmed_run_and_a_failed_confirm_is_rejected_on_its_own() -> None:
    tasks = BatchAcks()
    results = BatchResults()
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", JobStats())
    deliveries = await _deliveries(tasks, "t1", "t2", "t3", "t4")
    await ends.complete_many([(d, _result(d.message.task_id)) for d in deliveries])
    results.confirm(2)  # t1, t2
    results.reject(1)  # t3: nacked
    results.confirm()  # t4 (t3 already failed)
    assert await ends.wait(0, 1.0)
    assert [t.task_id for t in tasks.acked] == ["t1", "t2", "t4"]
    assert tasks.rejected == [(TaskMessage("t3", 1), True)]
    assert ["t3"] not in tasks.batches and ["t4"] in tasks.batches


async def test_a_result_too_large_in_a_batch_is_sent_as_its_error_and_the_others_as_they_are() -> None:
    tasks = BatchAcks()
    leaf: FakeSender[bytes] = FakeSender(auto_confirm=True)  # cannot batch: one by one below serialize
    results = SerializeSender(leaf, ResultCodec(), max_size=200)
    ends = TaskEndings(JobPipes(tasks, results, FakeSender(True), FakeSender(True)), "d1", JobStats())
    deliveries = await _deliveries(tasks, "t1", "t2", "t3")
    big = ResultMessage("t2", True, b"x" * 500, None, "d1", 0.0, 1)
    await ends.complete_many(
        [(deliveries[0], _result("t1")), (deliveries[1], big), (deliveries[2], _result("t3"))]
    )
    assert await ends.wait(0, 1.0)
    sent = [ResultCodec().decode(data) for data in leaf.sent]
    assert [(r.task_id, r.ok) for r in sent] == [("t1", True), ("t2", False), ("t3", True)]
    assert sent[1].error is not None and "could not be sent" in sent[1].error.message
    assert [t.task_id for t in tasks.acked] == ["t1", "t2", "t3"]
