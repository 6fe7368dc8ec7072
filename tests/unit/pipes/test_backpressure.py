from __future__ import annotations

import asyncio
import random

import pytest

from truba.pipes.backpressure import Room, Window
from truba.pipes.balance import BalanceSender
from truba.pipes.errors import PipeClosed
from truba.pipes.frame import FrameLimits, FrameSender
from truba.pipes.testing import FakeSender


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_send_waits_while_the_window_is_full_and_wakes_when_a_place_is_given_back() -> None:
    window = Window(2)
    window.take(2)
    assert window.full
    waiting = asyncio.create_task(window.wait())
    await _turn()
    assert not waiting.done()
    window.give()
    await asyncio.wait_for(waiting, 1.0)
    assert not window.full


async def test_a_shut_room_wakes_every_waiting_send_for_good() -> None:
    room = Room()
    window = Window(1, room)
    window.take()
    waiters = [asyncio.create_task(window.wait()) for _ in range(3)]
    await _turn()
    assert not any(w.done() for w in waiters)
    room.close()
    await asyncio.wait_for(asyncio.gather(*waiters), 1.0)
    await asyncio.wait_for(window.wait(), 1.0)  # still full, but shut: no wait
    assert window.full


async def test_a_batched_window_wakes_its_room_only_once_a_batch_of_places_is_free() -> None:
    window = Window(16, wake_batch=32)  # at most 16 // 8 + 1 = 3 places per wake
    window.take(16)
    waiting = asyncio.create_task(window.room.wait())
    window.give()
    window.give()
    await _turn()
    assert not waiting.done(), "woken with only two places free"
    window.give()
    await asyncio.wait_for(waiting, 1.0)


async def test_reset_frees_every_place_and_a_resize_applies_at_once() -> None:
    window = Window(3)
    window.take(3)
    window.resize(5)
    assert not window.full
    window.take(2)
    waiting = asyncio.create_task(window.wait())
    await _turn()
    assert not waiting.done()
    window.reset()
    await asyncio.wait_for(waiting, 1.0)
    assert window.used == 0


def test_a_window_needs_a_place() -> None:
    with pytest.raises(ValueError):
        Window(0)


async def test_a_frame_send_waiting_for_room_raises_pipe_closed_on_close() -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = FrameSender(inner, FrameLimits(max_messages=1), max_unconfirmed=1)
    await sender.send(b"a")
    blocked = asyncio.create_task(sender.send(b"b"))
    await _turn()
    assert not blocked.done()
    await sender.close()
    with pytest.raises(PipeClosed):
        await asyncio.wait_for(blocked, 1.0)


async def test_a_balance_send_waiting_for_room_raises_pipe_closed_on_close() -> None:
    only = FakeSender[int]()
    balanced = BalanceSender([only], max_load=1, rng=random.Random(1))
    await balanced.send(1)
    blocked = asyncio.create_task(balanced.send(2))
    await _turn()
    assert not blocked.done()
    await balanced.close()
    with pytest.raises(PipeClosed):
        await asyncio.wait_for(blocked, 1.0)
