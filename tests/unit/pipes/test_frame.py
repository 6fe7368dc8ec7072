"""The frame layer: lone messages go out unchanged, bursts are packed, members settle the frame."""

from __future__ import annotations

import asyncio

import pytest

from truba.pipes.base import Delivery
from truba.pipes.errors import MessageRejected, PipeBroken
from truba.pipes.frame import MAGIC, FrameListener, FrameSender, pack, unpack
from truba.pipes.testing import FakeListener, FakeSender


def test_pack_and_unpack_round_trip_and_refuse_what_is_not_a_frame() -> None:
    assert unpack(pack([b"a", b"", b"\xc1x"])) == [b"a", b"", b"\xc1x"]
    assert unpack(b"\x93\x01\x02\x03") is None  # a plain msgpack message
    assert unpack(MAGIC + b"\xc1 garbage") is None
    assert unpack(MAGIC + b"\x92\x01\x02") is None  # members must be bytes


async def test_a_lone_message_goes_out_at_once_unchanged() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, max_delay=10.0)
    confirmation = await sender.send(b"one")
    assert inner.sent == [b"one"]
    inner.confirm()
    await confirmation
    assert sender.frames == 0


async def test_messages_sent_while_one_is_in_flight_are_packed_into_one_frame() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, max_delay=0.01)
    first = await sender.send(b"m0")
    rest = [await sender.send(f"m{i}".encode()) for i in range(1, 6)]
    assert inner.sent == [b"m0"]  # the others wait: one is in flight
    await asyncio.sleep(0.05)  # max_delay passes
    assert inner.sent[1:] == [pack([b"m1", b"m2", b"m3", b"m4", b"m5"])]
    assert sorted(sender.unconfirmed()) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    inner.confirm()
    await asyncio.gather(first, *rest)
    assert sender.unconfirmed() == [] and sender.frames == 1


async def test_a_full_frame_goes_at_once_and_a_quiet_pipe_flushes_early() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, max_messages=3, max_delay=10.0)
    await sender.send(b"a")
    for m in (b"b", b"c", b"d"):
        await sender.send(m)
    assert inner.sent == [b"a", pack([b"b", b"c", b"d"])]  # the size cap, not the delay
    await sender.send(b"e")
    inner.confirm()  # nothing in flight any more: "e" need not wait for max_delay
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert inner.sent[-1] == b"e"


async def test_a_failed_frame_fails_every_member_and_keeps_them_unconfirmed() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, max_messages=2)
    a = await sender.send(b"a")
    x, y = await sender.send(b"x"), await sender.send(b"y")
    assert inner.sent == [b"a", pack([b"x", b"y"])]
    inner.reject(2)  # the broker nacks both: the lone message and the frame
    for confirmation in (a, x, y):
        with pytest.raises(MessageRejected, match="nacked"):
            await confirmation
    assert sorted(sender.unconfirmed()) == [b"a", b"x", b"y"]  # held until re-sent and dropped
    sender.drop_unconfirmed()
    assert sender.unconfirmed() == []


async def test_members_are_handed_out_one_by_one_and_the_frame_is_acked_once_all_are() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    inner.push(pack([b"a", b"b", b"c"]), redelivered=True, headers={"x-delivery-count": 1})
    inner.push(b"lone")
    got = [await listener.get(1.0) for _ in range(4)]
    assert [d.message for d in got if d is not None] == [b"a", b"b", b"c", b"lone"]
    first = got[0]
    assert first is not None and first.redelivered and first.headers["x-delivery-count"] == 1
    for delivery in got[:2]:
        assert delivery is not None
        await delivery.ack()
    assert inner.acked == []  # one member still runs
    assert got[2] is not None
    await got[2].ack()
    assert inner.acked == [pack([b"a", b"b", b"c"])]
    with pytest.raises(Exception, match="already settled"):
        await got[2].ack()


async def test_a_member_put_back_is_sent_alone_and_the_done_ones_do_not_run_again() -> None:
    inner: FakeListener[bytes] = FakeListener()
    requeue: FakeSender[bytes] = FakeSender(auto_confirm=True)
    listener = FrameListener(inner, requeue=requeue)
    inner.push(pack([b"done", b"interrupted"]))
    done, interrupted = await listener.get(1.0), await listener.get(1.0)
    assert done is not None and interrupted is not None
    await done.ack()
    await interrupted.reject(requeue=True)
    assert requeue.sent == [b"interrupted"]
    assert inner.acked == [pack([b"done", b"interrupted"])] and inner.rejected == []


async def test_without_a_requeue_sender_the_whole_frame_goes_back() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    frame = pack([b"a", b"b"])
    inner.push(frame)
    a, b = await listener.get(1.0), await listener.get(1.0)
    assert a is not None and b is not None
    await a.ack()
    await b.reject(requeue=True)
    assert inner.rejected == [(frame, True)]


async def test_garbage_with_the_magic_is_passed_on_as_it_is() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    inner.push(MAGIC + b"\xff not a frame")
    delivery = await listener.get(1.0)
    assert delivery is not None and delivery.message == MAGIC + b"\xff not a frame"


async def test_a_broken_inner_sender_fails_the_send_and_keeps_the_message() -> None:
    inner: FakeSender[bytes] = FakeSender()
    inner.fail_next(PipeBroken("gone"))
    sender = FrameSender(inner)
    with pytest.raises(PipeBroken):
        await sender.send(b"m")
    assert sender.unconfirmed() == [b"m"]


async def test_subscribers_get_each_member_and_close_sends_what_was_gathered() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    got: list[bytes] = []

    async def take(delivery: Delivery[bytes]) -> None:
        got.append(delivery.message)
        await delivery.ack()

    listener.subscribe(take)
    inner.push(pack([b"a", b"b"]))
    await asyncio.sleep(0.01)
    assert got == [b"a", b"b"] and inner.acked == [pack([b"a", b"b"])]

    out: FakeSender[bytes] = FakeSender(auto_confirm=True)
    sender = FrameSender(out, eager=0, max_delay=10.0)  # eager=0: always gather
    confirmations = [await sender.send(m) for m in (b"x", b"y")]
    assert out.sent == []
    await sender.close()
    assert out.sent == [pack([b"x", b"y"])]
    await asyncio.gather(*confirmations)
