"""The two interfaces of truba's pipes, and the small types around them.

A :class:`Sender` delivers messages downstream and tracks which are not yet confirmed; a
:class:`Listener` hands out :class:`Delivery` objects that must be acked or rejected. Every pipe
layer wraps exactly one inner Sender or Listener and adds one concern (see :mod:`truba.pipes`).

Contract shared by every implementation (checked by the contract suite):

- ``close()`` is idempotent, also closes the inner pipe, and still closes when cancelled;
- after ``close()``, ``send``/``get`` raise :class:`~truba.pipes.errors.PipeClosed`;
- a blocked ``get()`` wakes with ``PipeClosed`` when its listener is closed;
- once broken a pipe stays broken: only reopening produces a fresh one;
- every message sent is either confirmed or still listed by ``unconfirmed()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from truba.pipes.errors import PipeError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
In = TypeVar("In")
Out = TypeVar("Out")

Confirmation = asyncio.Future[None]
"""Resolves when a broker confirms the message; fails with a PipeError if it did not.

A failed confirmation does not lose the message: it stays in ``unconfirmed()`` until an outer
layer re-sends it and calls ``drop_unconfirmed()``.
"""


class Sender(Protocol[T]):
    """Delivers messages downstream and remembers those no broker has confirmed yet."""

    async def send(self, message: T) -> Confirmation:
        """Hands ``message`` to the transport and returns once it is accepted, not confirmed.

        May wait while the in-flight window is full (backpressure).

        Returns:
            A future that resolves when a broker confirms the message.

        Raises:
            PipeClosed: after ``close()``.
            PipeBroken: the transport failed under us.
            CodecError, MessageTooLarge: the message can never be sent.
        """
        ...

    def unconfirmed(self) -> Sequence[T]:
        """Messages sent but not yet confirmed, oldest first."""
        ...

    def drop_unconfirmed(self) -> None:
        """Forgets the unconfirmed messages (an outer layer has re-sent them elsewhere)."""
        ...

    async def close(self) -> None:
        """Waits (bounded) for outstanding confirms, then closes; idempotent."""
        ...


class Delivery(Protocol[T_co]):
    """One received message; exactly one of ``ack``/``reject`` settles it."""

    @property
    def message(self) -> T_co: ...

    @property
    def redelivered(self) -> bool:
        """True when the broker delivered this message before (a crash or a requeue)."""
        ...

    @property
    def framed(self) -> bool:
        """True for a member of a frame (one broker message of several) while that frame is not
        settled: settling the member does not settle the broker message, which the broker would
        redeliver whole (see :mod:`truba.pipes.frame`). False once its frame was acked or
        rejected, and always for a lone message."""
        ...

    @property
    def headers(self) -> Mapping[str, object]: ...

    async def ack(self) -> None:
        """Settles the delivery as done. Raises PipeBroken if its channel is gone."""
        ...

    async def reject(self, requeue: bool) -> None:
        """Gives the delivery back (``requeue=True``) or to the dead-letter path."""
        ...


class Listener(Protocol[T_co]):
    """Hands out deliveries: now (``get``) or later (``subscribe``)."""

    async def get(self, timeout: float) -> Delivery[T_co] | None:
        """Takes the next delivery, waiting up to ``timeout`` seconds; None on timeout.

        Raises:
            PipeClosed: the listener is (or gets) closed, also while waiting.
            PipeBroken: the transport failed under us.
        """
        ...

    def subscribe(self, callback: Callable[[Delivery[T_co]], Awaitable[None]]) -> None:
        """Calls ``callback`` for each delivery instead of queueing it for ``get``.

        Errors the callback raises are logged, and the delivery is requeued.
        """
        ...

    async def cancel(self) -> None:
        """Stops new deliveries, keeping those already received gettable and settleable.

        After it returns (bounded, like every wait), no delivery arrives any more; ``get`` hands
        out what was received before, then returns None at once. Their owner can so put them
        back *without* the broker marking them redelivered (publish again, then ack), which
        ``close()`` cannot do: settling on a consuming channel frees prefetch room that the
        broker fills again at once. Idempotent; a no-op on a broken transport (the broker has
        already requeued that channel's deliveries).
        """
        ...

    async def close(self) -> None:
        """Stops consuming; unsettled deliveries go back to the broker; idempotent."""
        ...


class LinkHealth(Protocol):
    """How a broker's leaf is doing, for the combinator above it (and the stack's owner).

    :class:`~truba.pipes.reopen.ReopenSender` reports it. The stack builders hand it to
    ``balance`` explicitly, so no layer in between has to forward it.
    """

    @property
    def ready(self) -> bool:
        """False while the leaf is broken or reconnecting: send elsewhere meanwhile."""
        ...

    def on_break(self, callback: Callable[[PipeError], None]) -> None:
        """Calls ``callback(error)`` each time the leaf breaks, at once (not at the next send)."""
        ...


class Codec(Protocol[T]):
    """Reversible conversion between messages and bytes."""

    def encode(self, message: T) -> bytes: ...

    def decode(self, data: bytes) -> T: ...


Layer = Callable[[Sender[In]], Sender[Out]]
"""Wraps a ``Sender[In]`` into a ``Sender[Out]``, adding one concern."""

ListenerLayer = Callable[[Listener[In]], Listener[Out]]
"""Wraps a ``Listener[In]`` into a ``Listener[Out]``, adding one concern."""


def fail_confirmation(confirmation: Confirmation, error: BaseException) -> None:
    """Fails ``confirmation`` with ``error`` unless it is done, marked retrieved: a caller that
    never awaits it must not get asyncio's "exception was never retrieved" log."""
    if not confirmation.done():
        confirmation.set_exception(error)
        confirmation.exception()


async def close_all(*closers: Awaitable[object]) -> None:
    """Runs ``closers`` to the end even if the caller is cancelled meanwhile (then re-raises that).

    A cancelled ``close()`` must still close: the closing work runs in its own task, shielded
    from the caller's cancellation, and errors of individual closers are ignored (logged by them).
    """
    closing = asyncio.ensure_future(asyncio.gather(*closers, return_exceptions=True))
    await asyncio.shield(closing)
