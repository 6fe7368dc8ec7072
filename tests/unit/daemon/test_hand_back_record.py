"""Issue 18: a task put back into its queue leaves a hand-back record in the job's result log once
its copy is confirmed, and a redelivered frame skips the versions recorded there.

Over the daemon's real job pipes on a FakeBroker (the integration twin, on RabbitMQ through a
fault proxy, is tests/integration/test_frame_hand_back.py), and over fake senders for the order
of copy, record and ack.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from tests.waiting import eventually
from truba.daemon.job_pipes import JobPipes, Wanted, open_job_pipes, version_key
from truba.daemon.settings import JobSettings
from truba.daemon.stats import JobStats
from truba.daemon.task_endings import TaskEndings
from truba.pipes.base import Delivery
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import ChannelLost, MessageRejected
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.frame import pack
from truba.pipes.prefetch import Window
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import (
    GaveUpRecord,
    HandedBack,
    HandedBackCodec,
    ResultCodec,
    ResultMessage,
    TaskCodec,
    TaskMessage,
)

TASKS, RESULTS, DEAD, LOG = "j.tasks", "j.results", "j.dead", "j.done"


def _wanted(*, priorities: bool = False, result_log: bool = True) -> Wanted:
    return Wanted(
        handler="tests.handlers.basic:echo",
        slots=1,
        tasks_queue=TASKS,
        results_queue=RESULTS,
        dead_queue=DEAD,
        settings=JobSettings(priorities=priorities),
        result_log=QueueSpec(LOG, kind="stream") if result_log else None,
    )


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    made = FakeBroker()
    await made.declare(QueueSpec(DEAD, kind="classic"))
    await made.declare(QueueSpec(TASKS, dead_letter_to=DEAD))
    await made.declare(QueueSpec(RESULTS, dead_letter_to=DEAD))
    await made.declare(QueueSpec(LOG, kind="stream"))
    yield made
    await made.close()


async def _publish(broker: FakeBroker, *tasks: TaskMessage) -> None:
    """One AMQP message: the tasks in one frame (a lone one as itself)."""
    bodies = [TaskCodec().encode(task) for task in tasks]
    sender = await broker.sender(TASKS)
    await (await sender.send(bodies[0] if len(bodies) == 1 else pack(bodies)))
    await sender.close()


async def _take(pipes: JobPipes, count: int, timeout: float = 2.0) -> list[Delivery[TaskMessage]]:
    taken: list[Delivery[TaskMessage]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(taken) < count and loop.time() < deadline:
        if (delivery := await pipes.tasks.get(0.05)) is not None:
            taken.append(delivery)
    return taken


async def _hand_back(pipes: JobPipes, *deliveries: Delivery[TaskMessage]) -> None:
    """What the daemon does with members held too long: puts them back, unspent."""
    ends = TaskEndings(pipes, "d-doomed", JobStats())
    for delivery in deliveries:
        await ends.requeue(delivery, delivery.message, "held")
    assert await ends.wait(0, timeout=5)


async def _die(broker: FakeBroker, pipes: JobPipes) -> None:
    """The daemon's connection breaks (its unsettled deliveries go back) and it stays away."""
    broker.refuse()
    broker.break_connection()
    await pipes.close()
    broker.refuse(False)


def _records(broker: FakeBroker) -> list[HandedBack]:
    found: list[HandedBack] = []
    for body in broker.messages(LOG):
        try:
            found.append(HandedBackCodec().decode(body))
        except Exception:  # a result copied there
            continue
    return found


@pytest.mark.parametrize("priorities", [False, True])
async def test_members_handed_back_before_their_frame_came_back_run_only_as_their_copies(
    broker: FakeBroker, priorities: bool
) -> None:
    await _publish(broker, *(TaskMessage(i, None, priority=3) for i in ("running", "back-1", "back-2")))
    doomed = open_job_pipes([broker], _wanted(priorities=priorities), Window(1))
    taken = {d.message.task_id: d for d in await _take(doomed, 3)}
    await _hand_back(doomed, taken["back-1"], taken["back-2"])
    assert _records(broker) == [HandedBack("back-1", 0), HandedBack("back-2", 0)]
    await _die(broker, doomed)  # before "running" ended: the frame is redelivered whole

    heir = open_job_pipes([broker], _wanted(priorities=priorities), Window(10))
    try:
        got = await _take(heir, 10, timeout=1.0)
        assert Counter(d.message.task_id for d in got) == {"running": 1, "back-1": 1, "back-2": 1}
        by_id = {d.message.task_id: d.message for d in got}
        # The copies: the next version, the same attempt count (nothing spent) and priority.
        assert by_id["back-1"] == TaskMessage("back-1", None, priority=3, requeues=1)
        assert by_id["back-2"] == TaskMessage("back-2", None, priority=3, requeues=1)
        assert by_id["running"].requeues == 0  # the member that was not handed back runs again
        for delivery in got:
            await delivery.ack()
        await eventually(lambda: broker.messages(TASKS) == [])  # the skipped members were acked
    finally:
        await heir.close()


async def test_a_copy_redelivered_in_a_frame_of_its_own_runs_unless_it_was_handed_back_too(
    broker: FakeBroker,
) -> None:
    # The record of a hand-back names the version handed back, never its copy: a frame of copies
    # (a preempted runner's requeues are framed) that comes back redelivered still runs them,
    # but a copy that was itself handed back runs as its own copy only.
    log = await broker.sender(LOG)
    for task_id in ("a", "b"):
        await (await log.send(HandedBackCodec().encode(HandedBack(task_id, 0))))
    await (await log.send(HandedBackCodec().encode(HandedBack("b", 1))))
    await _publish(broker, TaskMessage("a", None, requeues=1), TaskMessage("b", None, requeues=1))
    await _publish(broker, TaskMessage("b", None, requeues=2))  # b's second copy
    doomed = open_job_pipes([broker], _wanted(), Window(10))
    assert len(await _take(doomed, 3)) == 3
    await _die(broker, doomed)

    heir = open_job_pipes([broker], _wanted(), Window(10))
    try:
        got = sorted((d.message.task_id, d.message.requeues) for d in await _take(heir, 10, timeout=1.0))
        assert got == [("a", 1), ("b", 2)]
    finally:
        await heir.close()


async def test_without_a_readable_log_a_handed_back_member_runs_again_never_not_at_all(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    await _publish(broker, TaskMessage("running", None), TaskMessage("back", None))
    doomed = open_job_pipes([broker], _wanted(), Window(1))
    taken = {d.message.task_id: d for d in await _take(doomed, 2)}
    await _hand_back(doomed, taken["back"])
    await _die(broker, doomed)
    broker.drop_queue(LOG)  # the log is gone (or its broker does not answer)

    heir = open_job_pipes([broker], _wanted(), Window(10))
    try:
        with caplog.at_level(logging.WARNING, logger="truba.pipes"):
            got = await _take(heir, 10, timeout=1.0)
        # At least once: the frame's version and the copy both run.
        assert sorted((d.message.task_id, d.message.requeues) for d in got) == [
            ("back", 0),
            ("back", 1),
            ("running", 0),
        ]
        assert "pipe.result_log.unread" in caplog.text
    finally:
        await heir.close()


async def test_a_job_without_a_result_log_puts_tasks_back_without_a_record(broker: FakeBroker) -> None:
    await _publish(broker, TaskMessage("running", None), TaskMessage("back", None))
    pipes = open_job_pipes([broker], _wanted(result_log=False), Window(1))
    try:
        assert pipes.handed_back is None
        taken = {d.message.task_id: d for d in await _take(pipes, 2)}
        await _hand_back(pipes, taken["back"])
        assert broker.messages(LOG) == []
    finally:
        await pipes.close()


def test_a_versions_key_is_never_a_results_key() -> None:
    task = TaskMessage("t1", None, requeues=2)
    key = version_key(TaskCodec().encode(task))
    assert key is not None and key != "t1" and key == version_key(TaskCodec().encode(task))
    assert key != version_key(TaskCodec().encode(TaskMessage("t1", None, requeues=3)))
    assert version_key(b"not a task") is None


# -- the order of copy, record and ack --------------------------------------------------------


class _Rig:
    def __init__(self) -> None:
        self.tasks: FakeListener[TaskMessage] = FakeListener()
        self.requeue: FakeSender[TaskMessage] = FakeSender()
        self.records: FakeSender[HandedBack] = FakeSender()
        results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        pipes = JobPipes(self.tasks, results, self.requeue, dead, handed_back=self.records)
        self.ends = TaskEndings(pipes, "d1", JobStats())

    async def put_back(self, task: TaskMessage) -> None:
        self.tasks.push(task)
        delivery = await self.tasks.get(0.0)
        assert delivery is not None
        await self.ends.requeue(delivery, task, "held")


async def test_the_record_goes_out_only_after_the_copy_is_confirmed_and_the_ack_after_the_record() -> None:
    rig = _Rig()
    await rig.put_back(TaskMessage("t1", None, attempts=1, requeues=4))
    assert rig.requeue.sent == [TaskMessage("t1", None, attempts=1, requeues=5)]
    await asyncio.sleep(0.02)
    assert rig.records.sent == []  # the copy is not confirmed yet: no record
    rig.requeue.confirm()
    await eventually(lambda: rig.records.sent == [HandedBack("t1", 4)])
    await asyncio.sleep(0.02)
    assert rig.tasks.acked == []  # the record is not confirmed yet: the member stays unsettled
    rig.records.confirm()
    assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None, attempts=1, requeues=4)]


async def test_a_copy_that_fails_leaves_no_record_and_the_task_goes_back_to_the_broker() -> None:
    rig = _Rig()
    await rig.put_back(TaskMessage("t1", None))
    rig.requeue.reject()
    assert await rig.ends.wait(0, timeout=1)
    assert rig.records.sent == [] and rig.tasks.acked == []
    assert rig.tasks.rejected == [(TaskMessage("t1", None), True)]


async def test_a_record_that_fails_still_acks_the_task_whose_copy_is_confirmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its frame, if redelivered, runs it once more (twice in all): never zero times.
    rig = _Rig()
    rig.records.fail_next(MessageRejected("the log refused it"))
    with caplog.at_level(logging.WARNING, logger="truba.daemon"):
        await rig.put_back(TaskMessage("t1", None))
        rig.requeue.confirm()
        assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None)]
    assert "daemon.task.hand_back_unrecorded" in caplog.text


async def test_a_broken_record_sender_still_acks_the_task() -> None:
    rig = _Rig()
    rig.records.break_(ChannelLost("gone"))
    await rig.put_back(TaskMessage("t1", None))
    rig.requeue.confirm()
    assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None)]


def test_a_hand_back_record_is_no_result_and_a_result_is_no_hand_back_record() -> None:
    record = HandedBackCodec().encode(HandedBack("t1", 3))
    assert HandedBackCodec().decode(record) == HandedBack("t1", 3)
    with pytest.raises(Exception, match="result"):
        ResultCodec().decode(record)
    result = ResultCodec().encode(ResultMessage("t1", True, 1, None, "d1", 0.0, 1))
    with pytest.raises(Exception, match="hand-back record"):
        HandedBackCodec().decode(result)


def test_a_tasks_version_travels_in_its_body_and_an_old_task_is_version_0() -> None:
    codec = TaskCodec()
    assert codec.decode(codec.encode(TaskMessage("t", [1], requeues=7))).requeues == 7
    fresh = TaskMessage("t", [1])
    assert codec.encode(fresh) == codec.encode(TaskMessage("t", [1], requeues=0))  # unchanged bytes
    assert codec.decode(codec.encode(fresh)).requeues == 0
