"""The sending leaf: persistent, mandatory publishes on a confirm channel, every wait bounded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, final

import aio_pika
from aio_pika.abc import AbstractChannel, FieldValue
from aiormq import spec

from truba import trace
from truba.pipes import delay
from truba.pipes.backpressure import Window
from truba.pipes.base import Confirmation, fail_confirmation
from truba.pipes.broker import SENT_AT, redact
from truba.pipes.errors import ChannelLost, MessageRejected, PipeClosed, PipeError, SendTimeout
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.util import close_quietly

log = logging.getLogger(__name__)

PERSISTENT: Final = int(aio_pika.DeliveryMode.PERSISTENT)
"""Header of every message: when it was published (Unix time, whole seconds, the sender's clock).
A consumer of a redelivered message reads a record from about then (see truba.pipes.result_log)."""


@final
class RabbitSender:
    """Publishes persistent, mandatory messages to one queue and tracks them until confirmed.

    At most ``max_unconfirmed`` messages are in flight; ``send`` waits for room (backpressure,
    :mod:`truba.pipes.backpressure`), and a waiting ``send`` wakes when the sender breaks or closes.
    A confirm that does not arrive within ``confirm_timeout`` (e.g. a memory alarm blocks the
    connection) breaks the sender: its messages stay in ``unconfirmed()``. A nack or an
    unroutable return fails that message's confirmation with MessageRejected and keeps it too;
    after a return, ``redeclare`` (if given) is run once in the background, so a queue that
    vanished with a broker's data is back when the message is sent again. Every message carries
    ``priority`` (AMQP property) if given: one sender per priority level (see RouteSender). With
    ``copy_to``, the broker also puts every message in that queue (a ``BCC`` header: RabbitMQ's
    sender-selected distribution), and confirms it only once both queues have it. Every message
    carries the header :data:`SENT_AT` (whole seconds, this host's clock). With ``delayed``,
    each message is a due time and a body (:func:`truba.pipes.delay.with_due`): the body is
    published into the broker's delay levels with the delay left at publish time (or straight
    to the queue when nothing is left); :meth:`unconfirmed` lists it with its due time.

    Hot path: a message is published on the channel's aiormq layer with its own message id
    (aiormq would draw a UUID per publish) and prebuilt headers
    (no aio-pika ``Message`` per message), and the confirm timeout is one timer for the oldest
    unconfirmed message rather than one per publish; a failed confirmation is marked retrieved
    where it fails, so no done-callback is attached to every confirmation.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue: str,
        url: str,
        confirm_timeout: float,
        max_unconfirmed: int,
        redeclare: Callable[[], Awaitable[None]] | None = None,
        priority: int | None = None,
        *,
        copy_to: str | None = None,
        delayed: bool = False,
    ) -> None:
        self._channel = channel
        self._delayed = delayed
        self._priority = priority
        self._copy_to: list[FieldValue] | None = None if copy_to is None else [copy_to]
        self._stamp = 0
        self._headers = self._stamped()
        self._redeclare = redeclare
        self._redeclaring: asyncio.Task[None] | None = None
        self._queue = queue
        self._url = url
        self._confirm_timeout = confirm_timeout
        self._window = Window(max_unconfirmed)
        # seq -> (body, confirmation, deadline of its confirm); oldest first
        self._pending: dict[int, tuple[bytes, Confirmation, float]] = {}
        self._seq = 0
        self._loop = asyncio.get_running_loop()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._what = f"publish to {queue} on {redact(url)}"
        kind = queue.rsplit(".", 1)[-1]
        self._hops = (f"{kind}.publish", f"{kind}.confirm")
        """The tracing mode's hops (:mod:`truba.trace`): handed to the connection, confirmed."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._broken: PipeError | None = None
        channel.close_callbacks.add(self._on_channel_closed)

    name = "rabbit"

    def _on_channel_closed(self, _: object, exc: BaseException | None = None) -> None:
        if not self._closed and self._broken is None:
            self._broken = ChannelLost(f"channel to {redact(self._url)} closed: {exc!r}")
            log.warning("pipe.rabbit.sender.broken", extra={"broker": redact(self._url), "error": repr(exc)})
        self._window.room.close()  # waiting sends raise the break (or PipeClosed)
        self._disarm()
        # Fail every pending confirm now: the messages stay listed as unconfirmed.
        error = self._broken or PipeClosed("sender closed before the confirm arrived")
        for _, confirmation, _ in self._pending.values():
            fail_confirmation(confirmation, error)

    def _check_usable(self) -> None:
        if self._closed:
            raise PipeClosed(f"sender to {self._queue} is closed")
        if self._broken is not None:
            raise self._broken

    async def send(self, message: bytes) -> Confirmation:
        self._check_usable()
        if self._window.full:
            await self._window.wait()
            self._check_usable()
        self._window.take()
        self._seq += 1
        seq = self._seq
        confirmation: Confirmation = self._loop.create_future()
        deadline = self._loop.time() + self._confirm_timeout
        self._pending[seq] = (message, confirmation, deadline)
        if self._deadline_timer is None:
            self._deadline_timer = self._loop.call_at(deadline, self._check_deadline)
        task = self._loop.create_task(self._publish(seq, message, confirmation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Accepted: the publish task owns the message now. Tasks start in creation order, so
        # messages go out in the order they were sent; close() waits (bounded) for them.
        return confirmation

    def _stamped(self) -> dict[str, FieldValue]:
        """The headers of every message sent this second (built once a second)."""
        self._stamp = int(time.time())
        headers: dict[str, FieldValue] = {SENT_AT: self._stamp}
        if self._copy_to is not None:
            headers["BCC"] = self._copy_to
        return headers

    async def _publish(self, seq: int, body: bytes, confirmation: Confirmation) -> None:
        if time.time() - self._stamp >= 1.0:
            self._headers = self._stamped()
        headers, exchange = self._headers, ""
        if self._delayed:
            due, body = delay.split_due(body)
            left = due - time.time()
            if delay.delay_bits(left) > 0:  # else due now: straight to the queue
                headers = {**headers, **delay.bit_headers(left)}
                exchange = delay.first_exchange(left)
        # Properties of its own for each message, with a message id unique on this sender's
        # channel (aiormq maps a returned message to its confirm by it; left empty, aiormq
        # would draw a random UUID for every publish, a few microseconds each).
        properties = spec.Basic.Properties(
            delivery_mode=PERSISTENT, priority=self._priority, headers=headers, message_id=f"m{seq}"
        )
        try:
            with map_amqp_errors(self._what):
                channel = await self._channel.get_underlay_channel()  # raises if closed
                if trace.enabled:
                    trace.mark_body(self._hops[0], body)
                # The confirm wait is bounded by _check_deadline (one timer for all messages).
                await channel.basic_publish(
                    body, exchange=exchange, routing_key=self._queue, properties=properties, mandatory=True
                )
        except MessageRejected as exc:
            log.warning("pipe.rabbit.rejected", extra={"queue": self._queue, "error": str(exc)})
            fail_confirmation(confirmation, exc)
            if exc.unroutable:
                self._start_redeclare()
        except PipeError as exc:
            if self._broken is None:
                self._broken = exc
                log.warning(
                    "pipe.rabbit.sender.broken",
                    extra={"broker": redact(self._url), "queue": self._queue, "error": repr(exc)},
                )
                closing = asyncio.create_task(close_quietly(self._channel))
                self._tasks.add(closing)
                closing.add_done_callback(self._tasks.discard)
                self._window.room.close()
            fail_confirmation(confirmation, self._broken)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed or (task is not None and task.cancelling()):
                fail_confirmation(confirmation, PipeClosed("sender closed before the confirm arrived"))
                raise
            # aiormq cancels pending confirms when the connection dies under us: a break, not a close.
            if self._broken is None:
                self._broken = ChannelLost(f"channel to {redact(self._url)} lost before the confirm arrived")
                self._window.room.close()
            fail_confirmation(confirmation, self._broken)
        else:
            # A confirm that comes after its confirmation failed (timed out) keeps the message
            # listed: the caller was told it is unconfirmed, and an outer layer re-sends it.
            if not confirmation.done():
                self._pending.pop(seq, None)
                confirmation.set_result(None)
                if trace.enabled:
                    trace.mark_body(self._hops[1], body)
        finally:
            self._window.give()

    def _check_deadline(self) -> None:
        """Breaks the sender when its oldest waiting message is past its confirm deadline."""
        self._deadline_timer = None
        if self._closed or self._broken is not None:
            return
        now = self._loop.time()
        for _, confirmation, deadline in self._pending.values():
            if confirmation.done():
                continue  # rejected: listed as unconfirmed, not waiting for a confirm
            if deadline > now:
                self._deadline_timer = self._loop.call_at(deadline, self._check_deadline)
                return
            self._time_out()
            return

    def _time_out(self) -> None:
        exc = SendTimeout(f"{self._what}: no confirm within {self._confirm_timeout} s")
        self._broken = exc
        log.warning(
            "pipe.rabbit.sender.broken",
            extra={"broker": redact(self._url), "queue": self._queue, "error": repr(exc)},
        )
        for _, confirmation, _ in self._pending.values():
            fail_confirmation(confirmation, exc)
        self._window.room.close()
        for task in list(self._tasks):  # publishes still waiting (e.g. a blocked connection)
            task.cancel()
        closing = asyncio.create_task(close_quietly(self._channel))
        self._tasks.add(closing)
        closing.add_done_callback(self._tasks.discard)

    def _disarm(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def _start_redeclare(self) -> None:
        if self._redeclare is None or self._closed:
            return
        if self._redeclaring is None or self._redeclaring.done():
            self._redeclaring = asyncio.create_task(self._run_redeclare(self._redeclare))
            self._tasks.add(self._redeclaring)
            self._redeclaring.add_done_callback(self._tasks.discard)

    async def _run_redeclare(self, redeclare: Callable[[], Awaitable[None]]) -> None:
        try:
            await redeclare()
        except PipeError as exc:
            log.warning("pipe.rabbit.redeclare_failed", extra={"queue": self._queue, "error": str(exc)})
        else:
            log.warning("pipe.rabbit.redeclared", extra={"queue": self._queue, "broker": redact(self._url)})

    def unconfirmed(self) -> Sequence[bytes]:
        return [body for body, _, _ in self._pending.values()]

    def drop_unconfirmed(self) -> None:
        self._pending.clear()

    def load(self) -> int:
        """Unconfirmed messages: what a balancer compares."""
        return len(self._pending)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._window.room.close()  # waiting sends raise PipeClosed
        self._disarm()
        try:
            if self._tasks and self._broken is None:
                # Bounded wait for outstanding confirms; whatever is left stays unconfirmed.
                await asyncio.wait(set(self._tasks), timeout=self._confirm_timeout)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await close_quietly(self._channel)
