"""Issue 18: a frame member put back into its queue leaves a hand-back record in the job's result
log once its copy is confirmed, and a redelivered frame skips the copies recorded there.

Over the daemon's real job pipes on a FakeBroker (the integration twin, on RabbitMQ through a
fault proxy, is tests/integration/test_frame_hand_back.py), over fake senders for the order of
copy, ack and record, and over the daemon's records (one sender per job, shared by its runners).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from tests.waiting import eventually
from truba.daemon.hand_back_records import HandBackRecords, JobRecords
from truba.daemon.job_pipes import JobPipes, Wanted, copy_key, open_job_pipes
from truba.daemon.settings import JobSettings
from truba.daemon.stats import JobStats
from truba.daemon.task_endings import TaskEndings
from truba.pipes.base import Delivery
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import ChannelLost, MessageRejected
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.frame import pack
from truba.pipes.log import LogSender
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
    new_copy_id,
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
    assert pipes.handed_back is not None
    assert await pipes.handed_back.flush(5)  # the records are confirmed (the acks did not wait)


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
    assert all(d.framed for d in taken.values())
    await _hand_back(doomed, taken["back-1"], taken["back-2"])
    records = _records(broker)
    assert [(r.task_id, r.original) for r in records] == [("back-1", 0), ("back-2", 0)]
    await _die(broker, doomed)  # before "running" ended: the frame is redelivered whole

    heir = open_job_pipes([broker], _wanted(priorities=priorities), Window(10))
    try:
        got = await _take(heir, 10, timeout=1.0)
        assert Counter(d.message.task_id for d in got) == {"running": 1, "back-1": 1, "back-2": 1}
        by_id = {d.message.task_id: d.message for d in got}
        # The copies: the copy ids the records name, the same attempt count (nothing spent) and priority.
        for record in records:
            assert by_id[record.task_id] == TaskMessage(record.task_id, None, priority=3, copy_id=record.copy)
            assert record.copy != 0
        assert by_id["running"].copy_id == 0  # the member that was not handed back runs again
        for delivery in got:
            await delivery.ack()
        await eventually(lambda: broker.messages(TASKS) == [])  # the skipped members were acked
    finally:
        await heir.close()


async def test_a_copy_redelivered_in_a_frame_of_its_own_runs_unless_it_was_handed_back_too(
    broker: FakeBroker,
) -> None:
    # A record names the copy handed back, never the task: a frame of copies (a preempted
    # runner's requeues are framed) that comes back redelivered still runs them, but a copy that
    # was itself handed back runs as its own copy only.
    a, b, b2 = new_copy_id(), new_copy_id(), new_copy_id()
    log = await broker.sender(LOG)
    for record in (HandedBack("a", 0, a), HandedBack("b", 0, b), HandedBack("b", b, b2)):
        await (await log.send(HandedBackCodec().encode(record)))
    await _publish(broker, TaskMessage("a", None, copy_id=a), TaskMessage("b", None, copy_id=b))
    await _publish(broker, TaskMessage("b", None, copy_id=b2))  # b's second copy, alone
    doomed = open_job_pipes([broker], _wanted(), Window(10))
    assert len(await _take(doomed, 3)) == 3
    await _die(broker, doomed)

    heir = open_job_pipes([broker], _wanted(), Window(10))
    try:
        got = sorted((d.message.task_id, d.message.copy_id) for d in await _take(heir, 10, timeout=1.0))
        assert got == [("a", a), ("b", b2)]
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
        # (its results' channel opens at once and declares the log again, empty: gone again
        # before the heir meets the redelivered frame)
        for _ in range(500):
            if await broker.has_queue(LOG):
                break
            await asyncio.sleep(0.001)
        broker.drop_queue(LOG)
        with caplog.at_level(logging.WARNING, logger="truba.pipes"):
            got = await _take(heir, 10, timeout=1.0)
        # At least once: the frame's member and its copy both run.
        assert sorted((d.message.task_id, d.message.copy_id != 0) for d in got) == [
            ("back", False),
            ("back", True),
            ("running", False),
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
        ends = TaskEndings(pipes, "d1", JobStats())
        await ends.requeue(taken["back"], taken["back"].message, "held")
        assert await ends.wait(0, timeout=5)
        assert broker.messages(LOG) == []
    finally:
        await pipes.close()


async def test_a_lone_message_put_back_gets_no_record(broker: FakeBroker) -> None:
    # It is acked as soon as its copy is confirmed, not held by other members of a frame.
    await _publish(broker, TaskMessage("alone", None))
    pipes = open_job_pipes([broker], _wanted(), Window(1))
    try:
        [delivery] = await _take(pipes, 1)
        assert not delivery.framed
        await _hand_back(pipes, delivery)
        assert _records(broker) == []
        assert pipes.handed_back is not None and not pipes.handed_back.opened  # not even opened
        [copy] = [TaskCodec().decode(body) for body in broker.messages(TASKS)]
        assert copy.task_id == "alone" and copy.copy_id != 0
    finally:
        await pipes.close()


async def test_a_frame_handed_back_whole_is_acked_and_needs_no_record(broker: FakeBroker) -> None:
    # A closing runner hands back every member it holds: the frame is acked before their records'
    # turn, is never redelivered, so the records are dropped (no traffic for them).
    await _publish(broker, TaskMessage("back-1", None), TaskMessage("back-2", None))
    pipes = open_job_pipes([broker], _wanted(), Window(1))
    try:
        taken = await _take(pipes, 2)
        await _hand_back(pipes, *taken)
        assert not any(d.framed for d in taken)  # their frame is settled
        assert _records(broker) == []
        assert pipes.handed_back is not None and pipes.handed_back.unneeded == 2
        copies = sorted(TaskCodec().decode(body).task_id for body in broker.messages(TASKS))
        assert copies == ["back-1", "back-2"]  # only the copies are left in the queue
    finally:
        await pipes.close()


def test_a_copys_key_is_never_a_results_key() -> None:
    task = TaskMessage("t1", None, copy_id=2)
    key = copy_key(TaskCodec().encode(task))
    assert key is not None and key != "t1" and key == copy_key(TaskCodec().encode(task))
    assert key != copy_key(TaskCodec().encode(TaskMessage("t1", None, copy_id=3)))
    assert copy_key(b"not a task") is None


# -- the order of copy, ack and record --------------------------------------------------------


class _Rig:
    def __init__(self) -> None:
        self.tasks: FakeListener[TaskMessage] = FakeListener()
        self.requeue: FakeSender[TaskMessage] = FakeSender()
        self.records: FakeSender[HandedBack] = FakeSender()
        self.job_records = JobRecords("j1", lambda: self.records)
        results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        pipes = JobPipes(self.tasks, results, self.requeue, dead, handed_back=self.job_records)
        self.ends = TaskEndings(pipes, "d1", JobStats())

    async def put_back(self, task: TaskMessage, *, framed: bool = True) -> None:
        self.tasks.push(task, framed=framed)
        delivery = await self.tasks.get(0.0)
        assert delivery is not None
        await self.ends.requeue(delivery, task, "held")


async def test_the_record_goes_out_only_after_the_copy_is_confirmed_and_the_ack_does_not_wait_for_it() -> (
    None
):
    rig = _Rig()
    original = new_copy_id()
    await rig.put_back(TaskMessage("t1", None, attempts=1, copy_id=original))
    [copy] = rig.requeue.sent
    assert copy.copy_id not in (0, original)
    assert copy == TaskMessage("t1", None, attempts=1, copy_id=copy.copy_id)
    await asyncio.sleep(0.02)
    assert rig.records.sent == [] and rig.tasks.acked == []  # the copy is not confirmed yet
    rig.requeue.confirm()
    # Acked without the record's confirm; the record goes out, naming the copy it replaced.
    assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None, attempts=1, copy_id=original)]
    await eventually(lambda: rig.records.sent == [HandedBack("t1", original, copy.copy_id)])
    assert not await rig.job_records.flush(0.05)  # still unconfirmed: nothing waits for it
    rig.records.confirm()
    assert await rig.job_records.flush(1) and rig.job_records.sent == 1


async def test_a_lone_delivery_put_back_gets_no_record() -> None:
    rig = _Rig()
    await rig.put_back(TaskMessage("t1", None), framed=False)
    rig.requeue.confirm()
    assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None)]
    await asyncio.sleep(0.02)
    assert rig.records.sent == [] and not rig.job_records.opened


async def test_a_copy_that_fails_leaves_no_record_and_the_task_goes_back_to_the_broker() -> None:
    rig = _Rig()
    await rig.put_back(TaskMessage("t1", None))
    rig.requeue.reject()
    assert await rig.ends.wait(0, timeout=1)
    await asyncio.sleep(0.02)
    assert rig.records.sent == [] and rig.tasks.acked == []
    assert rig.tasks.rejected == [(TaskMessage("t1", None), True)]


async def test_a_record_that_fails_is_logged_and_the_task_is_acked_anyway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its frame, if redelivered, runs it once more (twice in all): never zero times.
    rig = _Rig()
    rig.records.fail_next(MessageRejected("the log refused it"))
    with caplog.at_level(logging.WARNING, logger="truba.daemon"):
        await rig.put_back(TaskMessage("t1", None))
        rig.requeue.confirm()
        assert await rig.ends.wait(0, timeout=1)
        assert await rig.job_records.flush(1)
    assert rig.tasks.acked == [TaskMessage("t1", None)]
    assert "daemon.task.hand_back_unrecorded" in caplog.text


async def test_a_broken_record_sender_still_acks_the_task() -> None:
    rig = _Rig()
    rig.records.break_(ChannelLost("gone"))
    await rig.put_back(TaskMessage("t1", None))
    rig.requeue.confirm()
    assert await rig.ends.wait(0, timeout=1)
    assert rig.tasks.acked == [TaskMessage("t1", None)]
    assert await rig.job_records.flush(1)


# -- one records sender per job and daemon ----------------------------------------------------


async def test_a_jobs_records_open_their_sender_on_the_first_record_and_send_in_order() -> None:
    opened: list[FakeSender[HandedBack]] = []

    def open_sender() -> FakeSender[HandedBack]:
        opened.append(FakeSender(auto_confirm=True))
        return opened[-1]

    records = JobRecords("j1", open_sender)
    assert opened == [] and not records.opened
    batch = [HandedBack(f"t{i}", 0, new_copy_id()) for i in range(50)]
    for record in batch:
        records.record(record)
    assert await records.flush(1)
    assert len(opened) == 1 and opened[0].sent == batch and records.sent == 50
    await records.close()
    assert opened[0].closed
    records.record(HandedBack("late", 0, 1))  # after close: dropped (logged), not sent
    assert opened[0].sent == batch


async def test_a_daemon_shares_a_jobs_records_across_runners_and_closes_them_a_while_after_it_left(
    broker: FakeBroker,
) -> None:
    daemon = HandBackRecords(linger=0.2)
    spec = QueueSpec(LOG, kind="stream")
    first = daemon.for_job("j1", [broker], spec)
    assert first is not None
    assert daemon.for_job("j1", [broker], spec) is first  # a second runner of the job
    assert daemon.for_job("j2", [broker], spec) is not first
    assert daemon.for_job("j3", [broker], None) is None  # no result log: no records
    first.record(HandedBack("t1", 0, 7))
    assert await first.flush(2)
    daemon.left("j1")
    await asyncio.sleep(0.05)
    assert daemon.for_job("j1", [broker], spec) is first  # back within the linger: kept
    daemon.left("j1")
    await asyncio.sleep(0.4)
    again = daemon.for_job("j1", [broker], spec)
    assert again is not None and again is not first  # closed after the linger, a new one now
    first.record(HandedBack("t2", 0, 8))  # the closed one sends nothing more
    await daemon.close()
    assert [(r.task_id, r.copy) for r in _records(broker)] == [("t1", 7)]


def test_a_hand_back_record_is_no_result_and_a_result_is_no_hand_back_record() -> None:
    record = HandedBackCodec().encode(HandedBack("t1", 3, 4))
    assert HandedBackCodec().decode(record) == HandedBack("t1", 3, 4)
    with pytest.raises(Exception, match="result"):
        ResultCodec().decode(record)
    result = ResultCodec().encode(ResultMessage("t1", True, 1, None, "d1", 0.0, 1))
    with pytest.raises(Exception, match="hand-back record"):
        HandedBackCodec().decode(result)


def test_a_tasks_copy_id_travels_in_its_body_and_a_clients_task_is_copy_0() -> None:
    codec = TaskCodec()
    copy_id = new_copy_id()
    assert 0 < copy_id < 2**63
    assert codec.decode(codec.encode(TaskMessage("t", [1], copy_id=copy_id))).copy_id == copy_id
    fresh = TaskMessage("t", [1])
    assert codec.encode(fresh) == codec.encode(TaskMessage("t", [1], copy_id=0))  # unchanged bytes
    assert codec.decode(codec.encode(fresh)).copy_id == 0
    assert len({new_copy_id() for _ in range(1000)}) == 1000


async def test_results_confirms_are_watched_by_the_acker_not_the_log_layer(broker: FakeBroker) -> None:
    # The acker awaits each result's confirmation and logs a failed one with its task
    # (daemon.task.unconfirmed): the results' log layer adds no callback per message.
    pipes = open_job_pipes([broker], _wanted(), Window(1))
    try:
        layer: object = pipes.results
        while not isinstance(layer, LogSender):
            layer = layer.inner  # type: ignore[attr-defined]
        assert layer.role == "results" and layer.confirms is False
    finally:
        await pipes.close()
