"""An in-memory :class:`~truba.pipes.broker.Broker` for unit tests, scriptable like a real one failing.

Queues are shared by every leaf of one :class:`FakeBroker`: what a sender publishes, a listener
on the same queue gets (competing consumers), with RabbitMQ's semantics where truba relies on
them: a delivery is settled once; requeued or returned deliveries come back ``redelivered`` (with
``x-delivery-count`` on quorum queues); a rejected one goes to the queue's dead-letter queue;
a message to a missing queue is returned (its confirm fails with MessageRejected); a stream keeps
its messages for :meth:`~FakeBroker.read_log`; every message carries :data:`SENT_AT`.

The test scripts failures (after tower-test's handle, as the other fakes here):

- :meth:`FakeBroker.break_connection`: every open leaf breaks (ConnectionLost); unsettled
  deliveries go back to their queues; unconfirmed messages stay unconfirmed (they may also be
  in the queue already: an upper layer that sends them again makes a duplicate, as over AMQP);
- :meth:`FakeBroker.refuse`: new leaves and calls fail with ConnectionLost until allowed again;
- :meth:`FakeBroker.stall`: messages are taken but not confirmed (each confirm then times out
  after the sender's ``confirm_timeout``) and nothing is delivered, until :meth:`FakeBroker.resume`;
- :meth:`FakeBroker.drop_queue`: one queue and its messages are gone (its consumers break);
- :meth:`FakeBroker.lose_data`: the broker came back empty (every queue gone, connections broken).

Delayed messages (a sender opened with ``delayed=True``, :mod:`truba.pipes.delay`) are confirmed at
once and held by the broker, in no queue, until their due time by the broker's ``clock``; then
they are put in their queue (dropped if it is gone, like an orphan on RabbitMQ). With the real
clock (the default) a timer releases them; a test with its own clock calls
:meth:`FakeBroker.release_due` after moving it. :meth:`FakeBroker.lose_data` loses them too.

Nothing here touches the network; only the stall's confirm timeout and the delays use the clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import final

from truba.pipes.broker import QueueRef, QueueSpec
from truba.pipes.errors import ChannelLost, ConnectionLost, PipeClosed
from truba.pipes.fake_leaves import FakeBrokerListener, FakeBrokerSender, FakeMessage, FakeQueue

__all__ = ["FakeBroker"]


@final
class FakeBroker:
    """An in-memory broker; see the module docstring. ``url`` is its identity (``fake://b0``)."""

    def __init__(
        self, url: str = "fake://b0", *, name: str = "fake", clock: Callable[[], float] | None = None
    ) -> None:
        self.clock: Callable[[], float] = clock or time.time
        """The broker's clock for delayed messages (Unix time)."""
        self._timed = clock is None
        self._held: list[tuple[float, int, str, FakeMessage]] = []
        """Delayed messages not due yet: (due, order, queue, message), a heap."""
        self._order = itertools.count()
        self._url = url
        self._name = name
        self.queues: dict[str, FakeQueue] = {}
        self.published = 0
        """Messages taken from senders (counting duplicates)."""
        self.refused = False
        self.stalled = False
        self.closed = False
        self._leaves: set[FakeBrokerSender | FakeBrokerListener] = set()
        self._resumed = asyncio.Event()

    @property
    def url(self) -> str:
        return self._url

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"FakeBroker({self._url})"

    # --- the Broker protocol -------------------------------------------------------------------

    async def sender(
        self,
        queue: QueueRef,
        *,
        confirm_timeout: float = 30.0,
        max_unconfirmed: int = 1000,
        priority: int | None = None,
        copy_to: QueueRef | None = None,
        delayed: bool = False,
    ) -> FakeBrokerSender:
        self._check_reachable()
        if isinstance(queue, QueueSpec):
            await self.declare(queue)
        if isinstance(copy_to, QueueSpec):
            await self.declare(copy_to)
        copy = None if copy_to is None else _name(copy_to)
        leaf = FakeBrokerSender(
            self, _name(queue), confirm_timeout, max_unconfirmed, priority, copy, delayed=delayed
        )
        self._leaves.add(leaf)
        return leaf

    async def listener(self, queue: QueueRef, *, prefetch: int) -> FakeBrokerListener:
        self._check_reachable()
        if isinstance(queue, QueueSpec):
            await self.declare(queue)
        elif queue not in self.queues:
            raise ChannelLost(f"consume {queue}: NOT_FOUND - no queue '{queue}' on {self._url}")
        leaf = FakeBrokerListener(self, _name(queue), prefetch)
        self._leaves.add(leaf)
        return leaf

    async def read_log(
        self, queue: str, since: float | None, each: Callable[[bytes], None], *, timeout: float
    ) -> int:
        self._check_reachable()
        found = self.queues.get(queue)
        if found is None or found.spec.kind != "stream":
            raise ChannelLost(f"read {queue}: no such stream on {self._url}")
        count = 0
        for message in list(found.log):
            if since is None or message.at >= since:
                each(message.body)
                count += 1
        return count

    async def has_queue(self, name: str) -> bool:
        self._check_reachable()
        return name in self.queues

    async def declare(self, spec: QueueSpec) -> None:
        self._check_reachable()
        existing = self.queues.get(spec.name)
        if existing is None:
            self.queues[spec.name] = FakeQueue(spec)
        elif existing.spec != spec:
            raise ChannelLost(f"declare {spec.name}: PRECONDITION_FAILED - inequivalent arguments")

    async def close(self) -> None:
        self.closed = True
        for leaf in list(self._leaves):
            leaf.fail(PipeClosed(f"link to {self._url} is closed"))
        self._leaves.clear()

    # --- scripting -----------------------------------------------------------------------------

    def break_connection(self) -> None:
        """Every open leaf breaks with ConnectionLost; its unsettled deliveries are returned."""
        leaves, self._leaves = self._leaves, set()
        for leaf in leaves:
            leaf.fail(ConnectionLost(f"{self._url}: connection lost (scripted)"))

    def refuse(self, refused: bool = True) -> None:
        """New leaves and calls fail with ConnectionLost while ``refused`` (open ones go on)."""
        self.refused = refused

    def stall(self) -> None:
        """Messages are taken but neither confirmed nor delivered, until :meth:`resume`."""
        self.stalled = True
        self._resumed.clear()

    def resume(self) -> None:
        """Ends a stall: confirms held back arrive, deliveries flow again."""
        self.stalled = False
        self._resumed.set()
        for leaf in list(self._leaves):
            if isinstance(leaf, FakeBrokerSender):
                leaf.confirm_held()
        for queue in self.queues.values():
            queue.wake.set()

    def drop_queue(self, name: str) -> None:
        """Deletes queue ``name`` with its messages; its consumers break (ChannelLost)."""
        self.queues.pop(name, None)
        for leaf in list(self._leaves):
            if isinstance(leaf, FakeBrokerListener) and leaf.queue == name:
                self._leaves.discard(leaf)
                leaf.fail(ChannelLost(f"{name}: the queue was deleted (scripted)"))

    def lose_data(self) -> None:
        """The broker came back empty: every queue is gone, delayed messages too, and every
        connection broken."""
        self.queues.clear()
        self._held.clear()
        self.break_connection()

    def held(self, queue: str) -> list[bytes]:
        """The bodies of delayed messages for ``queue`` not due yet, soonest first."""
        return [message.body for _, _, name, message in sorted(self._held) if name == queue]

    def release_due(self) -> int:
        """Puts every delayed message due by :attr:`clock` in its queue; returns how many."""
        now = self.clock()
        released = 0
        while self._held and self._held[0][0] <= now:
            _, _, name, message = heapq.heappop(self._held)
            target = self.queues.get(name)
            if target is not None:
                target.put(message)
                released += 1
        return released

    def hold(self, queue: str, due: float, message: FakeMessage) -> None:
        """For the leaves: keeps a delayed message until ``due``."""
        heapq.heappush(self._held, (due, next(self._order), queue, message))
        if self._timed:
            asyncio.get_running_loop().call_later(max(0.0, due - self.clock()), self.release_due)

    def messages(self, queue: str) -> list[bytes]:
        """The bodies ready in ``queue`` (a stream: its log), oldest first."""
        found = self.queues.get(queue)
        if found is None:
            return []
        return [m.body for m in (found.log if found.spec.kind == "stream" else found.ready)]

    # --- for the leaves ------------------------------------------------------------------------

    def _check_reachable(self) -> None:
        if self.closed:
            raise PipeClosed(f"link to {self._url} is closed")
        if self.refused:
            raise ConnectionLost(f"connect {self._url}: refused (scripted)")

    def _forget(self, leaf: FakeBrokerSender | FakeBrokerListener) -> None:
        self._leaves.discard(leaf)


def _name(queue: QueueRef) -> str:
    return queue.name if isinstance(queue, QueueSpec) else queue
