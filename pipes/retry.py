"""Layer: on a retryable error, try again after a backoff. Nothing else.

Retryability is a property of the error (:attr:`PipeError.retryable`): a broken transport or an
expired wait is retried, a closed pipe, a rejected message or a poison message is not. The policy
(:class:`Backoff`) and the clock (``sleep``) are injected, so tests run without real waits. A
sender that gives up re-raises the *last* cause unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from truba.backoff import Backoff
from truba.pipes.base import Confirmation, Delivery, Layer, Listener, ListenerLayer, Sender
from truba.pipes.batch import ack_many, send_many
from truba.pipes.errors import PipeError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class RetrySender(Generic[T]):
    """Sends again when the inner sender raises a retryable PipeError, up to the policy's budget."""

    inner: Sender[T]
    backoff: Backoff = field(default_factory=Backoff)

    async def send(self, message: T) -> Confirmation:
        attempt = 0
        while True:
            try:
                return await self.inner.send(message)
            except PipeError as exc:
                if not exc.retryable or self.backoff.gives_up_after(attempt):
                    raise
                delay = self.backoff.delay(attempt)
                log.log(  # the first retry is a warning; the rest only repeat it
                    logging.WARNING if attempt == 0 else logging.DEBUG,
                    "pipe.retry",
                    extra={"attempt": attempt + 1, "delay": round(delay, 3), "error": repr(exc)},
                )
                await self.backoff.sleep(delay)
                attempt += 1

    async def send_many(self, messages: Sequence[T]) -> list[Confirmation]:
        """A batch in one call (see :mod:`truba.pipes.batch`); once it fails, its first message
        goes through :meth:`send`, retried, and the rest come again in the caller's next call."""
        try:
            return await send_many(self.inner, messages)
        except PipeError as exc:
            if not exc.retryable:
                raise
        return [await self.send(messages[0])]

    def unconfirmed(self) -> Sequence[T]:
        return self.inner.unconfirmed()

    def drop_unconfirmed(self) -> None:
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        await self.inner.close()


def retry(backoff: Backoff | None = None) -> Layer[T, T]:
    """The retry layer for senders."""
    return lambda inner: RetrySender(inner, backoff or Backoff())


@dataclass
class RetryListener(Generic[T]):
    """Takes again when the inner listener raises a retryable PipeError, up to the budget."""

    inner: Listener[T]
    backoff: Backoff = field(default_factory=Backoff)

    async def get(self, timeout: float) -> Delivery[T] | None:
        attempt = 0
        while True:
            try:
                return await self.inner.get(timeout)
            except PipeError as exc:
                if not exc.retryable or self.backoff.gives_up_after(attempt):
                    raise
                delay = min(self.backoff.delay(attempt), timeout)
                log.log(  # the first retry is a warning; the rest only repeat it
                    logging.WARNING if attempt == 0 else logging.DEBUG,
                    "pipe.retry",
                    extra={"attempt": attempt + 1, "delay": round(delay, 3), "error": repr(exc)},
                )
                await self.backoff.sleep(delay)
                attempt += 1

    async def ack_many(self, deliveries: Sequence[Delivery[T]]) -> list[PipeError]:
        """Passes a batch of acks down (see :mod:`truba.pipes.batch`); acks are not retried."""
        return await ack_many(self.inner, deliveries)

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        self.inner.subscribe(callback)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        await self.inner.close()


def retry_listener(backoff: Backoff | None = None) -> ListenerLayer[T, T]:
    """The retry layer for listeners."""
    return lambda inner: RetryListener(inner, backoff or Backoff())
