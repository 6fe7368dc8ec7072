"""Layer: log what goes wrong on the way through, with constant event names. Nothing else.

Failures are logged at warning with the error's type and message (tracebacks at debug, as the
fault is expected); each message at debug. The layer never swallows or changes an error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from truba.pipes.base import Confirmation, Delivery, Layer, Listener, ListenerLayer, Sender
from truba.pipes.batch import ack_many, send_many
from truba.pipes.errors import PipeClosed, PipeError

T = TypeVar("T")


@dataclass
class LogSender(Generic[T]):
    """Logs send failures and failed confirmations of the inner sender under ``pipe.<role>.*``.

    ``confirms=False`` leaves failed confirmations to the owner, which watches every one anyway
    and logs it with the message's id (the client's submission): no second done-callback per
    message on its hot path.
    """

    inner: Sender[T]
    role: str = "send"
    logger: logging.Logger = logging.getLogger("truba.pipes.log")
    confirms: bool = True

    async def send(self, message: T) -> Confirmation:
        try:
            confirmation = await self.inner.send(message)
        except PipeError as exc:
            self._failed(exc)
            raise
        self._sent(confirmation)
        return confirmation

    async def send_many(self, messages: Sequence[T]) -> list[Confirmation]:
        """A batch in one call (see :mod:`truba.pipes.batch`), logged as :meth:`send` logs each."""
        try:
            confirmations = await send_many(self.inner, messages)
        except PipeError as exc:
            self._failed(exc)
            raise
        for confirmation in confirmations:
            self._sent(confirmation)
        return confirmations

    def _sent(self, confirmation: Confirmation) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(f"pipe.{self.role}.sent")
        if self.confirms:
            confirmation.add_done_callback(self._confirmed)

    def _failed(self, exc: PipeError) -> None:
        """Logs a failed send; a closed pipe is the owner's doing, not a failure."""
        if isinstance(exc, PipeClosed):
            return
        self.logger.warning(f"pipe.{self.role}.failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        self.logger.debug(f"pipe.{self.role}.failed", exc_info=exc)

    def _confirmed(self, confirmation: Confirmation) -> None:
        if confirmation.cancelled():
            return
        exc = confirmation.exception()
        if exc is not None:
            self.logger.warning(
                f"pipe.{self.role}.unconfirmed", extra={"error": f"{type(exc).__name__}: {exc}"}
            )

    def unconfirmed(self) -> Sequence[T]:
        return self.inner.unconfirmed()

    def drop_unconfirmed(self) -> None:
        held = len(self.inner.unconfirmed())
        if held:
            self.logger.info(f"pipe.{self.role}.dropped_unconfirmed", extra={"count": held})
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        await self.inner.close()


def log_errors(role: str = "send", *, confirms: bool = True) -> Layer[T, T]:
    """The log layer for senders; ``role`` names the events (``pipe.results.failed``);
    ``confirms=False``: failed confirmations are the owner's to log (see :class:`LogSender`)."""
    return lambda inner: LogSender(inner, role, confirms=confirms)


@dataclass
class LogListener(Generic[T]):
    """Logs get failures of the inner listener under ``pipe.<role>.*``."""

    inner: Listener[T]
    role: str = "listen"
    logger: logging.Logger = logging.getLogger("truba.pipes.log")

    async def get(self, timeout: float) -> Delivery[T] | None:
        try:
            delivery = await self.inner.get(timeout)
        except PipeClosed:
            raise
        except PipeError as exc:
            self.logger.warning(f"pipe.{self.role}.failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            self.logger.debug(f"pipe.{self.role}.failed", exc_info=exc)
            raise
        if delivery is not None and self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(f"pipe.{self.role}.received", extra={"redelivered": delivery.redelivered})
        return delivery

    async def ack_many(self, deliveries: Sequence[Delivery[T]]) -> list[PipeError]:
        """Passes a batch of acks down (see :mod:`truba.pipes.batch`)."""
        return await ack_many(self.inner, deliveries)

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        self.inner.subscribe(callback)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        await self.inner.close()


def log_listener(role: str = "listen") -> ListenerLayer[T, T]:
    """The log layer for listeners."""
    return lambda inner: LogListener(inner, role)
