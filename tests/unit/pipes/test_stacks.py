"""The named stacks over FakeBrokers: what they carry, and the controls their handles give owners."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from truba.pipes.balance import BalanceSender
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import PipeError
from truba.pipes.frame import pack
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.prefetch import Window
from truba.pipes.stacks import listen_stack, send_stack
from truba.pipes.testing import FakeBroker, FakeSender
from truba.wire import TaskCodec, TaskMessage

SPEC = QueueSpec("tasks")


def task(n: int) -> TaskMessage:
    return TaskMessage(f"t{n}", n)


async def test_a_send_stack_spreads_over_its_brokers_and_hands_out_its_frame_limits() -> None:
    a, b = FakeBroker("fake://a"), FakeBroker("fake://b")
    limits = FrameLimits()
    stack = send_stack(TaskCodec(), [a, b], SPEC, frames=limits)
    assert stack.frames is limits and len(stack.links) == 2
    await asyncio.gather(*[await stack.sender.send(task(n)) for n in range(200)])
    assert a.messages("tasks") and b.messages("tasks")
    await stack.sender.close()


async def test_balance_hears_a_broker_leaf_break_through_the_handle_not_through_the_frame_layer() -> None:
    # Frames sit between balance and each broker's leaf and forward no health: the builder wires
    # the leaves' break notices to balance itself, so a's unconfirmed messages move to b at once.
    a, b = FakeBroker("fake://a"), FakeBroker("fake://b")
    stack = send_stack(TaskCodec(), [a, b], SPEC, frames=FrameLimits())
    heard: list[PipeError] = []
    stack.links[0].on_break(heard.append)  # an owner hears of it too, through the handle
    await asyncio.gather(*[await stack.sender.send(task(n)) for n in range(100)])  # both connected
    a.stall()
    pending = [await stack.sender.send(task(n)) for n in range(100, 300)]
    await asyncio.sleep(0.01)
    assert not all(p.done() for p in pending)  # some wait for a's confirms
    a.break_connection()
    await asyncio.wait_for(asyncio.gather(*pending), 5.0)  # no further send needed
    assert len(heard) == 1 and "connection lost" in str(heard[0])
    await stack.sender.close()


async def test_a_listen_stack_hands_out_its_unframe_layer_and_window() -> None:
    broker = FakeBroker()
    await broker.declare(SPEC)
    window = Window(10)
    stack = listen_stack(TaskCodec(), [broker], SPEC, window)
    assert stack.window is window
    publisher = await broker.sender(SPEC)
    await (await publisher.send(pack([TaskCodec().encode(task(n)) for n in range(3)])))
    first = await stack.listener.get(1.0)
    assert first is not None and first.message == task(0)
    assert stack.frames.held == 2  # the rest of the frame is at hand
    await first.ack()
    await stack.listener.close()


async def test_balance_skips_a_leaf_whose_health_says_not_ready_and_hears_its_breaks() -> None:
    class Health:
        def __init__(self, ready: bool) -> None:
            self.ready = ready
            self.callbacks: list[Callable[[PipeError], None]] = []

        def on_break(self, callback: Callable[[PipeError], None]) -> None:
            self.callbacks.append(callback)

    down, up = Health(False), Health(True)
    a, b = FakeSender[int](auto_confirm=True), FakeSender[int](auto_confirm=True)
    balanced = BalanceSender([a, b], max_load=10, health=[down, up])
    for n in range(20):
        await balanced.send(n)
    assert a.sent == [] and len(b.sent) == 20
    assert len(down.callbacks) == 1 and len(up.callbacks) == 1
    await balanced.close()
