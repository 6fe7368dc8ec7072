"""The contract suite (``tests/unit/pipes/contract.py``) against RabbitMQ: the leaves, reopen
wrapping them, and the frame layers over them (a frame is one AMQP message).

Each harness gets its own queue and its own fault proxy in front of a shared broker, so faults hit
only that pipe's connections: ``stall("downstream")`` holds the broker's confirms (publishes still
arrive), ``cut()`` resets the connections (the leaves break). A rejecting harness publishes to a
queue that does not exist (mandatory: the broker returns the message). Reopen wrappers connect
through :class:`RabbitBroker`, as the production stacks do. Queues are quorum queues, as truba's.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.brokers import BrokerNode, amqp_url
from tests.unit.pipes.contract import (
    ListenerCheck,
    ListenerFactory,
    ListenerHarness,
    SenderCheck,
    SenderFactory,
    SenderHarness,
    Timing,
    listener_checks,
    sender_checks,
)
from truba.backoff import Backoff
from truba.local import ThreadedFaultProxy
from truba.pipes.base import Listener, Sender
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.frame import FrameSender
from truba.pipes.frame_format import pack
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.frame_listener import FrameListener
from truba.pipes.rabbit import RabbitBroker, RabbitConnection, RabbitListener, RabbitSender
from truba.pipes.reopen import ReopenSender
from truba.pipes.reopen_listener import ReopenListener

pytestmark = pytest.mark.integration

REAL = Timing(short=0.3, patience=10.0, settle=0.3, slack=1.0)
RECONNECT = Backoff(attempts=None, base=0.05, cap=0.5)
CONFIRM_TIMEOUT = 10.0


@dataclass
class Rig:
    """What every harness of one test shares: the broker, the proxy factory, a connection name."""

    node: BrokerNode
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy]
    name: str

    def queue(self) -> str:
        return f"truba.test.contract.{uuid.uuid4().hex[:12]}"

    async def admin(self) -> RabbitConnection:
        """A direct connection (no proxy) that declares, publishes and counts."""
        return await RabbitConnection.open(self.node.url, name=f"{self.name} admin", heartbeat=5)


async def _close_quietly(pipe: Sender[Any] | Listener[Any]) -> None:
    with contextlib.suppress(PipeError, TimeoutError):
        await asyncio.wait_for(pipe.close(), REAL.patience)


class _Link:
    """The leaves' side of a fault proxy: opens leaves through it and injects its faults."""

    def __init__(self, rig: Rig, queue: str) -> None:
        self.proxy = rig.fault_proxy(rig.node)
        self.url = amqp_url(self.proxy.host, self.proxy.port)
        self.queue = queue
        self.name = rig.name
        self._connections: list[RabbitConnection] = []
        self._broker: RabbitBroker | None = None

    async def connection(self) -> RabbitConnection:
        """A dedicated connection for one leaf."""
        connection = await RabbitConnection.open(self.url, name=self.name, heartbeat=5)
        self._connections.append(connection)
        return connection

    def broker(self) -> RabbitBroker:
        """The shared, reopening connection that production connectors use."""
        if self._broker is None:
            self._broker = RabbitBroker(self.url, name=self.name, heartbeat=5, connect_timeout=5.0)
        return self._broker

    async def stall_confirms(self) -> None:
        await asyncio.to_thread(self.proxy.stall, "downstream")

    async def flow(self) -> None:
        await asyncio.to_thread(self.proxy.pass_)

    async def cut(self) -> None:
        await asyncio.to_thread(self.proxy.cut)

    async def aclose(self) -> None:
        await self.flow()
        if self._broker is not None:
            await self._broker.close()
        for connection in self._connections:
            await connection.close()


class RabbitSenderBottom:
    """RabbitSender leaves through a fault proxy. Confirms can be held and released only all at once."""

    partial_confirms = False

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.leaves: list[RabbitSender] = []

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> bytes:
        return f"m{i}".encode()

    async def leaf(self) -> RabbitSender:
        """A leaf on a connection of its own."""
        connection = await self.link.connection()
        leaf = await connection.sender(self.link.queue, confirm_timeout=CONFIRM_TIMEOUT)
        self.leaves.append(leaf)
        return leaf

    async def connect(self) -> RabbitSender:
        """A leaf on the shared connection (a connector for reopen)."""
        leaf = await self.link.broker().sender(self.link.queue, confirm_timeout=CONFIRM_TIMEOUT)
        self.leaves.append(leaf)
        return leaf

    async def hold(self) -> None:
        await self.link.stall_confirms()

    async def release(self, count: int | None = None) -> None:
        assert count is None, "a real broker cannot confirm some held messages and not others"
        await self.link.flow()

    async def break_(self) -> None:
        await self.link.cut()

    async def open_leaves(self) -> int:
        still_open = 0
        for leaf in self.leaves:
            try:
                await leaf.send(b"probe: is this leaf closed?")
            except PipeClosed:
                continue
            except PipeError:
                pass
            still_open += 1
        return still_open


class RabbitListenerBottom:
    """RabbitListener leaves through a fault proxy; messages are published directly to the queue."""

    def __init__(self, link: _Link, admin: RabbitConnection, pusher: RabbitSender, *, framed: bool) -> None:
        self.link = link
        self._framed = framed
        self.leaves: list[RabbitListener] = []
        self._admin = admin
        self._pusher = pusher

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> bytes:
        return f"m{i}".encode()

    async def leaf(self) -> RabbitListener:
        connection = await self.link.connection()
        leaf = await connection.listener(self.link.queue, prefetch=10)
        self.leaves.append(leaf)
        return leaf

    async def connect(self) -> RabbitListener:
        leaf = await self.link.broker().listener(self.link.queue, prefetch=10)
        self.leaves.append(leaf)
        return leaf

    async def push(self, message: bytes) -> None:
        # Framed: each message arrives as a frame of one, handed out as a member of it.
        data = pack([message]) if self._framed else message
        await asyncio.wait_for(await self._pusher.send(data), REAL.patience)

    async def break_(self) -> None:
        await self.link.cut()

    async def open_leaves(self) -> int:
        still_open = 0
        for leaf in self.leaves:
            try:
                await leaf.get(0.001)
            except PipeClosed:
                continue
            except PipeError:
                pass
            still_open += 1
        return still_open

    async def backlog(self) -> int:
        await asyncio.sleep(REAL.settle)  # a closed channel's unsettled deliveries return to the queue
        count = await self._admin.message_count(self.link.queue)
        assert count is not None, "the queue is gone"
        return count


def rabbit_senders(rig: Rig, *, reopen: bool, framed: bool = False) -> SenderFactory[bytes]:
    @contextlib.asynccontextmanager
    async def make(*, rejecting: bool = False) -> AsyncIterator[SenderHarness[bytes]]:
        queue = rig.queue()
        admin = await rig.admin()
        link = _Link(rig, queue)
        bottom = RabbitSenderBottom(link)
        try:
            if not rejecting:
                await admin.declare(QueueSpec(queue))
            sender: Sender[bytes] = (
                ReopenSender(bottom.connect, label=queue, connect_timeout=5.0, backoff=RECONNECT)
                if reopen
                else await bottom.leaf()
            )
            if framed:
                sender = FrameSender(sender, FrameLimits())
            try:
                yield SenderHarness(sender, bottom, REAL, reopens=reopen)
            finally:
                await link.flow()
                await _close_quietly(sender)
        finally:
            await link.aclose()
            await admin.delete(queue)
            await admin.close()

    return make


def rabbit_listeners(rig: Rig, *, reopen: bool, framed: bool = False) -> ListenerFactory[bytes]:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[ListenerHarness[bytes]]:
        queue = rig.queue()
        admin = await rig.admin()
        link = _Link(rig, queue)
        try:
            await admin.declare(QueueSpec(queue))
            pusher = await admin.sender(queue)
            bottom = RabbitListenerBottom(link, admin, pusher, framed=framed)
            listener: Listener[bytes] = (
                ReopenListener(bottom.connect, label=queue, connect_timeout=5.0, backoff=RECONNECT)
                if reopen
                else await bottom.leaf()
            )
            if framed:
                listener = FrameListener(listener)
            try:
                yield ListenerHarness(listener, bottom, REAL, reopens=reopen)
            finally:
                await _close_quietly(listener)
                await _close_quietly(pusher)
        finally:
            await link.aclose()
            await admin.delete(queue)
            await admin.close()

    return make


@dataclass(frozen=True)
class Impl:
    reopen: bool
    framed: bool = False


IMPLS = {"rabbit": Impl(False), "reopen-rabbit": Impl(True), "frame-rabbit": Impl(False, framed=True)}

SENDER_XFAIL: dict[tuple[str, str], str] = {}
LISTENER_XFAIL: dict[tuple[str, str], str] = {}


def _cases(checks: Callable[..., dict[str, Any]], xfail: dict[tuple[str, str], str]) -> list[Any]:
    cases = []
    for label, impl in IMPLS.items():
        for name, check in checks(reopens=impl.reopen).items():
            reason = xfail.get((label, name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(impl, check, id=f"{label}-{name}", marks=marks))
    return cases


@pytest.mark.parametrize(("impl", "check"), _cases(sender_checks, SENDER_XFAIL))
async def test_rabbit_sender_contract(
    impl: Impl,
    check: SenderCheck,
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
    request: pytest.FixtureRequest,
) -> None:
    rig = Rig(rabbit_nodes[0], fault_proxy, request.node.nodeid)
    await check(rabbit_senders(rig, reopen=impl.reopen, framed=impl.framed))


@pytest.mark.parametrize(("impl", "check"), _cases(listener_checks, LISTENER_XFAIL))
async def test_rabbit_listener_contract(
    impl: Impl,
    check: ListenerCheck,
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
    request: pytest.FixtureRequest,
) -> None:
    rig = Rig(rabbit_nodes[0], fault_proxy, request.node.nodeid)
    await check(rabbit_listeners(rig, reopen=impl.reopen, framed=impl.framed))
