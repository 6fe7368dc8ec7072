"""ResultStream: forget marks written before acks; acks batched while members of a frame are at
hand (at most ACK_BATCH), at once otherwise; the job finished once every outcome is taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import pytest

from truba.client.journal import MemoryJournal
from truba.client.lifecycle import JobStatus
from truba.client.outcome_codec import OutcomeCodec
from truba.client.reach import Reach
from truba.client.result_stream import ACK_BATCH, ResultStream
from truba.latency import BOUNDS, LatencyCounts
from truba.pipes.base import Delivery
from truba.pipes.frame import FrameListener, pack
from truba.pipes.serialize import DeserializeListener
from truba.pipes.testing import FakeListener
from truba.wire import ResultCodec, ResultMessage


class SpyJournal:
    """A memory journal that notes, at every flush, how many tasks it forgot and how many result
    messages were acked by then."""

    def __init__(self, acked: list[bytes]) -> None:
        self.inner = MemoryJournal()
        self.acked = acked
        self.flushes: list[tuple[int, int]] = []
        self.forgotten = 0

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.inner

    def __len__(self) -> int:
        return len(self.inner)

    def outstanding(self) -> list[str]:
        return self.inner.outstanding()

    def started(self, task_id: str) -> float:
        return self.inner.started(task_id)

    def settle(self, task_id: str) -> bool:
        self.forgotten += 1
        return self.inner.settle(task_id)

    def flush(self) -> None:
        self.flushes.append((self.forgotten, len(self.acked)))


async def rig(
    ids: Iterable[str], *, latency: LatencyCounts | None = None, started: float = 0.0
) -> tuple[FakeListener[bytes], SpyJournal, ResultStream, list[str]]:
    fake: FakeListener[bytes] = FakeListener()
    journal = SpyJournal(fake.acked)
    for task_id in ids:
        await journal.inner.record(task_id, b"", start=started)
    ended: list[str] = []

    async def done() -> None:
        ended.append("finished")

    async def poll() -> None:
        pass

    unframe = FrameListener(fake)
    results = DeserializeListener(unframe, OutcomeCodec())
    stream = ResultStream(
        "j1",
        results,
        journal,  # type: ignore[arg-type]
        JobStatus(closed=True),
        frames=unframe,
        sizer=None,
        on_taken=lambda: None,
        poll=poll,
        on_done=done,
        reach=Reach(),
        latency=latency,
    )
    return fake, journal, stream, ended


def result(task_id: str) -> bytes:
    return ResultCodec().encode(ResultMessage(task_id, True, task_id, None, "d1", 0.0))


async def test_the_members_of_a_frame_are_acked_in_batches_after_their_forget_marks() -> None:
    ids = [f"t{n}" for n in range(100)]
    fake, journal, stream, ended = await rig(ids)
    fake.push(pack([result(task_id) for task_id in ids]))
    outcomes = [outcome.task_id async for outcome in stream.outcomes()]
    assert outcomes == ids and ended == ["finished"]
    # One batch at ACK_BATCH taken, the rest when the stream ended; each batch's
    # forget marks were written before any of its results was acked (the frame is acked last).
    assert journal.flushes == [(ACK_BATCH, 0), (100, 0)]
    assert len(fake.acked) == 1


async def test_a_frame_of_results_is_read_from_the_pipe_in_one_get(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"t{n}" for n in range(10)]
    fake, _, stream, _ = await rig(ids)
    gets = 0
    unframe_get = FrameListener.get

    async def counted(self: FrameListener, timeout: float) -> Delivery[bytes] | None:
        nonlocal gets
        gets += 1
        return await unframe_get(self, timeout)

    monkeypatch.setattr(FrameListener, "get", counted)
    fake.push(pack([result(task_id) for task_id in ids[:6]]))
    fake.push(pack([result(task_id) for task_id in ids[6:]]))
    assert [outcome.task_id async for outcome in stream.outcomes()] == ids
    assert gets == 2  # one get through the pipe's layers per frame, not one per result
    assert len(fake.acked) == 2


async def test_a_poison_member_of_a_result_frame_does_not_hold_back_the_others() -> None:
    fake, _, stream, ended = await rig(["a", "b", "c"])
    frame = pack([result("a"), b"\xc1garbage", result("b"), result("c")])
    fake.push(frame)
    assert [outcome.task_id async for outcome in stream.outcomes()] == ["a", "b", "c"]
    assert ended == ["finished"]
    assert fake.rejected == [(frame, False)]  # the poison member's frame goes to the dead-letter path


async def test_lone_results_are_acked_before_the_next_wait() -> None:
    fake, journal, stream, _ = await rig(["a", "b"])
    fake.push(result("a"))
    fake.push(result("b"))
    outcomes = stream.outcomes()
    assert (await anext(outcomes)).task_id == "a"
    assert fake.acked == []  # not taken yet: the consumer holds it
    assert (await anext(outcomes)).task_id == "b"
    assert fake.acked == [result("a")] and journal.flushes == [(1, 0)]
    assert [outcome async for outcome in outcomes] == []
    assert fake.acked == [result("a"), result("b")] and journal.flushes == [(1, 0), (2, 1)]


async def test_the_last_outcome_is_acked_after_what_already_waits_for_the_event_loop() -> None:
    # One task at a time (submit, then its outcome): the submit hands its task to a publish task
    # of the broker leaf; asking for the outcome then must not ack the last one before that
    # task is on its way (the ack runs from a task of its own, after what already waits).
    fake, journal, stream, _ = await rig(["a", "b"])
    fake.push(result("a"))
    outcomes = stream.outcomes()
    assert (await anext(outcomes)).task_id == "a"
    acked_when_published: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: acked_when_published.append(len(fake.acked)))
    fake.push(result("b"))
    assert (await anext(outcomes)).task_id == "b"
    assert acked_when_published == [0]
    assert fake.acked == [result("a")] and journal.flushes == [(1, 0)]  # acked meanwhile, marks first
    assert [outcome async for outcome in outcomes] == []
    assert fake.acked == [result("a"), result("b")]


async def test_a_result_whose_task_has_its_outcome_is_dropped_and_acked() -> None:
    fake, journal, stream, ended = await rig(["a"])
    fake.push(result("z"))  # its task was settled by an earlier run
    fake.push(result("a"))
    assert [outcome.task_id async for outcome in stream.outcomes()] == ["a"]
    assert sorted(fake.acked) == sorted([result("z"), result("a")]) and ended == ["finished"]


async def test_each_outcome_taken_counts_its_seconds_since_its_task_was_submitted() -> None:
    latency = LatencyCounts()
    submitted = time.monotonic() - 2.0  # two seconds ago, on the clock the stream reads
    fake, journal, stream, _ = await rig(["a", "b"], latency=latency, started=submitted)
    fake.push(result("a"))
    fake.push(result("a"))  # a duplicate: no outcome, no latency
    fake.push(result("b"))
    assert [outcome.task_id async for outcome in stream.outcomes()] == ["a", "b"]
    assert latency.count == 2 and latency.counts[BOUNDS.index(2.5)] == 2
    assert 4.0 <= latency.sum < 2 * 2.5


async def test_an_outcome_whose_submission_time_is_unknown_is_not_counted() -> None:
    latency = LatencyCounts()  # a task recovered from the journal after a crash: no start known
    fake, _, stream, _ = await rig(["a"], latency=latency)
    fake.push(result("a"))
    assert [outcome.task_id async for outcome in stream.outcomes()] == ["a"]
    assert latency.count == 0
