"""Submission over a leaf whose bytes leave two loop turns after ``send`` (as over RabbitMQ), and
over frames whose members share one confirmation (the client's task stack)."""

from __future__ import annotations

import asyncio

from tests.unit.pipes.two_turn_leaf import TwoTurnLeaf
from truba.client.encoded import EncodedTask, EncodedTaskCodec
from truba.client.journal import MemoryJournal
from truba.client.lifecycle import JobStatus
from truba.client.reach import Reach
from truba.client.submission import Submission
from truba.pipes.frame import FrameLimits, FrameSender, unpack
from truba.pipes.serialize import SerializeSender
from truba.pipes.testing import FakeSender


def submission_over(leaf: TwoTurnLeaf[EncodedTask]) -> Submission:
    return Submission(
        "j1",
        leaf,
        MemoryJournal(),
        JobStatus(),
        links=[],
        marker="m",
        resumed=False,
        priorities=False,
        max_payload=1 << 20,
        on_change=lambda: None,
        reach=Reach(),
    )


async def test_a_lone_task_is_on_the_socket_when_submit_returns() -> None:
    # One task at a time, what the caller did after submit (the next results() step) ran before
    # the task left: on the W2 round trip. Behind an unconfirmed task, submit returns at once:
    # under load the loop is sending anyway, and the turns would cost every task.
    leaf: TwoTurnLeaf[EncodedTask] = TwoTurnLeaf()
    submission = submission_over(leaf)
    first = await submission.submit("a")
    assert [task.task_id for task in leaf.written] == [first]
    await submission.submit("b")  # the first is unconfirmed yet
    assert [task.task_id for task in leaf.written] == [first]
    leaf.confirm()
    await submission.settle_confirms()
    third = await submission.submit("c")
    assert [task.task_id for task in leaf.written][-1] == third
    await leaf.close()


async def test_a_claimed_task_returns_before_it_left() -> None:
    # A call or a group member registers for its outcome once submit returns: it must not wait
    # loop turns in which an in-process fake could already have answered it.
    leaf: TwoTurnLeaf[EncodedTask] = TwoTurnLeaf()
    submission = submission_over(leaf)
    await submission.submit("a", leave_first=False)
    assert leaf.written == []
    await leaf.close()


def framed_submission(inner: FakeSender[bytes]) -> tuple[Submission, MemoryJournal]:
    journal = MemoryJournal()
    frames = FrameSender(inner, FrameLimits(max_messages=3, max_delay=0.01), share_confirmations=True)
    submission = Submission(
        "j1",
        SerializeSender(frames, EncodedTaskCodec()),
        journal,
        JobStatus(),
        links=[],
        marker="m",
        resumed=False,
        priorities=False,
        max_payload=1 << 20,
        on_change=lambda: None,
        reach=Reach(),
    )
    return submission, journal


async def test_the_tasks_of_a_frame_are_confirmed_together_in_the_journal() -> None:
    inner: FakeSender[bytes] = FakeSender()
    submission, journal = framed_submission(inner)
    ids = [await submission.submit(f"p{i}") for i in range(4)]  # one alone, then a frame of 3
    await asyncio.sleep(0)
    assert len(inner.sent) == 2
    assert journal.unconfirmed() == ids
    inner.confirm()
    await submission.settle_confirms()
    assert journal.unconfirmed() == []
    await submission.confirm_all()  # nothing failed: nothing sent again
    assert len(inner.sent) == 2


async def test_a_nacked_frame_puts_each_of_its_tasks_aside_and_close_sends_them_again() -> None:
    inner: FakeSender[bytes] = FakeSender()
    submission, journal = framed_submission(inner)
    ids = [await submission.submit(f"p{i}") for i in range(4)]
    await asyncio.sleep(0)
    inner.confirm(1)  # the lone first task
    inner.reject(1)  # the frame of the other three
    await submission.settle_confirms()
    assert journal.unconfirmed() == ids[1:]
    resending = asyncio.create_task(submission.confirm_all())
    for _ in range(100):  # the three go again (alone, then a frame after max_delay)
        if resending.done():
            break
        await asyncio.sleep(0.005)
        inner.confirm()
    await resending
    assert journal.unconfirmed() == []
    sent_again = [task_id for data in inner.sent[2:] for task_id in _task_ids(data)]
    assert sorted(sent_again) == sorted(ids[1:])


def _task_ids(data: bytes) -> list[str]:
    members = unpack(data) or [data]
    return [EncodedTaskCodec().decode(member).task_id for member in members]
