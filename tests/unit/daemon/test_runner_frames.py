"""A runner fed task frames: members spread over its slots; held long tasks go back (late binding)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from tests.waiting import eventually
from truba.daemon.intake import CHUNK
from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner
from truba.daemon.slot_process import SlotProcess
from truba.daemon.task_events import sampled
from truba.logs import ContextFilter
from truba.pipes.base import Confirmation
from truba.pipes.frame import FrameLimits, FrameListener, pack
from truba.pipes.serialize import DeserializeListener
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import GaveUpRecord, ResultMessage, TaskCodec, TaskMessage

CODEC = TaskCodec()


class HoldWatch(FakeSender[ResultMessage]):
    """Results, each noted with whether the results' frames were held when it was sent."""

    def __init__(self, limits: FrameLimits) -> None:
        super().__init__(auto_confirm=True)
        self.limits = limits
        self.held: dict[str, bool] = {}

    async def send(self, message: ResultMessage) -> Confirmation:
        self.held[message.task_id] = self.limits.holding
        return await super().send(message)


class Framed:
    """A runner (of ``handler``, one that sleeps its payload's seconds) whose task pipe carries frames."""

    def __init__(self, slots: int, handler: str = "tests.handlers.basic:sleep") -> None:
        self.wire: FakeListener[bytes] = FakeListener()
        self.result_frames = FrameLimits()
        self.results = HoldWatch(self.result_frames)
        self.requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        unframe = FrameListener(self.wire)
        tasks = DeserializeListener(unframe, CODEC)
        pipes = JobPipes(
            tasks, self.results, self.requeue, dead, result_frames=self.result_frames, task_frames=unframe
        )
        self.runner = JobRunner("j1", handler, "d1", pipes, lambda slot: None, target=slots)
        self.slots = [SlotProcess(i) for i in range(slots)]
        for slot in self.slots:
            self.runner.add_worker(slot)

    def push_frame(self, *tasks: TaskMessage) -> bytes:
        frame = pack([CODEC.encode(task) for task in tasks])
        self.wire.push(frame)
        return frame

    async def close(self) -> None:
        self.runner.stop_now()
        await self.runner.close()
        for slot in self.slots:
            await slot.stop()


@pytest.fixture
async def framed() -> AsyncIterator[list[Framed]]:
    made: list[Framed] = []
    yield made
    for rig in made:
        await rig.close()


async def test_members_of_a_frame_run_on_every_free_slot_and_the_frame_is_acked_once(
    framed: list[Framed],
) -> None:
    rig = Framed(slots=2, handler="tests.handlers.faults:pid")  # each result: its slot's pid
    framed.append(rig)
    frame = rig.push_frame(*(TaskMessage(f"t{i}", 0.02) for i in range(8)))
    await eventually(lambda: len(rig.results.sent) == 8, timeout=10)
    assert len({r.value for r in rig.results.sent}) == 2  # both slots ran members of the frame
    await eventually(lambda: rig.wire.acked == [frame])
    assert rig.requeue.sent == []  # the slots kept taking tasks: nothing was handed back


async def test_members_held_behind_long_tasks_go_back_unspent_for_another_daemon(
    framed: list[Framed],
) -> None:
    rig = Framed(slots=1)
    framed.append(rig)
    frame = rig.push_frame(*(TaskMessage(f"long{i}", 1.0) for i in range(3)))
    await eventually(lambda: len(rig.requeue.sent) == 2, timeout=1.0)  # within hold_limit + a check
    assert sorted(t.task_id for t in rig.requeue.sent) == ["long1", "long2"]
    assert all(t.attempts == 0 for t in rig.requeue.sent)  # unspent
    await eventually(lambda: len(rig.results.sent) == 1, timeout=5)
    await eventually(lambda: rig.wire.acked == [frame])  # run, handed back: the frame is settled
    await asyncio.sleep(0.2)
    assert [r.task_id for r in rig.results.sent] == ["long0"]


def _count_sends(slot: SlotProcess) -> list[int]:
    """Records how many tasks each hand-over to ``slot`` carried."""
    sizes: list[int] = []
    send = slot.send

    async def counting(handler: str, tasks: Sequence[tuple[str, object]]) -> None:
        sizes.append(len(tasks))
        await send(handler, tasks)

    slot.send = counting  # type: ignore[method-assign]
    return sizes


async def _warmed_on_one_slot(framed: list[Framed]) -> tuple[Framed, list[int]]:
    """A runner of one slot (``behave``) that ran one short task alone, so it knows they are
    short; and the sizes of the hand-overs to its slot from now on."""
    rig = Framed(slots=1, handler="tests.handlers.basic:behave")
    framed.append(rig)
    sizes = _count_sends(rig.slots[0])
    rig.push_frame(TaskMessage("warm", ["ok", 0]))
    await eventually(lambda: len(rig.results.sent) == 1, timeout=10)
    assert sizes == []  # the first one ran alone
    return rig, sizes


async def test_short_tasks_go_to_the_slot_several_per_write_each_with_its_own_outcome(
    framed: list[Framed],
) -> None:
    rig, sizes = await _warmed_on_one_slot(framed)
    frame = rig.push_frame(
        *(TaskMessage(f"t{i}", ["raise", "no"] if i == 5 else ["ok", i]) for i in range(CHUNK + 12))
    )
    await eventually(lambda: len(rig.results.sent) == CHUNK + 13, timeout=10)
    assert max(sizes) == CHUNK and sum(sizes) <= CHUNK + 12  # chunks of at most CHUNK, the rest alone
    outcomes = {r.task_id: r for r in rig.results.sent}
    count = CHUNK + 12
    assert [outcomes[f"t{i}"].value for i in range(count) if i != 5] == [i for i in range(count) if i != 5]
    assert not outcomes["t5"].ok and outcomes["t5"].error is not None
    assert outcomes["t5"].error.message == "no"
    assert all(r.attempts == 1 for r in rig.results.sent)
    await eventually(lambda: frame in rig.wire.acked)
    assert rig.requeue.sent == []
    # Results of chunks with more members in hand wait for frames; a lone task's goes alone.
    assert not rig.results.held["warm"] and sum(rig.results.held.values()) >= 8
    assert not rig.result_frames.holding  # every hold was released with the last chunk


async def test_a_member_that_cannot_be_decoded_ends_a_chunk_and_is_dead_lettered_the_rest_run(
    framed: list[Framed],
) -> None:
    rig, sizes = await _warmed_on_one_slot(framed)
    good = [CODEC.encode(TaskMessage(f"t{i}", ["ok", i])) for i in range(12)]
    frame = pack([*good[:6], b"\xc1garbage", *good[6:]])
    rig.wire.push(frame)
    await eventually(lambda: len(rig.results.sent) == 13, timeout=10)
    # Chunks are taken at hand up to the poison member; the next take dead-letters it
    assert sorted(r.task_id for r in rig.results.sent[1:]) == sorted(f"t{i}" for i in range(12))
    assert all(r.ok for r in rig.results.sent) and max(sizes) > 1
    # (no dead-letter sender here: the broker's DLX gets the frame, once every member is settled)
    await eventually(lambda: rig.wire.rejected == [(frame, False)])
    assert frame not in rig.wire.acked


async def test_a_slot_dying_mid_chunk_spends_the_running_task_and_returns_the_rest_unspent(
    framed: list[Framed],
) -> None:
    rig = Framed(slots=1, handler="tests.handlers.basic:behave")
    framed.append(rig)
    sizes = _count_sends(rig.slots[0])
    rig.push_frame(TaskMessage("warm", ["ok", 0]))
    await eventually(lambda: len(rig.results.sent) == 1, timeout=10)
    tasks = [TaskMessage(f"t{i}", ["exit", 3] if i == 2 else ["ok", i]) for i in range(6)]
    frame = rig.push_frame(*tasks)
    await eventually(lambda: len(rig.results.sent) + len(rig.requeue.sent) == 7, timeout=10)
    assert sizes[0] == 6  # all six handed over in one write
    assert sorted(r.task_id for r in rig.results.sent) == ["t0", "t1", "warm"]
    back = {t.task_id: t.attempts for t in rig.requeue.sent}
    # t2 killed its slot: one attempt spent; t3..t5 never started: unspent.
    assert back == {"t2": 1, "t3": 0, "t4": 0, "t5": 0}
    await eventually(lambda: frame in rig.wire.acked)


async def test_the_lives_of_a_chunk_s_tasks_are_written_with_their_own_ids(
    framed: list[Framed], caplog: pytest.LogCaptureFixture
) -> None:
    # A chunk's tasks are not bound to the log context one by one (it cost W1 a microsecond a
    # task): each written life, and each warning about one of them, must still name its task.
    assert sampled("ok-32") and not sampled("ok-1")
    rig = Framed(slots=1, handler="tests.handlers.basic:behave")
    framed.append(rig)
    sizes = _count_sends(rig.slots[0])
    caplog.handler.addFilter(ContextFilter())
    with caplog.at_level(logging.INFO, logger="truba.daemon"):
        rig.push_frame(TaskMessage("warm", ["ok", 0]))  # one short task: the runner learns they are
        await eventually(lambda: len(rig.results.sent) == 1, timeout=10)
        rig.push_frame(
            TaskMessage("ok-1", ["ok", 1]),
            TaskMessage("ok-32", ["ok", 2]),  # sampled
            TaskMessage("bad", ["raise", "no"]),  # failed
            TaskMessage("gone", ["exit", 3]),  # its slot died: put back, one attempt spent
            TaskMessage("after", ["ok", 4]),  # never started: put back
        )
        acked = ("daemon.task.acked",)
        await eventually(
            lambda: {r.task_id for r in caplog.records if r.message in acked} >= {"ok-32", "bad", "gone"},  # type: ignore[attr-defined]
            timeout=10,
        )
    assert sizes == [5]  # all five handed over in one write

    def told(task_id: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "task_id", None) == task_id]

    life = ["daemon.task.received", "daemon.task.started", "daemon.task.ended", "daemon.task.confirmed"]
    life.append("daemon.task.acked")
    assert told("ok-1") == []  # a short ok task not sampled: nothing written
    for task_id in ("ok-32", "bad"):
        assert [r.message for r in told(task_id)] == life, task_id
    gone = told("gone")
    assert "daemon.task.slot_died" in [r.message for r in gone]
    assert [r.message for r in gone if r.message in life] == life
    for record in told("ok-32") + told("bad") + gone:
        assert (vars(record)["job_id"], vars(record)["slot"]) == ("j1", 0), record.message


class Batching(HoldWatch):
    """Results, with the size of each batch they came in (``send_many``; one by one: 1 each)."""

    def __init__(self, limits: FrameLimits) -> None:
        super().__init__(limits)
        self.sizes: list[int] = []
        self.sent_at: dict[str, float] = {}

    async def send(self, message: ResultMessage) -> Confirmation:
        self.sent_at[message.task_id] = time.monotonic()
        return await super().send(message)

    async def send_many(self, messages: Sequence[ResultMessage]) -> list[Confirmation]:
        self.sizes.append(len(messages))
        return [await self.send(message) for message in messages]


async def test_a_chunk_s_replies_at_hand_are_published_together_and_none_waits_for_a_slow_one(
    framed: list[Framed],
) -> None:
    rig = Framed(slots=1, handler="tests.handlers.basic:behave")
    framed.append(rig)
    results = rig.results = Batching(rig.result_frames)
    rig.runner.pipes.results = results
    rig.push_frame(TaskMessage("warm", ["ok", 0]))  # one short task: the runner learns they are
    await eventually(lambda: len(results.sent) == 1, timeout=10)
    tasks = [TaskMessage(f"t{i}", ["ok", i]) for i in range(CHUNK - 1)]
    tasks.append(TaskMessage("slow", ["sleep", 0.5]))
    frame = rig.push_frame(*tasks)
    await eventually(lambda: len(results.sent) == CHUNK + 1, timeout=10)
    assert max(results.sizes) > 1  # replies read together went out in one call
    assert [r.task_id for r in results.sent] == ["warm", *(t.task_id for t in tasks)]  # each once, in order
    # The results before the slow task did not wait for its reply.
    assert results.sent_at["slow"] - results.sent_at[f"t{CHUNK - 2}"] > 0.3
    await eventually(lambda: frame in rig.wire.acked)
