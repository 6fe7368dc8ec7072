"""Batches through the stacks (``truba.pipes.batch``): one call per layer, a prefix taken, the same
messages and confirmations on the wire as one by one; acks of many in one call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from truba.backoff import Backoff
from truba.pipes.base import Confirmation, Delivery
from truba.pipes.batch import ack_each, ack_many, send_many
from truba.pipes.errors import CodecError, MessageTooLarge, PipeBroken, PipeClosed, PipeError
from truba.pipes.frame import FrameLimits, FrameListener, FrameSender, pack
from truba.pipes.log import LogListener, LogSender
from truba.pipes.retry import RetryListener, RetrySender
from truba.pipes.serialize import DeserializeListener, SerializeSender
from truba.pipes.testing import FakeDelivery, FakeListener, FakeSender
from truba.wire import TaskCodec, TaskMessage

CODEC = TaskCodec()


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


class Batches(FakeSender[bytes]):
    """A sender that takes batches, and counts the calls it gets of each kind."""

    def __init__(self) -> None:
        super().__init__(auto_confirm=True)
        self.batches: list[list[bytes]] = []
        self.singles = 0

    async def send(self, message: bytes) -> Confirmation:
        self.singles += 1
        return await super().send(message)

    async def send_many(self, messages: Sequence[bytes]) -> list[Confirmation]:
        self.batches.append(list(messages))
        return [await super(Batches, self).send(message) for message in messages]


class Acks(FakeListener[bytes]):
    """A listener that acks batches, and counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[bytes]] = []

    async def ack_many(self, deliveries: Sequence[Delivery[bytes]]) -> list[PipeError]:
        self.batches.append([delivery.message for delivery in deliveries])
        return await ack_each(deliveries)


def _tasks(count: int) -> list[TaskMessage]:
    return [TaskMessage(f"t{i}", i) for i in range(count)]


# -- sending ---------------------------------------------------------------------------------------


async def test_a_batch_goes_down_serialize_retry_and_log_in_one_call_each_with_a_confirmation_each() -> None:
    leaf = Batches()
    stack = SerializeSender(
        LogSender(RetrySender(leaf, Backoff(attempts=3, sleep=_no_sleep)), "results"), CODEC
    )
    tasks = _tasks(5)
    confirmations = await send_many(stack, tasks)
    assert leaf.batches == [[CODEC.encode(task) for task in tasks]] and leaf.singles == 0
    assert len(set(map(id, confirmations))) == 5
    await asyncio.gather(*confirmations)


async def test_a_sender_that_cannot_batch_is_sent_one_by_one_and_a_failure_ends_the_batch() -> None:
    leaf: FakeSender[str] = FakeSender(auto_confirm=True)
    assert len(await send_many(leaf, ["a", "b"])) == 2 and leaf.sent == ["a", "b"]
    # A failure after the first ends the batch: the rest is the caller's to send again.
    leaf.fail_next(PipeBroken("gone"))  # the first of the next batch fails: raised
    with pytest.raises(PipeBroken):
        await send_many(leaf, ["c", "d"])
    closing = FakeSender[str](auto_confirm=True)
    taken = await send_many(closing, ["e"])
    await closing.close()
    with pytest.raises(PipeClosed):
        await send_many(closing, ["f", "g"])
    assert len(taken) == 1


async def test_a_failing_send_after_the_first_ends_a_fallback_batch_without_raising() -> None:
    leaf: FakeSender[str] = FakeSender(auto_confirm=True)
    await leaf.send("warm")
    real_send = leaf.send
    calls = 0

    async def second_fails(message: str) -> Confirmation:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise PipeBroken("gone")
        return await real_send(message)

    leaf.send = second_fails  # type: ignore[method-assign]
    taken = await send_many(leaf, ["a", "b", "c"])
    assert len(taken) == 1 and leaf.sent == ["warm", "a"]  # b not taken, c never tried


async def test_serialize_ends_a_batch_before_a_message_too_large_and_raises_it_when_first() -> None:
    leaf = Batches()
    stack = SerializeSender(leaf, CODEC, max_size=100)
    big = TaskMessage("big", b"x" * 200)
    small = _tasks(3)
    taken = await send_many(stack, [small[0], small[1], big, small[2]])
    assert len(taken) == 2 and leaf.batches == [[CODEC.encode(small[0]), CODEC.encode(small[1])]]
    with pytest.raises(MessageTooLarge):
        await send_many(stack, [big, small[2]])


async def test_serialize_ends_a_batch_before_a_message_it_cannot_encode_and_raises_it_when_first() -> None:
    leaf = Batches()
    stack: SerializeSender[TaskMessage] = SerializeSender(leaf, CODEC)
    bad = TaskMessage("bad", object())
    good = _tasks(1)[0]
    assert len(await send_many(stack, [good, bad])) == 1
    with pytest.raises(CodecError):
        await send_many(stack, [bad, good])


async def test_retry_sends_the_first_message_again_when_the_batch_fails_retryably() -> None:
    retried = 0

    class Heals(FakeSender[bytes]):
        async def send_many(self, messages: Sequence[bytes]) -> list[Confirmation]:
            nonlocal retried
            retried += 1
            if retried == 1:
                raise PipeBroken("a blip")
            return [await self.send(message) for message in messages]

    heals = Heals(auto_confirm=True)
    sender = RetrySender(heals, Backoff(attempts=3, sleep=_no_sleep))
    taken = await send_many(sender, [b"a", b"b"])
    assert heals.sent == [b"a"] and len(taken) == 1  # the first again, alone; b comes next call
    not_retryable = RetrySender(FakeSender[bytes](auto_confirm=True), Backoff(attempts=3, sleep=_no_sleep))
    await not_retryable.close()
    with pytest.raises(PipeClosed):
        await send_many(not_retryable, [b"c"])


async def test_log_logs_a_failed_batch_and_each_failed_confirmation(caplog: pytest.LogCaptureFixture) -> None:
    leaf: FakeSender[bytes] = FakeSender()
    sender = LogSender(leaf, "results")
    confirmations = await send_many(sender, [b"a", b"b"])
    leaf.reject(2)
    await asyncio.gather(*confirmations, return_exceptions=True)
    assert [r.message for r in caplog.records].count("pipe.results.unconfirmed") == 2
    leaf.fail_next(PipeBroken("gone"))
    with pytest.raises(PipeBroken):
        await send_many(sender, [b"c"])
    assert "pipe.results.failed" in [r.message for r in caplog.records]


async def test_frames_gather_a_batch_into_one_frame_each_member_confirmed_on_its_own() -> None:
    inner: FakeSender[bytes] = FakeSender()
    limits = FrameLimits(max_delay=0.01)
    limits.hold()  # as a daemon running chunks does: even the first waits for a frame
    sender = FrameSender(inner, limits)
    messages = [f"m{i}".encode() for i in range(5)]
    confirmations = await send_many(sender, messages)
    assert len(confirmations) == 5 and len(set(map(id, confirmations))) == 5
    await asyncio.sleep(0.05)
    assert inner.sent == [pack(messages)] and sender.frames == 1
    inner.confirm()
    await asyncio.gather(*confirmations)


async def test_frames_send_a_quiet_batchs_first_message_alone_and_gather_the_rest() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_delay=0.01))
    confirmations = await send_many(sender, [b"a", b"b", b"c"])
    assert len(confirmations) == 3 and inner.sent == [b"a"]  # as one by one: b and c wait
    await asyncio.sleep(0.05)
    assert inner.sent == [b"a", pack([b"b", b"c"])]
    inner.confirm()
    await asyncio.gather(*confirmations)


async def test_frames_end_a_batch_where_the_window_is_full() -> None:
    inner: FakeSender[bytes] = FakeSender()
    limits = FrameLimits(max_delay=0.01)
    limits.hold()
    sender = FrameSender(inner, limits, max_unconfirmed=3)
    taken = await send_many(sender, [f"m{i}".encode() for i in range(5)])
    assert len(taken) == 3  # the fourth would wait for room: the caller sends it again
    limits.release()
    await asyncio.sleep(0.05)
    inner.confirm()
    await asyncio.gather(*taken)


# -- acking ----------------------------------------------------------------------------------------


async def test_a_batch_of_members_acks_each_frame_once_through_one_call_below() -> None:
    wire = Acks()
    stack = LogListener(RetryListener(DeserializeListener(FrameListener(wire), CODEC)))
    tasks = _tasks(4)
    wire.push(pack([CODEC.encode(task) for task in tasks[:2]]))
    wire.push(pack([CODEC.encode(task) for task in tasks[2:]]))
    got = [await stack.get(1.0) for _ in tasks]
    deliveries = [d for d in got if d is not None]
    assert await ack_many(stack, deliveries[:3]) == []
    assert len(wire.batches) == 1 and len(wire.acked) == 1  # the first frame; the second waits
    assert await ack_many(stack, deliveries[3:]) == []
    assert len(wire.batches) == 2 and len(wire.acked) == 2


async def test_deserialize_on_top_unwraps_its_deliveries_for_the_unframe_layer() -> None:
    wire = Acks()
    stack = DeserializeListener(LogListener(RetryListener(FrameListener(wire))), CODEC)
    tasks = _tasks(3)
    frame = pack([CODEC.encode(task) for task in tasks])
    wire.push(frame)
    deliveries = [await stack.get(1.0) for _ in tasks]
    assert await ack_many(stack, [d for d in deliveries if d is not None]) == []
    assert wire.acked == [frame] and wire.batches == [[frame]]


async def test_a_member_acked_twice_is_an_error_of_its_own_and_the_rest_are_acked() -> None:
    wire: FakeListener[bytes] = FakeListener()
    unframe = FrameListener(wire)
    wire.push(pack([b"a", b"b"]))
    wire.push(b"lone")
    a, b, lone = [await unframe.get(1.0) for _ in range(3)]
    assert a is not None and b is not None and lone is not None
    await a.ack()
    errors = await ack_many(unframe, [a, b, lone])
    assert len(errors) == 1 and "already settled" in str(errors[0])
    assert wire.acked == [pack([b"a", b"b"]), b"lone"]


async def test_a_frame_whose_member_was_put_back_is_rejected_as_one_by_one() -> None:
    wire: FakeListener[bytes] = FakeListener()
    unframe = FrameListener(wire)
    frame = pack([b"a", b"b"])
    wire.push(frame)
    a, b = [await unframe.get(1.0) for _ in range(2)]
    assert a is not None and b is not None
    await a.reject(requeue=True)
    assert await ack_many(unframe, [b]) == []
    assert wire.rejected == [(frame, True)] and wire.acked == []


async def test_failed_acks_are_returned_one_each_and_do_not_stop_the_others() -> None:
    wire: FakeListener[bytes] = FakeListener()
    wire.push(b"a")
    wire.push(b"b")
    a, b = [await wire.get(1.0) for _ in range(2)]
    assert isinstance(a, FakeDelivery) and b is not None
    await a.ack()
    errors = await ack_many(LogListener(wire), [a, b])  # a again: the fake raises PipeBroken
    assert len(errors) == 1 and wire.acked == [b"a", b"b"]


async def test_a_delivery_deserialize_did_not_decode_is_acked_on_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    wire = Acks()
    stack = DeserializeListener(wire, CODEC)
    other: FakeListener[TaskMessage] = FakeListener()
    other.push(_tasks(1)[0])
    foreign = await other.get(1.0)
    assert foreign is not None
    assert await ack_many(stack, [foreign]) == []
    assert other.acked == [_tasks(1)[0]] and wire.batches == []
