"""Submission over a leaf whose bytes leave two loop turns after ``send`` (as over RabbitMQ)."""

from __future__ import annotations

from tests.unit.pipes.two_turn_leaf import TwoTurnLeaf
from truba.client.encoded import EncodedTask
from truba.client.journal import MemoryJournal
from truba.client.lifecycle import JobStatus
from truba.client.reach import Reach
from truba.client.submission import Submission


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
