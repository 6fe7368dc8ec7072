"""The frame layer: lone messages go out unchanged, bursts are packed, members settle the frame."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import pytest

from truba.pipes.base import Delivery
from truba.pipes.errors import MessageRejected, PipeBroken
from truba.pipes.frame import MAGIC, FrameLimits, FrameListener, FrameSender, pack, unpack
from truba.pipes.testing import FakeListener, FakeSender


def test_pack_and_unpack_round_trip_and_refuse_what_is_not_a_frame() -> None:
    assert unpack(pack([b"a", b"", b"\xc1x"])) == [b"a", b"", b"\xc1x"]
    assert unpack(b"\x93\x01\x02\x03") is None  # a plain msgpack message
    assert unpack(MAGIC + b"\xc1 garbage") is None
    assert unpack(MAGIC + b"\x92\x01\x02") is None  # members must be bytes


async def test_a_lone_message_goes_out_at_once_unchanged() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_delay=10.0))
    confirmation = await sender.send(b"one")
    assert inner.sent == [b"one"]
    inner.confirm()
    await confirmation
    assert sender.frames == 0


async def test_messages_sent_while_one_is_in_flight_are_packed_into_one_frame() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_delay=0.01))
    first = await sender.send(b"m0")
    rest = [await sender.send(f"m{i}".encode()) for i in range(1, 6)]
    assert inner.sent == [b"m0"]  # the others wait: one is in flight
    await asyncio.sleep(0.05)  # max_delay passes
    assert inner.sent[1:] == [pack([b"m1", b"m2", b"m3", b"m4", b"m5"])]
    assert sorted(sender.unconfirmed()) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    inner.confirm()
    await asyncio.gather(first, *rest)
    assert sender.unconfirmed() == [] and sender.frames == 1


async def test_a_full_frame_goes_at_once_and_a_gathering_one_waits_for_max_delay() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=3, max_delay=0.05))
    await sender.send(b"a")
    for m in (b"b", b"c", b"d"):
        await sender.send(m)
    await _turn()
    assert inner.sent == [b"a", pack([b"b", b"c", b"d"])]  # the size cap, not the delay
    await sender.send(b"e")
    await sender.send(b"f")
    inner.confirm()  # under load a frame goes on gathering until max_delay, confirms or not
    await _turn()
    assert len(inner.sent) == 2
    await asyncio.sleep(0.1)
    assert inner.sent[-1] == pack([b"e", b"f"])
    inner.confirm()
    await _turn()
    await sender.send(b"g")  # nothing in flight, nothing gathered: alone, at once
    assert inner.sent[-1] == b"g"


async def test_a_lone_message_gathered_behind_a_frame_goes_once_that_is_confirmed() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_delay=10.0))
    await sender.send(b"m0")
    lone = await sender.send(b"m1")  # m0 in flight: m1 is gathered
    assert inner.sent == [b"m0"]
    inner.confirm()
    await asyncio.sleep(0.01)
    assert inner.sent == [b"m0", b"m1"]  # alone and unchanged, long before max_delay
    inner.confirm()
    await asyncio.wait_for(lone, 1.0)
    # Two gathered wait for a fuller frame (busy traffic), as before.
    await sender.send(b"m2")
    pair = [await sender.send(b"m3"), await sender.send(b"m4")]
    inner.confirm()
    await asyncio.sleep(0.01)
    assert inner.sent[2:] == [b"m2"] and not any(c.done() for c in pair)


async def test_while_held_no_message_goes_alone_and_the_last_release_sends_them() -> None:
    limits = FrameLimits(max_delay=10.0)
    inners: list[FakeSender[bytes]] = [FakeSender(), FakeSender()]
    senders = [FrameSender(inner, limits) for inner in inners]  # two brokers' leaves
    limits.hold()
    limits.hold()  # two workers run chunks
    await senders[0].send(b"a")  # nothing in flight, yet it waits for a frame
    await senders[0].send(b"b")
    await senders[1].send(b"c")
    limits.release()
    await _turn()
    assert inners[0].sent == inners[1].sent == [] and limits.holding
    limits.release()  # the last hold: nothing in flight, so the gathered frames go now
    await _turn()
    assert inners[0].sent == [pack([b"a", b"b"])] and inners[1].sent == [b"c"] and not limits.holding
    await senders[0].send(b"d")  # a frame in flight: a release leaves the next one gathering
    limits.hold()
    limits.release()
    await _turn()
    assert len(inners[0].sent) == 1
    await senders[0].close()  # sends what it gathered; a release no longer reaches it
    assert inners[0].sent[-1] == b"d" and limits._on_release == [senders[1]._released]
    inners[1].confirm()
    await _turn()
    await senders[1].send(b"e")  # not held any more, nothing in flight: alone, at once
    assert inners[1].sent[-1] == b"e"


async def test_a_failed_frame_fails_every_member_and_keeps_them_unconfirmed() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=2))
    a = await sender.send(b"a")
    x, y = await sender.send(b"x"), await sender.send(b"y")
    await _turn()
    assert inner.sent == [b"a", pack([b"x", b"y"])]
    inner.reject(2)  # the broker nacks both: the lone message and the frame
    for confirmation in (a, x, y):
        with pytest.raises(MessageRejected, match="nacked"):
            await confirmation
    assert sorted(sender.unconfirmed()) == [b"a", b"x", b"y"]  # held until re-sent and dropped
    sender.drop_unconfirmed()
    assert sender.unconfirmed() == []


async def test_unconfirmed_lists_oldest_first_when_frames_fail_out_of_order() -> None:
    """A frame's publish can break before the confirm an older message awaits fails (RabbitMQ:
    the write fails at once, the channel's close fails the rest a moment later)."""
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=2))
    confirmations = [await sender.send(m) for m in (b"a", b"x", b"y")]
    await _turn()
    assert inner.sent == [b"a", pack([b"x", b"y"])]
    inner.fail_newest(PipeBroken("the frame's publish broke"))
    await _turn()
    inner.break_()
    for confirmation in confirmations:
        with pytest.raises(PipeBroken):
            await confirmation
    assert sender.unconfirmed() == [b"a", b"x", b"y"]


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


async def test_take_held_hands_out_the_rest_of_a_frame_at_once_and_they_settle_it() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    frame = pack([b"a", b"b", b"c"])
    inner.push(frame)
    first = await listener.get(1.0)
    assert first is not None and first.message == b"a" and listener.held == 2
    rest = listener.take_held()
    assert [d.message for d in rest] == [b"b", b"c"]
    assert listener.held == 0 and listener.take_held() == []
    for delivery in (rest[1], first):  # in any order: the frame waits for its last member
        await delivery.ack()
    assert inner.acked == []
    await rest[0].ack()
    assert inner.acked == [frame]


async def test_members_given_back_are_handed_out_first_in_their_order() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    inner.push(pack([b"a", b"b", b"c"]))
    inner.push(b"lone")
    first = await listener.get(1.0)
    assert first is not None and first.message == b"a"
    rest = listener.take_held()
    listener.give_back(rest)
    got = [await listener.get(1.0) for _ in range(3)]
    assert [d.message for d in got if d is not None] == [b"b", b"c", b"lone"]


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


async def test_a_lone_send_that_raises_was_not_taken_and_is_not_kept() -> None:
    inner: FakeSender[bytes] = FakeSender()
    inner.fail_next(PipeBroken("gone"))
    sender = FrameSender(inner)
    with pytest.raises(PipeBroken):
        await sender.send(b"m")
    assert sender.unconfirmed() == []  # the caller was told: it sends again (retry) or gives up


async def test_gathered_members_of_a_frame_that_cannot_be_sent_fail_and_are_kept() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=2, max_delay=10.0))
    await sender.send(b"a")
    x = await sender.send(b"x")
    inner.fail_next(PipeBroken("gone"))
    y = await sender.send(b"y")  # completes the frame; its send fails, but x and y were taken
    for confirmation in (x, y):
        with pytest.raises(PipeBroken):
            await confirmation
    assert sorted(sender.unconfirmed()) == [b"a", b"x", b"y"]


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
    sender = FrameSender(out, FrameLimits(eager=0, max_delay=10.0))  # eager=0: always gather
    confirmations = [await sender.send(m) for m in (b"x", b"y")]
    assert out.sent == []
    await sender.close()
    assert out.sent == [pack([b"x", b"y"])]
    await asyncio.gather(*confirmations)


async def test_a_frame_never_grows_past_its_byte_cap() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_bytes=10, max_delay=10.0))
    await sender.send(b"first")  # alone: nothing in flight
    for m in (b"aaaa", b"bbbb", b"cccc"):
        await sender.send(m)
    await _turn()
    assert inner.sent == [b"first", pack([b"aaaa", b"bbbb"])]  # "cccc" would make it 12 bytes
    assert sorted(sender.unconfirmed())[-1] == b"first" and b"cccc" in sender.unconfirmed()


async def test_limits_changed_while_running_apply_at_once() -> None:
    inner: FakeSender[bytes] = FakeSender()
    limits = FrameLimits(max_delay=10.0)
    sender = FrameSender(inner, limits)
    await sender.send(b"a")
    limits.max_messages = 2
    await sender.send(b"b")
    await sender.send(b"c")
    await _turn()
    assert inner.sent == [b"a", pack([b"b", b"c"])]
    limits.max_messages = 1  # packing off: every message goes alone, whatever is in flight
    await sender.send(b"d")
    assert inner.sent[-1] == b"d"


async def test_waiting_consumers_share_a_frame_instead_of_one_holding_it() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    waiters = [asyncio.ensure_future(listener.get(5.0)) for _ in range(3)]
    await asyncio.sleep(0.01)
    inner.push(pack([b"a", b"b", b"c"]))
    got = await asyncio.wait_for(asyncio.gather(*waiters), 1.0)  # all three, not one
    assert sorted(d.message for d in got if d is not None) == [b"a", b"b", b"c"]


async def test_a_waiter_that_leaves_loses_nothing_and_timeouts_return_none() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    assert await listener.get(0.01) is None
    leaving = asyncio.ensure_future(listener.get(5.0))
    await asyncio.sleep(0.01)
    leaving.cancel()
    inner.push(pack([b"a", b"b"]))
    first, second = await listener.get(1.0), await listener.get(0.0)
    assert first is not None and second is not None
    assert [first.message, second.message] == [b"a", b"b"] and listener.held == 0


async def test_a_waiter_that_joins_a_shorter_pull_still_waits_its_own_timeout() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    short = asyncio.ensure_future(listener.get(0.02))  # starts the shared inner get
    await asyncio.sleep(0)
    long = asyncio.ensure_future(listener.get(0.2))  # joins it, then outlives it
    assert await short is None
    await asyncio.sleep(0.05)
    assert not long.done(), "a get returned before its timeout: the pull it joined had ended"
    inner.push(pack([b"late"]))
    delivery = await asyncio.wait_for(long, 1.0)
    assert delivery is not None and delivery.message == b"late"


async def turns_until_done(waiters: Sequence[asyncio.Future[Delivery[bytes] | None]]) -> int:
    turns = 0
    while not all(waiter.done() for waiter in waiters):
        await asyncio.sleep(0)
        turns += 1
    return turns


async def test_the_pull_wakes_its_waiters_itself_one_turn_after_it_ends() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    waiters = [asyncio.ensure_future(listener.get(5.0)) for _ in range(2)]
    await asyncio.sleep(0.01)
    inner.push(pack([b"a", b"b"]))
    # The pull's inner get wakes, the pull splits the frame and ends, waking the waiters, which
    # take a member each: no done callback and no asyncio.wait in between (one turn more before).
    assert await turns_until_done(waiters) <= 2
    got = [w.result() for w in waiters]
    assert sorted(d.message for d in got if d is not None) == [b"a", b"b"]
    assert listener._waiters == []


async def test_once_connected_a_waiting_get_has_a_lone_message_one_turn_after_it_arrives() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    assert await listener.get(0.0) is None  # the first get connects (in a pull task of its own)
    first, second = (asyncio.ensure_future(listener.get(5.0)) for _ in range(2))
    await asyncio.sleep(0.01)
    inner.push(b"one")
    # The first get waits on the inner listener in its own task: no pull task to wake first.
    assert await turns_until_done([first]) == 1
    assert (delivery := first.result()) is not None and delivery.message == b"one"
    assert not second.done()  # woken, found nothing: it waits on the inner listener now
    await asyncio.sleep(0)
    inner.push(b"two")
    assert await turns_until_done([second]) == 1
    assert (delivery := second.result()) is not None and delivery.message == b"two"


async def test_a_get_cancelled_while_it_pulls_loses_nothing_and_a_waiting_get_takes_over() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    assert await listener.get(0.0) is None
    pulling = asyncio.ensure_future(listener.get(5.0))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(listener.get(5.0))
    await asyncio.sleep(0.01)
    pulling.cancel()
    await asyncio.sleep(0.01)
    inner.push(pack([b"a", b"b"]))
    delivery = await asyncio.wait_for(waiting, 1.0)
    assert pulling.cancelled() and delivery is not None and delivery.message == b"a"
    rest = await listener.get(0.0)
    assert rest is not None and rest.message == b"b" and listener._waiters == []


async def test_a_redelivered_frame_reaching_a_connected_get_is_looked_up_in_a_pull_task() -> None:
    inner: FakeListener[bytes] = FakeListener()
    record = _Lookup({b"a"})
    listener = FrameListener(inner, done=record)
    assert await listener.get(0.0) is None
    pulling = asyncio.ensure_future(listener.get(5.0))
    await asyncio.sleep(0.01)
    inner.push(pack([b"a", b"b"]), redelivered=True)
    await asyncio.sleep(0.01)
    pulling.cancel()  # while the lookup waits: it finishes anyway, its member kept for the next get
    assert await record.finish() == [[b"a", b"b"]]
    delivery = await listener.get(1.0)
    assert pulling.cancelled() and delivery is not None and delivery.message == b"b"
    assert listener.held == 0


async def test_waiters_that_time_out_or_leave_are_not_kept() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    leaving = asyncio.ensure_future(listener.get(5.0))
    timing_out = asyncio.ensure_future(listener.get(0.02))
    await asyncio.sleep(0)
    leaving.cancel()
    assert await timing_out is None
    assert leaving.cancelled() and listener._waiters == []
    inner.push(pack([b"a"]))
    delivery = await listener.get(1.0)  # the pull still running brought it: kept for the next get
    assert delivery is not None and delivery.message == b"a"


async def test_an_error_of_the_inner_listener_reaches_every_waiter() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    waiters = [asyncio.ensure_future(listener.get(5.0)) for _ in range(2)]
    await asyncio.sleep(0.01)
    inner.close_from_remote()
    for waiter in waiters:
        with pytest.raises(PipeBroken):
            await waiter


async def test_senders_wait_while_too_many_are_unconfirmed_and_a_cancelled_wait_takes_nothing() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_delay=10.0), max_unconfirmed=3)
    await sender.send(b"a")
    await sender.send(b"b")
    await sender.send(b"c")
    blocked = asyncio.ensure_future(sender.send(b"d"))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # three gathered or in flight: the fourth waits
    blocked.cancel()
    await asyncio.sleep(0)
    assert b"d" not in sender.unconfirmed()  # cancelled while waiting: not taken
    waiting = asyncio.ensure_future(sender.send(b"e"))
    inner.confirm()  # "a" is confirmed: room for one
    await asyncio.wait_for(waiting, 1.0)
    assert sorted(sender.unconfirmed()) == [b"b", b"c", b"e"]


async def _turn() -> None:
    """Lets the frame's own flushing task run."""
    for _ in range(3):
        await asyncio.sleep(0)


class _Record:
    """A done check that says which members are done (by content) and what it was asked."""

    def __init__(self, done: set[bytes], error: Exception | None = None) -> None:
        self.done = done
        self.error = error
        self.asked: list[list[bytes]] = []

    async def __call__(self, delivery: Delivery[bytes], members: Sequence[bytes]) -> Collection[int]:
        self.asked.append(list(members))
        if self.error is not None:
            raise self.error
        return [i for i, member in enumerate(members) if member in self.done]


class _Lookup(_Record):
    """A record whose lookups wait until :meth:`finish`."""

    def __init__(self, done: set[bytes]) -> None:
        super().__init__(done)
        self._go = asyncio.Event()

    async def __call__(self, delivery: Delivery[bytes], members: Sequence[bytes]) -> Collection[int]:
        await self._go.wait()
        return await super().__call__(delivery, members)

    async def finish(self) -> list[list[bytes]]:
        """Lets the lookups answer; what they were asked."""
        self._go.set()
        await asyncio.sleep(0.01)
        return self.asked


async def test_a_redelivered_frame_hands_out_only_the_members_without_a_recorded_result() -> None:
    inner: FakeListener[bytes] = FakeListener()
    record = _Record({b"a", b"c"})
    listener = FrameListener(inner, done=record)
    frame = pack([b"a", b"b", b"c"])
    inner.push(frame, redelivered=True)
    inner.push(pack([b"a", b"d"]))  # not redelivered: not looked up, all handed out
    got = [await listener.get(1.0) for _ in range(3)]
    assert [d.message for d in got if d is not None] == [b"b", b"a", b"d"]
    assert record.asked == [[b"a", b"b", b"c"]]
    assert inner.acked == []  # b still runs
    assert got[0] is not None
    await got[0].ack()
    assert inner.acked == [frame]


async def test_a_redelivered_lone_message_is_handed_out_without_a_lookup() -> None:
    inner: FakeListener[bytes] = FakeListener()
    record = _Record({b"done"})
    listener = FrameListener(inner, done=record)
    inner.push(b"done", redelivered=True)
    got = await listener.get(1.0)
    assert got is not None and got.message == b"done" and got.redelivered
    assert record.asked == [] and inner.acked == []


async def test_a_record_that_cannot_be_read_lets_every_member_run_again() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner, done=_Record({b"a"}, error=RuntimeError("broker down")))
    inner.push(pack([b"a", b"b"]), redelivered=True)
    got = [await listener.get(1.0) for _ in range(2)]
    assert [d.message for d in got if d is not None] == [b"a", b"b"]


async def test_shared_confirmations_give_a_frames_members_one_confirmation_that_fails_with_it() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=3, max_delay=10.0), share_confirmations=True)
    lone = await sender.send(b"a")  # nothing in flight: alone, a confirmation of its own
    frame = [await sender.send(m) for m in (b"b", b"c", b"d")]  # full: goes at once
    after = await sender.send(b"e")  # a new frame gathers: a new confirmation
    assert frame[0] is frame[1] is frame[2]
    assert len({id(lone), id(frame[0]), id(after)}) == 3
    await _turn()
    assert inner.sent == [b"a", pack([b"b", b"c", b"d"])]
    inner.confirm(1)
    await lone
    assert not frame[0].done()
    inner.reject(1)  # the frame is nacked: its one confirmation fails, every member stays unconfirmed
    with pytest.raises(MessageRejected):
        await frame[0]
    assert sorted(sender.unconfirmed()) == [b"b", b"c", b"d", b"e"]
    assert not after.done()
    sender.drop_unconfirmed()
