from __future__ import annotations

import asyncio
import random

import pytest

from truba.pipes.balance import BalanceSender
from truba.pipes.errors import MessageRejected, PipeBroken, PipeClosed, SendTimeout
from truba.pipes.testing import FakeSender


async def test_balance_spreads_messages_over_senders() -> None:
    senders = [FakeSender[int](auto_confirm=True) for _ in range(3)]
    # A still clock: every sender is equally fast, so the spread is the random draw's alone (on
    # the real clock a preempted confirm makes one sender look slow; see the test below).
    balanced = BalanceSender(senders, max_load=10, rng=random.Random(1), monotonic=lambda: 0.0)
    for i in range(300):
        await balanced.send(i)
    counts = [len(s.sent) for s in senders]
    assert sum(counts) == 300
    assert min(counts) > 60, counts


async def test_a_sender_that_looked_slow_once_gets_messages_again_as_its_estimate_fades() -> None:
    clock = [0.0]
    a, b = FakeSender[int](), FakeSender[int](auto_confirm=True)
    balanced = BalanceSender([a, b], max_load=100, rng=random.Random(3), monotonic=lambda: clock[0])
    while not a.sent:  # until one message went to a
        await balanced.send(0)
    clock[0] = 0.5  # a's one confirm comes half a second later: a looks 500 times slower than b
    a.auto_confirm = True
    a.confirm()
    await asyncio.sleep(0)  # confirmation callbacks run on the next loop iteration
    sent_to_a = len(a.sent)
    for i in range(200):
        await balanced.send(i)
    await asyncio.sleep(0)  # b's confirms settle: nothing of b's is left waiting
    assert len(a.sent) == sent_to_a  # right after: b is cheaper every time
    clock[0] = 10.5  # ten seconds without a confirm from a: its estimate has faded
    for i in range(200):
        await balanced.send(i)
    assert len(a.sent) - sent_to_a > 50, (len(a.sent), len(b.sent))


async def test_a_slow_sender_fills_to_its_cap_and_the_others_take_the_rest() -> None:
    slow, fast = FakeSender[int](), FakeSender[int](auto_confirm=True)
    balanced = BalanceSender([slow, fast], max_load=5, rng=random.Random(2))
    for i in range(100):
        await balanced.send(i)
    assert len(slow.sent) == 5
    assert len(fast.sent) == 95
    await asyncio.sleep(0)  # confirmation callbacks run on the next loop iteration
    assert balanced.unconfirmed() == slow.sent


async def test_send_waits_when_every_sender_is_at_its_cap() -> None:
    only = FakeSender[int]()
    balanced = BalanceSender([only], max_load=2)
    await balanced.send(1)
    await balanced.send(2)
    blocked = asyncio.create_task(balanced.send(3))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    only.confirm(1)
    await asyncio.wait_for(blocked, 1.0)
    assert only.sent == [1, 2, 3]


async def test_a_broken_sender_is_skipped_and_all_broken_raises_the_cause() -> None:
    a, b = FakeSender[int](auto_confirm=True), FakeSender[int](auto_confirm=True)
    a.fail_next(PipeBroken("a is down"))
    balanced = BalanceSender([a, b], rng=random.Random(0))
    for i in range(10):
        await balanced.send(i)
    assert b.sent == list(range(10)) or len(a.sent) + len(b.sent) == 10
    b.fail_next(PipeBroken("b is down"))
    a.break_(PipeBroken("a is down"))
    with pytest.raises(PipeBroken):
        for i in range(20):
            await balanced.send(i)


async def test_close_is_idempotent_and_closes_every_sender() -> None:
    senders = [FakeSender[int](), FakeSender[int]()]
    balanced = BalanceSender(senders)
    await balanced.close()
    await balanced.close()
    assert all(s.closed for s in senders)
    with pytest.raises(PipeClosed):
        await balanced.send(1)


async def test_a_sender_that_breaks_has_its_unconfirmed_moved_and_confirmations_follow() -> None:
    a, b = FakeSender[int](), FakeSender[int]()
    balanced = BalanceSender([a, b], max_load=100, rng=random.Random(3))
    confirmations = [await balanced.send(i) for i in range(20)]
    on_a = list(a.sent)
    assert on_a and len(b.sent) == 20 - len(on_a)
    a.break_(PipeBroken("a lost its connection"))
    await asyncio.sleep(0.01)
    # a's messages went through b; a forgot them.
    assert sorted(b.sent) == list(range(20))
    assert a.unconfirmed() == []
    b.confirm()
    await asyncio.wait_for(asyncio.gather(*confirmations), 1.0)
    assert balanced.unconfirmed() == [] and balanced.moved == len(on_a)


async def test_a_rejected_message_fails_its_confirmation_and_stays_unconfirmed() -> None:
    only = FakeSender[int]()
    balanced = BalanceSender([only])
    confirmation = await balanced.send(7)
    only.reject(1)
    with pytest.raises(MessageRejected):
        await confirmation
    assert balanced.unconfirmed() == [7]


async def test_a_down_sender_gets_traffic_again_after_its_cooldown() -> None:
    clock = [0.0]
    a, b = FakeSender[int](auto_confirm=True), FakeSender[int](auto_confirm=True)
    balanced = BalanceSender([a, b], cooldown=1.0, rng=random.Random(4), monotonic=lambda: clock[0])
    a.fail_next(SendTimeout("blip"))  # a transient failure: retryable, the fake stays usable
    for i in range(10):
        await balanced.send(i)
    before = len(a.sent)
    for i in range(10):
        await balanced.send(i)
    assert len(a.sent) == before  # still cooling down
    clock[0] = 5.0
    for i in range(30):
        await balanced.send(i)
    assert len(a.sent) > before


def _full_fast_and_slow(
    slow_cost_ratio: float,
) -> tuple[FakeSender[int], FakeSender[int], BalanceSender[int]]:
    """A fast sender at its cap (4 unconfirmed, 10 ms each) and an idle slow one whose next
    message would be confirmed ``slow_cost_ratio`` times later than a message queued on the fast."""
    clock = [0.0]
    fast, slow = FakeSender[int](), FakeSender[int]()
    balanced = BalanceSender([fast, slow], max_load=4, rng=random.Random(5), monotonic=lambda: clock[0])
    fast_wait = 0.010 * (4 + 1)
    balanced._service[:] = [0.010, fast_wait * slow_cost_ratio]  # as if learnt from earlier confirms
    balanced._confirmed[:] = [100, 100]  # past slow start
    return fast, slow, balanced


async def test_a_full_fast_sender_keeps_its_messages_rather_than_start_a_long_tail_on_a_slow_one() -> None:
    fast, slow, balanced = _full_fast_and_slow(slow_cost_ratio=1.6)
    for i in range(4):
        await balanced.send(i)
    assert (len(fast.sent), len(slow.sent)) == (4, 0)
    # The fast one is full; the slow one would confirm 1.6 times later: wait for the fast one.
    waiting = asyncio.create_task(balanced.send(4))
    await asyncio.sleep(0.01)
    assert not waiting.done() and slow.sent == []
    fast.confirm(1)
    await asyncio.wait_for(waiting, 1.0)
    assert fast.sent == [0, 1, 2, 3, 4] and slow.sent == []


async def test_a_full_sender_overflows_to_a_comparable_one_without_waiting() -> None:
    fast, slow, balanced = _full_fast_and_slow(slow_cost_ratio=1.1)
    for i in range(5):
        await asyncio.wait_for(balanced.send(i), 1.0)  # never waits: the other has room
    assert (len(fast.sent), len(slow.sent)) == (4, 1)
