from __future__ import annotations

import pytest

from truba.pipes.errors import CodecError, MessageTooLarge, PipeBroken, PipeClosed
from truba.pipes.frame import FrameListener, pack
from truba.pipes.serialize import DeserializeListener, deserialize, serialize
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import TaskCodec, TaskMessage


async def test_serialize_sends_bytes_and_answers_unconfirmed_in_message_type() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = serialize(TaskCodec())(inner)
    confirmation = await sender.send(TaskMessage("t1", [1, 2]))
    assert TaskCodec().decode(inner.sent[0]) == TaskMessage("t1", [1, 2])
    assert sender.unconfirmed() == [TaskMessage("t1", [1, 2])]
    inner.confirm()
    await confirmation
    assert sender.unconfirmed() == []


async def test_serialize_refuses_unserializable_payload_before_sending() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = serialize(TaskCodec())(inner)
    with pytest.raises(CodecError, match="not msgpack-serializable"):
        await sender.send(TaskMessage("t1", object()))
    assert inner.sent == []


async def test_serialize_refuses_a_message_over_the_size_limit_before_sending() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = serialize(TaskCodec(), max_size=1000)(inner)
    with pytest.raises(MessageTooLarge, match=r"of 2,0\d\d bytes encoded is over the limit of 1,000 bytes"):
        await sender.send(TaskMessage("t1", b"x" * 2000))
    assert inner.sent == []
    await sender.send(TaskMessage("t2", b"x" * 900))  # under the limit: sent
    assert len(inner.sent) == 1


async def test_deserialize_dead_letters_poison_and_returns_the_next_good_message() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = deserialize(TaskCodec())(inner)
    inner.push(b"\xc1garbage")
    inner.push(b"\x93\x01\xa1x")  # msgpack [1, "x"]: valid msgpack, wrong shape
    inner.push(TaskCodec().encode(TaskMessage("t2", "ok")))
    delivery = await listener.get(1.0)
    assert delivery is not None and delivery.message == TaskMessage("t2", "ok")
    # Both poison messages were rejected without requeue (to the dead-letter path).
    assert inner.rejected == [(b"\xc1garbage", False), (b"\x93\x01\xa1x", False)]
    await delivery.ack()
    assert inner.acked == [TaskCodec().encode(TaskMessage("t2", "ok"))]


async def test_get_batch_decodes_the_rest_of_a_frame_with_its_first_member() -> None:
    inner: FakeListener[bytes] = FakeListener()
    unframe = FrameListener(inner)
    listener = DeserializeListener(unframe, TaskCodec())
    good = [TaskCodec().encode(TaskMessage(f"t{n}", n)) for n in range(4)]
    frame = pack([good[0], good[1], b"\xc1garbage", good[2], good[3]])
    inner.push(frame)
    first = await listener.get_batch(1.0)
    # One call, the frame up to its poison member, which goes back in front with the rest ...
    assert [d.message for d in first] == [TaskMessage("t0", 0), TaskMessage("t1", 1)]
    assert unframe.held == 3
    # ... and the next call dead-letters it (the frame is rejected once every member is settled).
    second = await listener.get_batch(1.0)
    assert [d.message for d in second] == [TaskMessage("t2", 2), TaskMessage("t3", 3)]
    assert unframe.held == 0
    for delivery in first + second:
        await delivery.ack()
    assert inner.rejected == [(frame, False)] and inner.acked == []
    inner.push(good[0])
    assert [d.message for d in await listener.get_batch(1.0)] == [TaskMessage("t0", 0)]  # a lone one
    assert await listener.get_batch(0.01) == []  # timed out


async def test_deserialize_get_times_out_with_none_and_close_closes_inner() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = deserialize(TaskCodec())(inner)
    assert await listener.get(0.01) is None
    await listener.close()
    assert inner.closed
    with pytest.raises(PipeClosed):
        await listener.get(0.01)


async def test_poison_goes_to_the_dead_letter_sender_with_its_error_then_is_acked() -> None:
    import msgpack

    inner: FakeListener[bytes] = FakeListener()
    dead: FakeSender[bytes] = FakeSender(auto_confirm=True)
    listener = deserialize(TaskCodec(), dead)(inner)
    inner.push(b"\xc1 garbage")
    assert await listener.get(0.05) is None
    [record] = [msgpack.unpackb(m, raw=False) for m in dead.sent]
    assert record["kind"] == "poison" and record["body"] == b"\xc1 garbage"
    assert "not msgpack" in record["error"]
    assert inner.acked == [b"\xc1 garbage"] and inner.rejected == []


async def test_when_the_dead_letter_send_fails_the_poison_goes_to_the_broker_dlx() -> None:
    inner: FakeListener[bytes] = FakeListener()
    dead: FakeSender[bytes] = FakeSender()
    dead.fail_next(PipeBroken("no broker"))
    listener = deserialize(TaskCodec(), dead)(inner)
    inner.push(b"\xc1")
    assert await listener.get(0.05) is None
    assert inner.rejected == [(b"\xc1", False)] and inner.acked == []


async def test_take_at_hand_takes_the_oldest_members_decoded_without_a_wait() -> None:
    inner: FakeListener[bytes] = FakeListener()
    unframe = FrameListener(inner)
    listener = DeserializeListener(unframe, TaskCodec())
    assert listener.take_at_hand(4) == []  # nothing at hand: no wait, nothing taken
    good = [TaskCodec().encode(TaskMessage(f"t{n}", n)) for n in range(5)]
    inner.push(pack([*good[:4], b"\xc1garbage", good[4]]))
    first = await listener.get(1.0)
    assert first is not None and first.message == TaskMessage("t0", 0)
    assert [d.message.task_id for d in listener.take_at_hand(2)] == ["t1", "t2"]
    # The poison member stops the take and stays in front, with the one after it
    assert [d.message.task_id for d in listener.take_at_hand(10)] == ["t3"]
    assert unframe.held == 2 and listener.take_at_hand(10) == []
    last = await listener.get(1.0)  # dead-letters the poison member on its way
    assert last is not None and last.message == TaskMessage("t4", 4)
    # A listener whose inner one holds nothing at hand takes nothing
    assert DeserializeListener(FakeListener(), TaskCodec()).take_at_hand() == []
