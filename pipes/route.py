"""Routing: one sender in front of several, the message choosing which by a key.

Some things the transport must know per message cannot travel in the bytes: RabbitMQ reads a
message's priority from its AMQP properties, not its body. Rather than widen every layer's
interface for them, a :class:`RouteSender` keeps one whole stack per key (e.g. per priority
level, each publishing with its own priority) and sends each message through the stack its key
names, opening stacks on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from truba.pipes.base import Confirmation, Sender, close_all
from truba.pipes.errors import PipeClosed

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class RouteSender(Generic[T, K]):
    """Sends each message through ``make(key(message))``, one inner sender per key."""

    name = "route"

    def __init__(self, key: Callable[[T], K], make: Callable[[K], Sender[T]]) -> None:
        self._key = key
        self._make = make
        self.routes: dict[K, Sender[T]] = {}
        self._closed = False

    @property
    def inners(self) -> list[Sender[T]]:
        """The stacks opened so far (for :func:`~truba.pipes.pipeline.describe`)."""
        return list(self.routes.values())

    def route(self, key: K) -> Sender[T]:
        """The inner sender for ``key``, made on first use."""
        sender = self.routes.get(key)
        if sender is None:
            sender = self.routes[key] = self._make(key)
        return sender

    async def send(self, message: T) -> Confirmation:
        if self._closed:
            raise PipeClosed("routed sender is closed")
        return await self.route(self._key(message)).send(message)

    def unconfirmed(self) -> Sequence[T]:
        """Oldest first per key, key after key (in the order the keys were first used): routes
        are independent streams, e.g. priority levels, which the broker reorders anyway."""
        return [message for sender in self.routes.values() for message in sender.unconfirmed()]

    def drop_unconfirmed(self) -> None:
        for sender in self.routes.values():
            sender.drop_unconfirmed()

    async def close(self) -> None:
        self._closed = True
        await close_all(*(sender.close() for sender in self.routes.values()))
