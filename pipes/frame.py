"""Layer: carry many small messages in one AMQP message (a *frame*) when traffic is high.

The per-message AMQP work (a publish, a confirm, a delivery, an ack) is what limits a Python task
system with millisecond tasks. :class:`FrameSender` packs messages into one frame while frames
are already in flight (Nagle-like): a lone message goes out at once, unchanged, so latency at low
load does not grow; messages that arrive while ``eager`` frames await their confirm wait at most
``max_delay`` seconds, or until ``max_messages`` or ``max_bytes`` are gathered. Each message's
confirmation resolves (or fails) with its frame's.

:class:`FrameListener` unpacks frames into one delivery per member. The frame is settled with
the broker once every member is: acked when all were acked; a member rejected with requeue is
published again alone through ``requeue`` (when given) before the frame is acked, so the members
that were done do not run again. Without ``requeue`` (or for members rejected without requeue)
the whole frame is rejected that way once all members are settled: done members may then run
again, as after a crash (outcomes are deduplicated by task id downstream).

Wire format: a frame is ``MAGIC`` followed by a msgpack array of the members' bytes. ``MAGIC``
starts with 0xC1, a byte msgpack never uses, so a frame is never mistaken for a lone truba
message; a message that starts with it but does not unpack is passed on as it is (the
deserialize layer dead-letters it as poison).

Status: the layer and its unit tests exist; the client and the daemon do not use it yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, final

import msgpack

from truba.pipes.base import Confirmation, Delivery, Listener, Sender, close_all
from truba.pipes.errors import PipeClosed, PipeError

log = logging.getLogger(__name__)

MAGIC: Final = b"\xc1TF1"


def pack(messages: Sequence[bytes]) -> bytes:
    """One frame holding ``messages``, in order."""
    body: bytes = msgpack.packb(list(messages), use_bin_type=True)
    return MAGIC + body


def unpack(data: bytes) -> list[bytes] | None:
    """The members of a frame, or None if ``data`` is not a well-formed frame."""
    if not data.startswith(MAGIC):
        return None
    try:
        members = msgpack.unpackb(data[len(MAGIC) :], raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(members, list) or not all(isinstance(m, bytes) for m in members):
        return None
    return members


@dataclass(slots=True)
class _Pending:
    messages: list[bytes] = field(default_factory=list)
    outers: list[Confirmation] = field(default_factory=list)
    size: int = 0


@final
class FrameSender:
    """``Sender[bytes] -> Sender[bytes]`` packing messages into frames under load."""

    name = "frame"

    def __init__(
        self,
        inner: Sender[bytes],
        *,
        max_messages: int = 64,
        max_bytes: int = 256 * 1024,
        max_delay: float = 0.002,
        eager: int = 1,
    ) -> None:
        if max_messages < 1 or max_bytes < 1 or max_delay < 0 or eager < 0:
            raise ValueError("frame: max_messages, max_bytes >= 1; max_delay, eager >= 0")
        self.inner = inner
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_delay = max_delay
        self._eager = eager
        self._pending = _Pending()
        self._in_flight: dict[Confirmation, tuple[list[bytes], list[Confirmation]]] = {}
        self._failed: list[tuple[list[bytes], list[Confirmation]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.frames = 0
        """Frames of more than one message sent."""

    async def send(self, message: bytes) -> Confirmation:
        if self._closed:
            raise PipeClosed("frame sender is closed")
        loop = asyncio.get_running_loop()
        outer: Confirmation = loop.create_future()
        if not self._pending.messages and len(self._in_flight) < self._eager:
            await self._hand([message], [outer])  # quiet: no waiting, no frame
            return outer
        pending = self._pending
        pending.messages.append(message)
        pending.outers.append(outer)
        pending.size += len(message)
        if len(pending.messages) >= self._max_messages or pending.size >= self._max_bytes:
            await self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._max_delay, self._flush_soon)
        return outer

    def unconfirmed(self) -> Sequence[bytes]:
        held = [m for messages, _ in self._failed for m in messages]
        held += [m for messages, _ in self._in_flight.values() for m in messages]
        return held + list(self._pending.messages)

    def drop_unconfirmed(self) -> None:
        self._failed.clear()
        self._in_flight.clear()
        self._pending = _Pending()
        self._cancel_timer()
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        """Sends what is gathered, then closes the inner sender (which waits, bounded, for confirms)."""
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        try:
            with contextlib.suppress(PipeError):
                await self._flush()
            if self._flushing:
                await asyncio.gather(*self._flushing, return_exceptions=True)
        finally:
            await close_all(self.inner.close())

    # -- internals --------------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush_soon(self) -> None:
        self._timer = None
        if self._pending.messages:
            task = asyncio.get_running_loop().create_task(self._flush_quietly())
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(PipeError):  # the members' confirmations carry the error
            await self._flush()

    async def _flush(self) -> None:
        self._cancel_timer()
        pending, self._pending = self._pending, _Pending()
        if pending.messages:
            await self._hand(pending.messages, pending.outers)

    async def _hand(self, messages: list[bytes], outers: list[Confirmation]) -> None:
        data = messages[0] if len(messages) == 1 else pack(messages)
        try:
            inner = await self.inner.send(data)
        except PipeError as exc:
            # Not taken downstream: the members are still ours, held until re-sent or dropped.
            self._failed.append((messages, outers))
            for outer in outers:
                _fail(outer, exc)
            raise
        except BaseException:
            self._failed.append((messages, outers))
            raise
        if len(messages) > 1:
            self.frames += 1
        self._in_flight[inner] = (messages, outers)
        inner.add_done_callback(self._settled)

    def _settled(self, inner: Confirmation) -> None:
        entry = self._in_flight.pop(inner, None)
        if entry is None:  # dropped meanwhile
            return
        messages, outers = entry
        error = PipeClosed("confirmation cancelled") if inner.cancelled() else inner.exception()
        if error is None:
            for outer in outers:
                if not outer.done():
                    outer.set_result(None)
        else:
            self._failed.append(entry)
            for outer in outers:
                _fail(outer, error)
        if self._pending.messages and len(self._in_flight) < self._eager and not self._closed:
            self._flush_soon()  # the pipe went quiet: what waits goes now


@final
class _Frame:
    """One received frame: settled with the broker once every member is."""

    def __init__(self, delivery: Delivery[bytes], members: int, requeue: Sender[bytes] | None) -> None:
        self.delivery = delivery
        self.left = members
        self.requeue = requeue
        self.again = False  # a member asked to run again, and could not be sent alone
        self.dead = False  # a member was rejected without requeue

    async def settle(self, message: bytes, how: str) -> None:
        if how == "requeue":
            if self.requeue is not None:
                confirmation = await self.requeue.send(message)
                await confirmation
            else:
                self.again = True
        elif how == "reject":
            self.dead = True
        self.left -= 1
        if self.left == 0:
            if self.again:
                await self.delivery.reject(requeue=True)
            elif self.dead:
                await self.delivery.reject(requeue=False)
            else:
                await self.delivery.ack()


@final
class _Member:
    """One message of a frame, settled on its own."""

    def __init__(self, message: bytes, frame: _Frame) -> None:
        self._message = message
        self._frame = frame
        self._settled = False

    @property
    def message(self) -> bytes:
        return self._message

    @property
    def redelivered(self) -> bool:
        return self._frame.delivery.redelivered

    @property
    def headers(self) -> Mapping[str, object]:
        return self._frame.delivery.headers

    async def ack(self) -> None:
        await self._settle("ack")

    async def reject(self, requeue: bool) -> None:
        await self._settle("requeue" if requeue else "reject")

    async def _settle(self, how: str) -> None:
        if self._settled:
            raise PipeError("frame member already settled")
        self._settled = True
        await self._frame.settle(self._message, how)


@final
class FrameListener:
    """``Listener[bytes] -> Listener[bytes]`` handing out each member of a frame on its own."""

    name = "unframe"

    def __init__(self, inner: Listener[bytes], *, requeue: Sender[bytes] | None = None) -> None:
        self.inner = inner
        self._requeue = requeue
        self._ready: list[Delivery[bytes]] = []

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        if self._ready:
            return self._ready.pop(0)
        delivery = await self.inner.get(timeout)
        if delivery is None:
            return None
        members = self._split(delivery)
        first, self._ready = members[0], members[1:]
        return first

    def subscribe(self, callback: Callable[[Delivery[bytes]], Awaitable[None]]) -> None:
        async def each(delivery: Delivery[bytes]) -> None:
            for member in self._split(delivery):
                await callback(member)

        self.inner.subscribe(each)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        self._ready.clear()  # unsettled members: their frames go back to the broker
        await self.inner.close()

    def _split(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]]:
        members = unpack(delivery.message)
        if not members:
            return [delivery]
        frame = _Frame(delivery, len(members), self._requeue)
        return [_Member(message, frame) for message in members]


def _fail(outer: Confirmation, error: BaseException) -> None:
    if not outer.done():
        outer.set_exception(error)
        outer.exception()  # retrieved: a caller that never awaits it must not get a warning
