from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from truba.backoff import Backoff
from truba.pipes.errors import ConnectionLost, MessageRejected, PipeBroken, PipeClosed
from truba.pipes.reopen import ReopenSender, State
from truba.pipes.reopen_listener import ReopenListener
from truba.pipes.testing import FakeListener, FakeSender


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


FAST = Backoff(attempts=None, sleep=_no_sleep)


class Connector:
    """Hands out fresh fakes; fails the next ``failures`` connects."""

    def __init__(self, failures: int = 0) -> None:
        self.senders: list[FakeSender[str]] = []
        self.listeners: list[FakeListener[str]] = []
        self.failures = failures

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionLost("broker refused")

    async def sender(self) -> FakeSender[str]:
        self._maybe_fail()
        self.senders.append(FakeSender())
        return self.senders[-1]

    async def listener(self) -> FakeListener[str]:
        self._maybe_fail()
        self.listeners.append(FakeListener())
        return self.listeners[-1]


async def _until(condition: object) -> None:
    for _ in range(500):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


async def test_the_first_connect_error_goes_to_the_caller() -> None:
    connector = Connector(failures=1)
    sender = ReopenSender(connector.sender, backoff=FAST)
    with pytest.raises(ConnectionLost):
        await sender.send("m")
    assert sender.state is State.IDLE
    await sender.send("m")  # the next call connects
    assert (sender.state, connector.senders[0].sent) == (State.CONNECTED, ["m"])


def _gated(gate: asyncio.Event, connector: Connector) -> Callable[[], Awaitable[FakeSender[str]]]:
    """A connect that waits for ``gate`` before it hands out the connector's next sender."""

    async def connect() -> FakeSender[str]:
        await gate.wait()
        return await connector.sender()

    return connect


async def test_connect_ahead_opens_before_the_first_send_which_waits_for_it() -> None:
    gate, connector = asyncio.Event(), Connector()
    sender = ReopenSender(_gated(gate, connector), backoff=FAST)
    sender.connect_ahead()
    sender.connect_ahead()  # once
    await asyncio.sleep(0)
    assert sender.state is State.CONNECTING
    sending = asyncio.create_task(sender.send("m"))
    await asyncio.sleep(0.01)
    assert not sending.done()  # waits for the connect under way, does not open another
    gate.set()
    await sending
    assert len(connector.senders) == 1 and connector.senders[0].sent == ["m"]
    await sender.close()


async def test_a_failed_connect_ahead_leaves_the_first_send_to_connect_and_raise() -> None:
    connector = Connector(failures=2)
    sender = ReopenSender(connector.sender, backoff=FAST)
    sender.connect_ahead()
    await _until(lambda: connector.failures == 1)
    await asyncio.sleep(0)
    assert sender.state is State.IDLE
    with pytest.raises(ConnectionLost):  # the caller hears why
        await sender.send("m")
    await sender.send("m")
    assert connector.senders[0].sent == ["m"]
    await sender.close()


async def test_a_sender_closed_while_connecting_ahead_closes_the_leaf_it_gets() -> None:
    gate, connector = asyncio.Event(), Connector()
    sender = ReopenSender(_gated(gate, connector), backoff=FAST)
    sender.connect_ahead()
    await asyncio.sleep(0)
    closing = asyncio.create_task(sender.close())
    await asyncio.sleep(0.01)
    gate.set()
    await closing  # waited for the connect, which closed what it opened
    assert connector.senders[0].closed and sender.state is State.CLOSED


async def test_a_break_reopens_and_resends_unconfirmed_with_the_same_confirmations() -> None:
    connector = Connector()
    sender = ReopenSender(connector.sender, backoff=FAST)
    confirmations = [await sender.send(f"m{i}") for i in range(3)]
    first = connector.senders[0]
    first.confirm(1)
    await asyncio.sleep(0)
    connector.failures = 2  # the broker is down for two attempts
    first.break_(PipeBroken("connection reset"))
    await _until(lambda: sender.state is State.CONNECTED and len(connector.senders) == 2)
    second = connector.senders[1]
    assert second.sent == ["m1", "m2"]  # only what was unconfirmed, in order
    assert first.unconfirmed() == []  # handed over, not kept twice
    second.confirm()
    await asyncio.wait_for(asyncio.gather(*confirmations), 1.0)
    assert sender.unconfirmed() == [] and sender.reopened == 1


async def test_a_dead_channel_whose_close_hangs_does_not_stop_the_reopen() -> None:
    connector = Connector()
    sender = ReopenSender(connector.sender, backoff=FAST)
    confirmation = await sender.send("m")
    first = connector.senders[0]

    async def hangs() -> None:  # a blocked connection never answers the channel close
        await asyncio.sleep(3600)

    first.close = hangs  # type: ignore[method-assign]
    first.break_(PipeBroken("confirm timed out"))
    await asyncio.wait_for(_until_reopened(sender, connector), 5.0)  # after the 1 s close bound
    connector.senders[1].confirm()
    await asyncio.wait_for(confirmation, 1.0)


async def _until_reopened(sender: ReopenSender[str], connector: Connector) -> None:
    while not (sender.state is State.CONNECTED and len(connector.senders) == 2):
        await asyncio.sleep(0.01)


async def test_while_broken_send_fails_fast_with_a_retryable_error() -> None:
    connector = Connector()
    sender = ReopenSender(connector.sender, backoff=Backoff(attempts=None, base=10.0, cap=10.0))
    await sender.send("m")
    connector.senders[0].break_(PipeBroken("gone"))
    await asyncio.sleep(0)
    assert not sender.ready
    with pytest.raises(PipeBroken) as raised:
        await asyncio.wait_for(sender.send("n"), 0.5)
    assert raised.value.retryable
    assert sender.unconfirmed() == ["m"]
    await sender.close()
    await sender.close()
    with pytest.raises(PipeClosed):
        await sender.send("x")


async def test_a_rejected_message_is_not_resent_but_stays_unconfirmed() -> None:
    connector = Connector()
    sender = ReopenSender(connector.sender, backoff=FAST)
    confirmation = await sender.send("returned")
    connector.senders[0].reject(1)
    with pytest.raises(MessageRejected):
        await confirmation
    assert sender.unconfirmed() == ["returned"]
    sender.drop_unconfirmed()
    assert sender.unconfirmed() == []


async def test_listener_reopens_and_drops_settling_of_old_deliveries() -> None:
    connector = Connector()
    listener = ReopenListener(connector.listener, backoff=FAST)
    assert await listener.get(0.01) is None  # connects
    connector.listeners[0].push("a")
    old = await listener.get(1.0)
    assert old is not None and old.message == "a"
    connector.listeners[0].close_from_remote(PipeBroken("channel closed"))
    assert await listener.get(0.05) is None
    await _until(lambda: len(connector.listeners) == 2 and listener.state is State.CONNECTED)
    await old.ack()  # dropped: the broker has requeued it already; must not raise
    assert connector.listeners[0].acked == []
    connector.listeners[1].push("a", redelivered=True)
    again = await listener.get(1.0)
    assert again is not None and again.redelivered
    await again.ack()
    assert connector.listeners[1].acked == ["a"]
    await listener.close()
    with pytest.raises(PipeClosed):
        await listener.get(0.01)


async def test_a_blocked_listener_get_wakes_on_close() -> None:
    connector = Connector()
    listener = ReopenListener(connector.listener, backoff=FAST)
    assert await listener.get(0.01) is None
    waiter = asyncio.create_task(listener.get(10.0))
    await asyncio.sleep(0.01)
    await listener.close()
    with pytest.raises(PipeClosed):
        await asyncio.wait_for(waiter, 1.0)


async def _connecting_listener() -> tuple[ReopenListener[int], asyncio.Event, list[FakeListener[int]]]:
    """A reopen listener whose first connect waits for the returned event."""
    release = asyncio.Event()
    made: list[FakeListener[int]] = []

    async def connect() -> FakeListener[int]:
        await release.wait()
        made.append(FakeListener())
        return made[-1]

    return ReopenListener(connect, label="slow"), release, made


async def test_a_listener_closed_while_connecting_closes_the_leaf_it_gets() -> None:
    listener, release, made = await _connecting_listener()
    getting = asyncio.create_task(listener.get(5.0))
    await asyncio.sleep(0)
    await listener.close()
    release.set()
    with pytest.raises(PipeClosed):
        await getting
    assert made and made[0].closed, "the leaf opened after close() lives on and consumes"


async def test_a_listener_cancelled_while_connecting_cancels_the_leaf_it_gets() -> None:
    listener, release, made = await _connecting_listener()
    getting = asyncio.create_task(listener.get(0.1))
    await asyncio.sleep(0)
    cancelling = asyncio.create_task(listener.cancel())
    await asyncio.sleep(0.01)
    assert not cancelling.done(), "cancel() did not wait for the connect under way"
    release.set()
    await cancelling
    assert await getting is None
    assert made and made[0].cancelled, "the leaf opened after cancel() consumes"
    await listener.close()
