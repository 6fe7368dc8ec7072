"""Layer: carry many small messages in one AMQP message (a *frame*) when traffic is high.

The per-message AMQP work (a publish, a confirm, a delivery, an ack) is what limits a Python task
system with millisecond tasks. :class:`FrameSender` packs messages into one frame while frames
are already in flight (Nagle-like): a lone message goes out at once, unchanged, so latency at low
load does not grow; a message that arrives while ``eager`` frames await their confirm starts a
frame, which gathers until ``max_messages`` or ``max_bytes`` are in it or ``max_delay`` seconds
have passed (not until that confirm: under load the confirms come every millisecond or two, and
frames that short would stay small). Only a single message gathered goes at that confirm, alone
and unchanged (as it would have a moment later): one task at a time, a result must not wait out
``max_delay`` because its predecessor's confirm was slow. Each message's confirmation resolves
(or fails) with its frame's. An owner that knows more messages follow within moments (a daemon
running chunks of short tasks) holds its senders (:meth:`FrameLimits.hold`): until it releases
them, even the first message waits for a frame.

:class:`FrameListener` (:mod:`truba.pipes.frame_listener`) unpacks frames into one delivery per
member, and settles a frame with the broker once every member is settled.

Wire format (:mod:`truba.pipes.frame_format`): ``MAGIC`` followed by a msgpack array of the
members' bytes. Limits and holds: :mod:`truba.pipes.frame_limits`.

Where it sits (:mod:`truba.pipes.stacks`): a :class:`FrameSender` over each broker's leaf, under
``balance`` (so a broker's load counts members, and a broken broker's members move one by one);
a :class:`FrameListener` right under ``deserialize``, always (a queue may hold frames whenever any
of its producers frames). Both sides share one :class:`FrameLimits`, which an owner may change
while the pipe runs (the client sizes task frames by how long tasks take).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import final

from truba.pipes.backpressure import Window
from truba.pipes.base import Confirmation, Sender, close_all, fail_confirmation
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.frame_format import MAGIC, pack, unpack
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.frame_listener import DoneCheck, FrameListener

__all__ = [
    "MAGIC",
    "DoneCheck",
    "FrameLimits",
    "FrameListener",
    "FrameSender",
    "pack",
    "unpack",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    messages: list[bytes] = field(default_factory=list)
    outers: list[Confirmation] = field(default_factory=list)
    size: int = 0
    shared: Confirmation | None = None
    """``share_confirmations``: the one confirmation of every message gathered here."""


@dataclass(slots=True, frozen=True)
class _Group:
    """Messages that went to the inner sender together (a frame, or one alone), numbered in the
    order they were handed: groups fail in any order (a publish that breaks before the confirms
    still awaited), but :meth:`FrameSender.unconfirmed` lists them oldest first."""

    number: int
    messages: list[bytes]
    outers: list[Confirmation]


@final
class FrameSender:
    """``Sender[bytes] -> Sender[bytes]`` packing messages into frames under load."""

    name = "frame"

    def __init__(
        self,
        inner: Sender[bytes],
        limits: FrameLimits | None = None,
        *,
        max_unconfirmed: int = 1000,
        share_confirmations: bool = False,
    ) -> None:
        if max_unconfirmed < 1:
            raise ValueError(f"frame: max_unconfirmed must be >= 1, got {max_unconfirmed}")
        self.inner = inner
        self.share_confirmations = share_confirmations
        """Every message gathered into one frame gets the same confirmation object (it resolves
        or fails with the frame either way): one future per frame instead of one per message,
        and an owner can group its bookkeeping by confirmation. Only for owners that never
        cancel a confirmation (a cancel would reach the frame's other members)."""
        self.limits = limits or FrameLimits()
        self._unregister = self.limits.on_release(self._released)
        self._window = Window(max_unconfirmed)
        """Messages gathered or in flight (failed ones are not: they wait to be re-sent)."""
        self._pending = _Pending()
        self._in_flight: dict[Confirmation, _Group] = {}
        self._failed: list[_Group] = []
        self._groups = 0
        """Groups numbered so far (a group's number is its place in send order)."""
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.frames = 0
        """Frames of more than one message sent."""
        self.framed = 0
        """Messages sent inside those frames."""
        self.alone = 0
        """Messages sent on their own."""

    async def send(self, message: bytes) -> Confirmation:
        """Sends ``message`` now (nothing in flight) or gathers it into the next frame.

        Waits while ``max_unconfirmed`` messages are gathered or unconfirmed (backpressure: the
        inner window counts frames, not messages). A message is taken once this returns, never
        before: a cancelled ``send`` leaves nothing behind. Gathered messages go out from a task
        of their own, so no caller's cancellation can cut a frame short.
        """
        if self._closed:
            raise PipeClosed("frame sender is closed")
        if self._window.full:
            await self._window.wait()
            if self._closed:
                raise PipeClosed("frame sender is closed")
        if self._goes_alone():
            return await self._send_alone(message)  # quiet: no waiting, no frame
        return self._gather(message)

    async def send_many(self, messages: Sequence[bytes]) -> list[Confirmation]:
        """A batch (see :mod:`truba.pipes.batch`): each message is gathered as :meth:`send`
        would gather it, without a coroutine of its own; one that :meth:`send` would send alone
        or make wait for room is sent by :meth:`send` if it comes first, else ends the batch."""
        taken = [await self.send(messages[0])]
        for message in messages[1:]:
            if self._closed or self._window.full or self._goes_alone():
                break
            taken.append(self._gather(message))
        return taken

    def _goes_alone(self) -> bool:
        """The next message goes on its own now: nothing gathered, and quiet (or no frames)."""
        limits = self.limits
        return not self._pending.messages and (
            limits.max_messages == 1 or (len(self._in_flight) < limits.eager and not limits.holding)
        )

    def _gather(self, message: bytes) -> Confirmation:
        """Takes ``message`` into the next frame (there is room: see :meth:`send`)."""
        limits = self.limits
        pending = self._pending
        if pending.messages and pending.size + len(message) > limits.max_bytes:
            self._flush_soon()  # the frame would grow past its byte cap: it goes first
            pending = self._pending
        if not self.share_confirmations:
            outer: Confirmation = asyncio.get_running_loop().create_future()
            pending.outers.append(outer)
        elif pending.shared is None:
            outer = pending.shared = asyncio.get_running_loop().create_future()
            pending.outers.append(outer)
        else:
            outer = pending.shared  # no running loop asked for: a getpid system call each time
        pending.messages.append(message)
        pending.size += len(message)
        self._window.take()
        if len(pending.messages) >= limits.max_messages or pending.size >= limits.max_bytes:
            self._flush_soon()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(limits.max_delay, self._flush_soon)
        return outer

    def unconfirmed(self) -> Sequence[bytes]:
        groups = sorted([*self._failed, *self._in_flight.values()], key=lambda g: g.number)
        return [m for group in groups for m in group.messages] + list(self._pending.messages)

    def drop_unconfirmed(self) -> None:
        self._failed.clear()
        self._in_flight.clear()
        self._pending = _Pending()
        self._window.reset()
        self._cancel_timer()
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        """Sends what is gathered, then closes the inner sender (which waits, bounded, for confirms)."""
        if self._closed:
            return
        self._closed = True
        self._unregister()
        self._cancel_timer()
        self._window.room.close()  # waiting senders raise PipeClosed
        log.info(
            "pipe.frame.closed",
            extra={"frames": self.frames, "framed": self.framed, "alone": self.alone},
        )
        try:
            self._flush_soon()
            if self._flushing:
                await asyncio.gather(*self._flushing, return_exceptions=True)
        finally:
            await close_all(self.inner.close())

    # -- internals --------------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _released(self) -> None:
        """The owners' last hold ended: what was gathered goes out now if no frame is in
        flight (as a lone message would), else it waits as under load."""
        if len(self._in_flight) < self.limits.eager:
            self._flush_soon()

    def _flush_soon(self) -> None:
        """Sends what is gathered, from a task of its own (see :meth:`send`)."""
        self._cancel_timer()
        if not self._pending.messages:
            return
        pending, self._pending = self._pending, _Pending()
        group = self._group(pending.messages, pending.outers)
        task = asyncio.get_running_loop().create_task(self._hand_quietly(group))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    def _group(self, messages: list[bytes], outers: list[Confirmation]) -> _Group:
        self._groups += 1
        return _Group(self._groups, messages, outers)

    async def _hand_quietly(self, group: _Group) -> None:
        with contextlib.suppress(PipeError):  # the members' confirmations carry the error
            await self._hand(group)

    async def _send_alone(self, message: bytes) -> Confirmation:
        """One message, unchanged. If the inner send raises, the message was not taken: the
        caller gets the error and nothing is kept."""
        outer: Confirmation = asyncio.get_running_loop().create_future()
        group = self._group([message], [outer])  # numbered before the wait: its place is when it was sent
        inner = await self.inner.send(message)
        self.alone += 1
        self._window.take()
        self._track(inner, group)
        return outer

    async def _hand(self, group: _Group) -> None:
        """Sends gathered messages (their senders were told they were taken): as one frame, or
        alone if only one; on failure they stay ours, held until re-sent or dropped."""
        messages = group.messages
        data = messages[0] if len(messages) == 1 else pack(messages)
        try:
            inner = await self.inner.send(data)
        except BaseException as exc:
            self._hold_failed(group, exc)
            raise
        if len(messages) > 1:
            self.frames += 1
            self.framed += len(messages)
        else:
            self.alone += 1
        self._track(inner, group)

    def _track(self, inner: Confirmation, group: _Group) -> None:
        self._in_flight[inner] = group
        inner.add_done_callback(self._settled)

    def _settled(self, inner: Confirmation) -> None:
        group = self._in_flight.pop(inner, None)
        if group is None:  # dropped meanwhile
            return
        error = PipeClosed("confirmation cancelled") if inner.cancelled() else inner.exception()
        if error is None:
            self._window.give(len(group.messages))
            for outer in group.outers:
                if not outer.done():
                    outer.set_result(None)
            self._lone_goes()
        else:
            self._hold_failed(group, error)

    def _lone_goes(self) -> None:
        """A single message gathered while a frame was in flight goes now that it is confirmed
        (as it would have gone alone had it come a moment later), instead of waiting out
        ``max_delay`` for company: one task at a time, a result's confirm that comes after
        the next task's result would otherwise hold that result back (5 ms by default). Two or
        more gathered keep waiting for a fuller frame: the traffic is busy then."""
        limits = self.limits
        if (
            len(self._pending.messages) == 1
            and len(self._in_flight) < limits.eager
            and not limits.holding
            and not self._closed
        ):
            self._flush_soon()

    def _hold_failed(self, group: _Group, error: BaseException) -> None:
        """Members whose frame failed: listed as unconfirmed until re-sent (and dropped)."""
        self._window.give(len(group.messages))
        self._failed.append(group)
        failure = error if isinstance(error, PipeError) else PipeClosed(f"frame not sent: {error!r}")
        for outer in group.outers:
            fail_confirmation(outer, failure)
