"""Delayed messages: the delay levels' routing keys and bindings, and FakeBroker holding a
delayed message until it is due (by an injected clock)."""

from __future__ import annotations

import time

import pytest

from truba.pipes import delay
from truba.pipes.broker import QueueSpec
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.stacks import SendOptions, send_stack

QUEUE = "truba.job.j1.tasks"


class _Bytes:
    def encode(self, message: bytes) -> bytes:
        return message

    def decode(self, data: bytes) -> bytes:
        return data


def _matches(binding: dict[str, str], headers: dict[str, str]) -> bool:
    """A headers exchange's ``x-match: all``: every bound header present with its value."""
    assert binding["x-match"] == "all"
    return all(headers.get(key) == value for key, value in binding.items() if key != "x-match")


def _path(seconds: float) -> list[int]:
    """The levels a message waits in, following the bindings as RabbitMQ routes it from the
    exchange it is published to down to the out exchange."""
    headers = delay.bit_headers(seconds)
    level = int(delay.first_exchange(seconds).rsplit(".", 1)[1])
    waits = []
    while level >= 0:
        wait, pass_on = (
            _matches(delay.wait_binding(level), headers),
            _matches(delay.pass_binding(level), headers),
        )
        assert wait != pass_on  # exactly one way on
        if wait:
            waits.append(level)
        level -= 1
    return waits


@pytest.mark.parametrize("seconds", [0.1, 1, 2.5, 5, 3600, 3 * 86400, 2**20 + 0.3])
def test_a_delay_waits_its_length_in_the_levels_it_passes(seconds: float) -> None:
    waits = _path(seconds)
    assert sum(delay.level_ttl_ms(level) for level in waits) == round(seconds * 1000)
    assert len(waits) <= delay.LEVELS


def test_a_delay_is_rounded_to_the_nearest_tick_and_never_negative() -> None:
    assert delay.delay_bits(0.04) == 0
    assert delay.delay_bits(0.05) == 1
    assert delay.delay_bits(1.26) == 13
    assert delay.delay_bits(-5) == 0


def test_delays_of_days_fit_and_a_delay_over_the_longest_is_refused() -> None:
    assert delay.MAX_DELAY > 365 * 86400
    with pytest.raises(ValueError, match="longest"):
        delay.bit_headers(delay.MAX_DELAY + 1)


def test_a_due_time_travels_in_front_of_the_body() -> None:
    assert delay.split_due(delay.with_due(b"body", 1234.5)) == (1234.5, b"body")
    with pytest.raises(ValueError):
        delay.split_due(b"short")


async def test_fake_broker_holds_a_delayed_message_until_it_is_due() -> None:
    now = [1000.0]
    broker = FakeBroker(clock=lambda: now[0])
    spec = QueueSpec(QUEUE, delays=True)
    sender = await broker.sender(spec, delayed=True)
    await (await sender.send(delay.with_due(b"later", 1005.0)))
    await (await sender.send(delay.with_due(b"sooner", 1002.0)))
    await (await sender.send(delay.with_due(b"overdue", 999.0)))
    assert broker.messages(QUEUE) == [b"overdue"]
    assert broker.held(QUEUE) == [b"sooner", b"later"]
    now[0] = 1002.0
    assert broker.release_due() == 1
    assert broker.messages(QUEUE) == [b"overdue", b"sooner"]
    now[0] = 1010.0
    broker.release_due()
    assert broker.messages(QUEUE) == [b"overdue", b"sooner", b"later"]
    assert broker.held(QUEUE) == []


async def test_fake_broker_loses_delayed_messages_with_its_data() -> None:
    broker = FakeBroker(clock=lambda: 0.0)
    sender = await broker.sender(QueueSpec(QUEUE, delays=True), delayed=True)
    await (await sender.send(delay.with_due(b"m", 10.0)))
    broker.lose_data()
    assert broker.held(QUEUE) == []


async def test_fake_broker_releases_a_delayed_message_on_the_real_clock() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE, delays=True), delayed=True)
    await (await sender.send(delay.with_due(b"m", time.time() + 0.05)))
    listener = await broker.listener(QUEUE, prefetch=1)
    delivery = await listener.get(2.0)
    assert delivery is not None and delivery.message == b"m"


def test_a_stack_of_delayed_messages_refuses_frames() -> None:
    with pytest.raises(ValueError, match="frames"):
        send_stack(
            _Bytes(),
            [FakeBroker()],
            QUEUE,
            options=SendOptions(delayed=True),
            frames=FrameLimits(),
        )
