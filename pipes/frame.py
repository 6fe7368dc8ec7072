"""Layer: carry many small messages in one AMQP message (a *frame*) when traffic is high.

The per-message AMQP work (a publish, a confirm, a delivery, an ack) is what limits a Python task
system with millisecond tasks. :class:`FrameSender` packs messages into one frame while frames
are already in flight (Nagle-like): a lone message goes out at once, unchanged, so latency at low
load does not grow; a message that arrives while ``eager`` frames await their confirm starts a
frame, which gathers until ``max_messages`` or ``max_bytes`` are in it or ``max_delay`` seconds
have passed (not until that confirm: under load the confirms come every millisecond or two, and
frames that short would stay small). Each message's confirmation resolves (or fails) with its
frame's. An owner that knows more messages follow within moments (a daemon running chunks of
short tasks) holds its senders (:meth:`FrameLimits.hold`): until it releases them, even the
first message waits for a frame.

:class:`FrameListener` unpacks frames into one delivery per member. The frame is settled with
the broker once every member is: acked when all were acked; a member rejected with requeue is
published again alone through ``requeue`` (when given) before the frame is acked, so the members
that were done do not run again. Without ``requeue`` (or for members rejected without requeue)
the whole frame is rejected that way once all members are settled: done members may then run
again, as after a crash (outcomes are deduplicated by task id downstream). Given ``done`` (a
:class:`~truba.pipes.record.DoneRecord`), a frame that comes back redelivered is first looked up
in it: members that already have a confirmed result are acked instead of handed out, so a frame
a dead consumer had half done runs only its other half. (A redelivered lone message runs again,
as any redelivered AMQP message would.)

Wire format: a frame is ``MAGIC`` followed by a msgpack array of the members' bytes. ``MAGIC``
starts with 0xC1, a byte msgpack never uses, so a frame is never mistaken for a lone truba
message; a message that starts with it but does not unpack is passed on as it is (the
deserialize layer dead-letters it as poison).

Where it sits (:mod:`truba.pipes.stacks`): a :class:`FrameSender` over each broker's leaf, under
``balance`` (so a broker's load counts members, and a broken broker's members move one by one);
a :class:`FrameListener` right under ``deserialize``, always (a queue may hold frames whenever any
of its producers frames). Both sides share one :class:`FrameLimits`, which an owner may change
while the pipe runs (the client sizes task frames by how long tasks take).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, final

import msgpack

from truba.pipes.backpressure import Window
from truba.pipes.base import Confirmation, Delivery, Listener, Sender, close_all, fail_confirmation
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
class FrameLimits:
    """How big a frame may grow and how long a message may wait for one; read at every send,
    so a change applies at once to every sender sharing the object.

    ``max_messages`` 1 turns packing off. ``eager`` frames may be in flight before messages
    wait to be packed (0: always gather, up to ``max_delay``).
    """

    max_messages: int = 64
    max_bytes: int = 256 * 1024
    max_delay: float = 0.005
    eager: int = 1
    _holds: int = field(default=0, init=False, repr=False, compare=False)
    _on_release: list[Callable[[], None]] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_bytes < 1 or self.max_delay < 0 or self.eager < 0:
            raise ValueError("frame limits: max_messages, max_bytes >= 1; max_delay, eager >= 0")

    @property
    def holding(self) -> bool:
        """Some owner holds messages back (:meth:`hold`): none goes out alone."""
        return self._holds > 0

    def hold(self) -> None:
        """Until the matching :meth:`release`, every message waits for a frame (up to
        ``max_delay``, as under load) instead of going out alone. For an owner that knows more
        messages follow within moments (a daemon running chunks of short tasks): they then
        share frames from the first one on."""
        self._holds += 1

    def release(self) -> None:
        """Ends a :meth:`hold`. When the last one ends, what was gathered goes out at once,
        unless frames are in flight (then it waits as under load)."""
        self._holds = max(0, self._holds - 1)
        if not self._holds:
            for released in list(self._on_release):
                released()

    def on_release(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback`` whenever the last :meth:`hold` is released; returns what
        unregisters it."""
        self._on_release.append(callback)
        return functools.partial(_discard, self._on_release, callback)


def _discard(callbacks: list[Callable[[], None]], callback: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)


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
        self, inner: Sender[bytes], limits: FrameLimits | None = None, *, max_unconfirmed: int = 1000
    ) -> None:
        if max_unconfirmed < 1:
            raise ValueError(f"frame: max_unconfirmed must be >= 1, got {max_unconfirmed}")
        self.inner = inner
        self.limits = limits or FrameLimits()
        self._unregister = self.limits.on_release(self._released)
        self._window = Window(max_unconfirmed)
        """Messages gathered or in flight (failed ones are not: they wait to be re-sent)."""
        self._pending = _Pending()
        self._in_flight: dict[Confirmation, tuple[list[bytes], list[Confirmation]]] = {}
        self._failed: list[tuple[list[bytes], list[Confirmation]]] = []
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
        limits = self.limits
        pending = self._pending
        if not pending.messages and (
            limits.max_messages == 1 or (len(self._in_flight) < limits.eager and not limits.holding)
        ):
            return await self._send_alone(message)  # quiet: no waiting, no frame
        if pending.messages and pending.size + len(message) > limits.max_bytes:
            self._flush_soon()  # the frame would grow past its byte cap: it goes first
            pending = self._pending
        loop = asyncio.get_running_loop()
        outer: Confirmation = loop.create_future()
        pending.messages.append(message)
        pending.outers.append(outer)
        pending.size += len(message)
        self._window.take()
        if len(pending.messages) >= limits.max_messages or pending.size >= limits.max_bytes:
            self._flush_soon()
        elif self._timer is None:
            self._timer = loop.call_later(limits.max_delay, self._flush_soon)
        return outer

    @property
    def ready(self) -> bool:
        """The inner sender's readiness (``balance`` skips a leaf that is reconnecting)."""
        return bool(getattr(self.inner, "ready", True))

    def on_break(self, callback: Callable[[PipeError], None]) -> None:
        """Passes ``balance``'s break callback to the inner sender, if it reports breaks."""
        register = getattr(self.inner, "on_break", None)
        if register is not None:
            register(callback)

    def unconfirmed(self) -> Sequence[bytes]:
        held = [m for messages, _ in self._failed for m in messages]
        held += [m for messages, _ in self._in_flight.values() for m in messages]
        return held + list(self._pending.messages)

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
        task = asyncio.get_running_loop().create_task(self._hand_quietly(pending))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _hand_quietly(self, pending: _Pending) -> None:
        with contextlib.suppress(PipeError):  # the members' confirmations carry the error
            await self._hand(pending.messages, pending.outers)

    async def _send_alone(self, message: bytes) -> Confirmation:
        """One message, unchanged. If the inner send raises, the message was not taken: the
        caller gets the error and nothing is kept."""
        inner = await self.inner.send(message)
        self.alone += 1
        self._window.take()
        outer: Confirmation = asyncio.get_running_loop().create_future()
        self._track(inner, [message], [outer])
        return outer

    async def _hand(self, messages: list[bytes], outers: list[Confirmation]) -> None:
        """Sends gathered messages (their senders were told they were taken): as one frame, or
        alone if only one; on failure they stay ours, held until re-sent or dropped."""
        data = messages[0] if len(messages) == 1 else pack(messages)
        try:
            inner = await self.inner.send(data)
        except BaseException as exc:
            self._hold_failed(messages, outers, exc)
            raise
        if len(messages) > 1:
            self.frames += 1
            self.framed += len(messages)
        else:
            self.alone += 1
        self._track(inner, messages, outers)

    def _track(self, inner: Confirmation, messages: list[bytes], outers: list[Confirmation]) -> None:
        self._in_flight[inner] = (messages, outers)
        inner.add_done_callback(self._settled)

    def _settled(self, inner: Confirmation) -> None:
        entry = self._in_flight.pop(inner, None)
        if entry is None:  # dropped meanwhile
            return
        messages, outers = entry
        error = PipeClosed("confirmation cancelled") if inner.cancelled() else inner.exception()
        if error is None:
            self._window.give(len(messages))
            for outer in outers:
                if not outer.done():
                    outer.set_result(None)
        else:
            self._hold_failed(messages, outers, error)

    def _hold_failed(self, messages: list[bytes], outers: list[Confirmation], error: BaseException) -> None:
        """Members whose frame failed: listed as unconfirmed until re-sent (and dropped)."""
        self._window.give(len(messages))
        self._failed.append((messages, outers))
        failure = error if isinstance(error, PipeError) else PipeClosed(f"frame not sent: {error!r}")
        for outer in outers:
            fail_confirmation(outer, failure)


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


DoneCheck = Callable[[Delivery[bytes], Sequence[bytes]], Awaitable[Collection[int]]]
"""Given a redelivered delivery and its members, the indexes of those with a confirmed result
(see :class:`~truba.pipes.record.DoneRecord`)."""


@final
class FrameListener:
    """``Listener[bytes] -> Listener[bytes]`` handing out each member of a frame on its own.

    Several consumers may wait in ``get`` at once (a daemon's workers): one inner ``get`` runs
    for all of them, and the members of a frame it brings go to every waiter, so a frame is
    spread over the free slots instead of waiting behind one. Members received and not yet
    handed out stay here until ``get`` takes them (after :meth:`cancel` too) or :meth:`close`
    returns their frames to the broker.
    """

    name = "unframe"

    def __init__(
        self, inner: Listener[bytes], *, requeue: Sender[bytes] | None = None, done: DoneCheck | None = None
    ) -> None:
        self.inner = inner
        self._requeue = requeue
        self._done = done
        self._looking_up = False
        self._ready: deque[tuple[float, Delivery[bytes]]] = deque()
        """Members received and not handed out yet, with when their frame arrived."""
        self._pull: asyncio.Task[bool] | None = None

    @property
    def held(self) -> int:
        """Members received and not handed out yet."""
        return len(self._ready)

    def held_for(self) -> float:
        """Seconds the oldest member not handed out yet has waited here (0.0: none waits).

        An owner whose consumers are all busy hands such members back when they wait too
        long, so that another consumer of the queue can run them (late binding).
        """
        if not self._ready:
            return 0.0
        return time.monotonic() - self._ready[0][0]

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        if self._ready:
            return self._ready.popleft()[1]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pull = self._pull or self._start_pull(max(0.0, deadline - loop.time()))
            # asyncio.wait neither cancels the pull on timeout nor when this waiter is
            # cancelled: what the pull brings stays here for the next get.
            await asyncio.wait((pull,), timeout=max(0.0, deadline - loop.time()))
            if not pull.done() and self._looking_up:
                # The pull holds a redelivered frame and is looking it up in the record (a
                # bounded wait): its members come next, and must not go unseen by an owner
                # that takes what is left before closing (it would return them redelivered).
                await asyncio.wait((pull,))
            if self._ready:
                return self._ready.popleft()[1]
            if not pull.done():
                return None  # our time is up; the pull goes on for the others
            if not pull.cancelled() and (error := pull.exception()) is not None:
                raise error
            if loop.time() >= deadline or (not pull.cancelled() and not pull.result()):
                return None  # the inner get timed out (or others took what it brought)

    async def take_in(self) -> None:
        """Moves one delivery the inner listener has at hand (if any, without waiting) in here,
        split: its members then count as :attr:`held`. Lets an owner whose consumers are all
        busy see (and hand back) a frame that would otherwise wait unseen in the prefetch."""
        if self._pull is None:
            await asyncio.wait((self._start_pull(0.0),))

    def _start_pull(self, timeout: float) -> asyncio.Task[bool]:
        """The one inner get that every waiter shares (see :meth:`get`)."""
        pull = self._pull = asyncio.get_running_loop().create_task(self._fetch(timeout))
        pull.add_done_callback(_retrieve)
        return pull

    async def _fetch(self, timeout: float) -> bool:
        """One inner get; its members go to ``_ready``. False when it timed out."""
        try:
            delivery = await self.inner.get(timeout)
        finally:
            self._pull = None
        if delivery is None:
            return False
        members = await self._unsettled(delivery)
        now = time.monotonic()
        self._ready.extend((now, member) for member in members)
        return True

    def subscribe(self, callback: Callable[[Delivery[bytes]], Awaitable[None]]) -> None:
        async def each(delivery: Delivery[bytes]) -> None:
            for member in await self._unsettled(delivery):
                await callback(member)

        self.inner.subscribe(each)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
        self._ready.clear()  # unsettled members: their frames go back to the broker
        await self.inner.close()

    async def _unsettled(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]]:
        """The members of ``delivery`` to hand out: all of them, but for a redelivered one those
        that the ``done`` record says have a result already (they are acked here)."""
        members = self._split(delivery)
        if self._done is None or not delivery.redelivered or len(members) == 1:
            return members  # a lone message runs again, as any redelivered AMQP message would
        self._looking_up = True
        try:
            done = set(await self._done(delivery, [member.message for member in members]))
        except Exception as exc:  # the record is an optimisation: without it, all run again
            log.warning("pipe.frame.record_failed", extra={"error": repr(exc)})
            return members
        finally:
            self._looking_up = False
        if done:
            log.info("pipe.frame.done_before", extra={"members": len(members), "done": len(done)})
        for i in sorted(done):
            await members[i].ack()
        return [member for i, member in enumerate(members) if i not in done]

    def _split(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]]:
        members = unpack(delivery.message)
        if not members:
            return [delivery]
        frame = _Frame(delivery, len(members), self._requeue)
        return [_Member(message, frame) for message in members]


def unframing(listener: Listener[object]) -> FrameListener | None:
    """The :class:`FrameListener` layer inside a stack of listeners (each layer's ``inner``)."""
    layer: object = listener
    while layer is not None:
        if isinstance(layer, FrameListener):
            return layer
        layer = getattr(layer, "inner", None)
    return None


def _retrieve(task: asyncio.Task[bool]) -> None:
    """Marks a pull's error seen: its waiters may all have left (the next get raises it anew)."""
    if not task.cancelled():
        task.exception()
