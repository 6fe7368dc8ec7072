"""Backpressure: a send waits while too many of its messages are unconfirmed below it.

Three senders bound what they have in flight: the RabbitMQ leaf (publishes awaiting a confirm),
the frame layer (messages gathered or in flight, since its inner window counts frames) and
balance (per broker, with a cap that grows by slow start). Each counts its messages in a
:class:`Window`: ``take`` when a message goes out, ``give`` when its confirm arrives or it
fails. A send waits while the window is :attr:`~Window.full`, in the window's :class:`Room`; a
``give`` that frees enough places wakes it. When the pipe closes or breaks its owner shuts the
room: every waiter wakes at once, for good, and re-checks why (it then raises PipeClosed or the
break), so no send waits on a window that will never drain.

Several windows may share one room (balance: a send waits for room on *any* broker), and a
window may wake its room only once several places are free (``wake_batch``: a burst of confirms
then costs one wake-up, and the woken sends find room).

Hot path: ``take`` and ``give`` are a few integer operations, and a send that finds room
(``if window.full: await window.wait()``) neither awaits nor allocates anything.
"""

from __future__ import annotations

import asyncio
from typing import final


@final
class Room:
    """Where sends wait for room in one or more :class:`Window`\\ s."""

    __slots__ = ("_event", "shut")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.shut = False
        """The pipe closed or broke: waits return at once, for good."""

    async def wait(self) -> None:
        """Waits for the next :meth:`wake` (returns at once once shut). Unbounded by itself:
        whoever waits here relies on a confirm, a failure, a timer or a close to wake it."""
        if self.shut:
            return
        self._event.clear()
        await self._event.wait()

    def wake(self) -> None:
        """Wakes every waiting send (each re-checks whether there is room for it)."""
        self._event.set()

    def close(self) -> None:
        """Wakes every waiting send, now and from now on: the pipe closed or broke."""
        self.shut = True
        self._event.set()


@final
class Window:
    """At most ``limit`` messages unconfirmed: :meth:`take` a place per message sent,
    :meth:`give` it back when it is confirmed or fails; sends wait while it is full.

    ``limit`` may change (:meth:`resize`: balance's slow start). ``wake_batch`` > 1 wakes the
    room only once that many places are free (at most an eighth of the limit, plus one).
    """

    __slots__ = ("_batch", "_wake_at", "limit", "room", "used")

    def __init__(self, limit: int, room: Room | None = None, *, wake_batch: int = 1) -> None:
        if limit < 1 or wake_batch < 1:
            raise ValueError(f"window: limit and wake_batch must be >= 1, got {limit}, {wake_batch}")
        self.room = room or Room()
        self.used = 0
        self.limit = limit
        self._batch = wake_batch
        self._wake_at = limit - min(wake_batch, limit // 8 + 1)

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def resize(self, limit: int) -> None:
        """A new limit, effective at once (a send waiting for room re-checks at its next wake)."""
        self.limit = limit
        self._wake_at = limit - min(self._batch, limit // 8 + 1)

    async def wait(self) -> None:
        """Returns once a place is free, or once the room is shut (the caller checks why)."""
        room = self.room
        while self.used >= self.limit and not room.shut:
            await room.wait()

    def take(self, count: int = 1) -> None:
        self.used += count

    def give(self, count: int = 1) -> None:
        used = self.used - count
        self.used = used if used > 0 else 0
        if used <= self._wake_at:
            self.room.wake()

    def reset(self) -> None:
        """Every place free (the unconfirmed messages were dropped): waiting sends wake."""
        self.used = 0
        self.room.wake()
