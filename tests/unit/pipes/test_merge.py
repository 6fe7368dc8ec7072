from __future__ import annotations

import asyncio

import pytest

from truba.pipes.base import Delivery
from truba.pipes.errors import PipeBroken, PipeClosed
from truba.pipes.merge import MergeListener
from truba.pipes.testing import FakeListener


async def test_merge_delivers_from_every_listener() -> None:
    a, b = FakeListener[str](), FakeListener[str]()
    merged = MergeListener([a, b])
    a.push("from-a")
    b.push("from-b")
    got = set()
    for _ in range(2):
        delivery = await merged.get(1.0)
        assert delivery is not None
        got.add(delivery.message)
        await delivery.ack()
    assert got == {"from-a", "from-b"}
    assert a.acked == ["from-a"] and b.acked == ["from-b"]
    await merged.close()


async def test_a_blocked_get_wakes_with_pipe_closed_on_close() -> None:
    merged = MergeListener([FakeListener[str]()])
    waiter = asyncio.create_task(merged.get(10.0))
    await asyncio.sleep(0.01)
    await merged.close()
    with pytest.raises(PipeClosed):
        await asyncio.wait_for(waiter, 1.0)
    await merged.close()  # idempotent


async def test_a_broken_inner_listener_is_reported_after_what_was_queued() -> None:
    a = FakeListener[str]()
    merged = MergeListener([a])
    a.push("last")
    await asyncio.sleep(0.01)
    a.close_from_remote(PipeBroken("node down"))
    delivery = await merged.get(1.0)
    assert delivery is not None and delivery.message == "last"
    with pytest.raises(PipeBroken, match="node down"):
        for _ in range(5):
            await merged.get(0.5)
    await merged.close()


async def test_subscribe_hands_deliveries_to_the_callback() -> None:
    a = FakeListener[str]()
    merged = MergeListener([a])
    seen: list[str] = []

    async def take(delivery: Delivery[str]) -> None:
        seen.append(delivery.message)
        await delivery.ack()

    merged.subscribe(take)
    a.push("x")
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == ["x"] and a.acked == ["x"]
    await merged.close()
