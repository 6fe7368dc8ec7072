"""Combinator: balance one stream of messages over several senders (one per broker).

Each message goes to a sender that is up and not overloaded, where load is the number of that
sender's messages awaiting a confirm, capped per sender by ``max_load``: of two picked at random,
the one where a new message would wait less (tower's p2c over Finagle's peak-EWMA cost). A slow
broker gets fewer messages, never more than its cap, and does not slow the others: when the best
sender is full, a message goes to a slower one only if it would be confirmed there about as soon
as on the full one (else it waits for room there), so a slow broker's backlog stays as short, in
time, as a fast one's and leaves no long tail of unconfirmed messages behind. When every sender
is at its cap, ``send`` waits for the first confirm (backpressure).

When a sender breaks (its ``send`` raises, or a confirmation fails, with a retryable error) it is
taken out of rotation for a cooldown that grows with repeated failures, and its unconfirmed
messages are moved: sent again through the other senders, then dropped from the broken one. The
caller's confirmation follows its message wherever it goes. Duplicates can arise only for
messages that were never confirmed. Given each sender's :class:`~truba.pipes.base.LinkHealth`
(``health``: its broker leaf, a :class:`~truba.pipes.reopen.ReopenSender`, handed over by the
stack builder), a sender whose leaf is not ready (reconnecting) is skipped, and a leaf's break
is heard at once, so its messages move without waiting for the next send or its reconnect.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, final

from truba.pipes.backpressure import Room, Window
from truba.pipes.base import Confirmation, LinkHealth, Sender, close_all, fail_confirmation
from truba.pipes.errors import PipeClosed, PipeError

T = TypeVar("T")
log = logging.getLogger(__name__)

_INITIAL_SERVICE = 0.0001  # seconds per message: optimistic, so a new sender is tried soon
_TIE = 0.001  # seconds of expected wait that do not make one sender better than another
_RECHECK = 0.05  # seconds to wait for a full fast sender before reconsidering slower ones
_SLOW_START = 32  # unconfirmed messages a sender may hold before its first confirm
_EWMA = 0.1  # weight of a new sample below the current estimate
_DECAY = 1.0  # seconds: an estimate no confirm has refreshed fades by e each (Finagle's decay time)
_SLACK = 1.25  # a full sender's message goes elsewhere if it waits there at most this much longer
_WAKE_BATCH = 32  # free places on a full sender that wake its waiters (fewer when its cap is small)


@dataclass(slots=True)
class _Entry(Generic[T]):
    message: T
    outer: Confirmation
    index: int
    inner: Confirmation | None = None
    sent_at: float = 0.0
    ahead: int = 0  # unconfirmed messages on its sender when it was sent


@final
class BalanceSender(Generic[T]):
    """Sends each message through a random ready, not-overloaded sender of ``senders``.

    Raises (from ``send``):
        PipeClosed: after close().
        PipeError: no sender could take the message (the last cause; retryable if it was).
    """

    name = "balance"

    def __init__(
        self,
        senders: Sequence[Sender[T]],
        max_load: int = 1000,
        *,
        health: Sequence[LinkHealth] | None = None,
        cooldown: float = 0.5,
        max_cooldown: float = 10.0,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not senders:
            raise ValueError("balance needs at least one sender")
        self.inners = list(senders)
        self._max_load = max_load
        self._cooldown = cooldown
        self._max_cooldown = max_cooldown
        self._rng = rng or random.Random()
        self._now = monotonic
        self._entries: dict[int, _Entry[T]] = {}
        # Sends wait in one room for room on any sender; each sender's window counts its
        # unconfirmed messages against its cap (see _cap_for), and wakes the room by batches.
        self._room = Room()
        self._windows = [Window(self._cap_for(0), self._room, wake_batch=_WAKE_BATCH) for _ in senders]
        self._down_until = [0.0] * len(senders)
        self._failures = [0] * len(senders)
        self._service = [_INITIAL_SERVICE] * len(senders)
        self._observed_at = [monotonic()] * len(senders)
        self._confirmed = [0] * len(senders)
        # seq -> sent at, oldest first; ordered dicts find their oldest in O(1) however many
        # were popped from the front (a plain dict scans the holes they leave until it resizes)
        self._pending: list[OrderedDict[int, float]] = [OrderedDict() for _ in senders]
        self._errors: list[PipeError | None] = [None] * len(senders)
        self._seq = itertools.count()
        self._recheck: asyncio.TimerHandle | None = None
        self._moves: set[asyncio.Task[None]] = set()
        self._closed = False
        self.moved = 0
        if health is not None and len(health) != len(senders):
            raise ValueError(f"balance: {len(health)} health reports for {len(senders)} senders")
        self._health = list(health) if health is not None else None
        for index, link in enumerate(self._health or ()):
            link.on_break(functools.partial(self._broke, index))  # at once, not at the next send

    def _wake(self) -> None:
        self._recheck = None
        self._room.wake()

    def _broke(self, index: int, exc: PipeError) -> None:
        if not self._closed:
            self._mark_down(index, exc)

    def loads(self) -> list[int]:
        """Messages awaiting a confirm, per sender."""
        return [window.used for window in self._windows]

    def _usable(self, now: float) -> list[int]:
        """Senders that are up (not cooling down after a break, and ready)."""
        down, health = self._down_until, self._health
        if health is None:
            return [i for i in range(len(down)) if down[i] <= now]
        return [i for i in range(len(down)) if down[i] <= now and health[i].ready]

    async def send(self, message: T) -> Confirmation:
        if self._closed:
            raise PipeClosed("balanced sender is closed")
        entry = _Entry(message, asyncio.get_running_loop().create_future(), -1)
        await self._place(entry, exclude=-1)
        return entry.outer

    def _pick(self, choices: list[int], now: float) -> int:
        """Power of two choices: the cheaper of two random candidates (ties: the first drawn).

        Cost is the time a new message would wait there: (unconfirmed + 1) × the sender's service
        time per message, a peak EWMA (after Finagle) of each confirm's wait divided by the
        messages it queued behind. Random keeps brokers evenly used; the cost gives a slow broker
        a backlog as short, in time, as a fast one's, so it neither slows the others nor leaves
        a long tail of unconfirmed messages behind. A full sender (at its cap) is skipped.
        """
        n = len(choices)
        if n == 1:
            return choices[0]
        if n == 2:  # the common case: one draw orders the pair
            first, second = (choices[0], choices[1]) if self._rng.random() < 0.5 else (choices[1], choices[0])
        else:
            a = self._rng.randrange(n)
            b = self._rng.randrange(n - 1)
            first, second = choices[a], choices[b + 1 if b >= a else b]
        # Waits within a millisecond of each other are a tie: random spreads light traffic evenly.
        return second if self._cost(second, now) < self._cost(first, now) - _TIE else first

    def _cheapest_with_room(self, choices: list[int], now: float) -> int | None:
        windows = self._windows
        if len(choices) == 2:  # the common case; the full one has no room
            a, b = choices
            if not windows[a].full:
                return a if windows[b].full or self._cost(a, now) <= self._cost(b, now) else b
            return b if not windows[b].full else None
        with_room = [i for i in choices if not windows[i].full]
        return min(with_room, key=lambda i: self._cost(i, now)) if with_room else None

    def _cap_for(self, confirmed: int) -> int:
        """A sender's cap: ``max_load``, reached by slow start: 2 more allowed per confirm, from
        _SLOW_START.

        Until a broker has confirmed anything its speed is unknown; a burst must not park a
        whole window on a broker that turns out to be slow.
        """
        return min(self._max_load, _SLOW_START + 2 * confirmed)

    def _estimate(self, index: int, now: float) -> float:
        """Sender ``index``'s service time per message, faded by the time since its last confirm.

        Without the fade, one slow sample (a broker's pause, this process preempted) would make a
        sender lose every comparison, so it would get no messages, hence no confirms to correct
        the estimate: starved for good while the others have room. Fading (Finagle's peak EWMA
        decays the same way) sends it a message again once the others' queues cost more.
        """
        elapsed = now - self._observed_at[index]
        service = self._service[index]
        return service * math.exp(-elapsed / _DECAY) if elapsed > 0.0 else service

    def _cost(self, index: int, now: float) -> float:
        queued = self._estimate(index, now) * (self._windows[index].used + 1)
        pending = self._pending[index]
        if not pending:
            return queued
        # A broker that has not confirmed its oldest message for a while is at least that slow,
        # even before any confirm has taught us its service time.
        oldest = now - pending[next(iter(pending))]
        return oldest if oldest > queued else queued

    def _observe(self, index: int, seconds: float, now: float) -> None:
        """Peak EWMA: jumps up to a slow sample at once, decays towards fast ones."""
        current = self._estimate(index, now)
        self._service[index] = seconds if seconds > current else current + (seconds - current) * _EWMA
        self._observed_at[index] = now

    async def _place(self, entry: _Entry[T], exclude: int) -> None:
        """Sends ``entry`` through a sender (``exclude`` only if it is the last one usable).

        Waits while every usable sender is at its cap; raises the last error when no sender is
        usable or every usable one failed for this message.
        """
        tried: set[int] = set()
        last_error: PipeError | None = None
        while True:
            if self._closed:
                raise PipeClosed("balanced sender is closed")
            now = self._now()
            usable = self._usable(now)
            choices = usable
            if tried or exclude >= 0:
                choices = [i for i in usable if i not in tried and i != exclude]
            if not choices and exclude in usable and exclude not in tried:
                choices = [exclude]  # the broker it came from is the only one up again
            if choices:
                index = self._pick(choices, now)
                if self._windows[index].full:
                    alternative = self._cheapest_with_room(choices, now)
                    if (
                        alternative is None
                        or self._cost(alternative, now) > _SLACK * self._cost(index, now) + _TIE
                    ):
                        # The best place is full and the others are slower: wait for a confirm
                        # (briefly, costs change) rather than build a backlog on a slow broker
                        # that would be confirmed later than this one's (a tail at the end).
                        if alternative is not None and self._recheck is None:
                            # One shared timer wakes every waiter to reconsider (a stalled full
                            # sender confirms nothing, but its oldest message keeps ageing).
                            self._recheck = asyncio.get_running_loop().call_later(_RECHECK, self._wake)
                        await self._room.wait()
                        continue
                    index = alternative
                try:
                    inner = await self.inners[index].send(entry.message)
                except PipeError as exc:
                    if not exc.retryable:
                        raise
                    tried.add(index)
                    last_error = exc
                    self._mark_down(index, exc)
                    continue
                self._failures[index] = 0
                self._attach(entry, index, inner)
                return
            if last_error is not None:
                raise last_error
            known = [e for e in self._errors if e is not None]
            if known:
                raise known[-1]
            await asyncio.sleep(0.05)  # senders not ready yet (first connects in flight)

    def _attach(self, entry: _Entry[T], index: int, inner: Confirmation) -> None:
        seq = next(self._seq)
        entry.index, entry.inner, entry.sent_at = index, inner, self._now()
        window = self._windows[index]
        entry.ahead = window.used
        self._pending[index][seq] = entry.sent_at
        self._entries[seq] = entry
        window.take()
        inner.add_done_callback(functools.partial(self._settled, seq, entry, index))

    def _settled(self, seq: int, entry: _Entry[T], index: int, done: Confirmation) -> None:
        if entry.inner is not done:
            return
        self._pending[index].pop(seq, None)
        window = self._windows[index]
        # Waiters wake once a few messages' room is free, not at every single confirm: a burst
        # of confirms then costs one wake-up, and the sends after it find room.
        window.give()
        if entry.outer.done():
            self._entries.pop(seq, None)
            return
        exc = PipeClosed("confirmation cancelled") if done.cancelled() else done.exception()
        if exc is None:
            self._entries.pop(seq, None)
            # Little's law: the wait divided by the messages it queued behind is a service time.
            now = self._now()
            self._observe(index, (now - entry.sent_at) / (entry.ahead + 1), now)
            confirmed = self._confirmed[index] = self._confirmed[index] + 1
            if window.limit < self._max_load:
                window.resize(self._cap_for(confirmed))
            entry.outer.set_result(None)
        elif isinstance(exc, PipeError) and exc.retryable and not self._closed:
            self._mark_down(index, exc)
        else:
            fail_confirmation(entry.outer, exc)  # rejected: still ours, listed as unconfirmed

    def _mark_down(self, index: int, exc: PipeError) -> None:
        """Takes sender ``index`` out of rotation and moves its unconfirmed messages elsewhere."""
        now = self._now()
        if self._down_until[index] > now:
            return
        self._failures[index] += 1
        self._errors[index] = exc
        pause = min(self._max_cooldown, self._cooldown * 2 ** min(self._failures[index] - 1, 32))
        self._down_until[index] = now + pause
        stranded = [(seq, e) for seq, e in self._entries.items() if e.index == index and not e.outer.done()]
        log.warning(
            "pipe.balance.down",
            extra={
                "sender": index,
                "cooldown": pause,
                "moving": len(stranded),
                "error": f"{type(exc).__name__}: {exc}",
            },
        )
        if not stranded:
            return
        for seq, entry in stranded:  # still listed as unconfirmed until placed elsewhere
            entry.index, entry.inner = -1, None
            self._pending[index].pop(seq, None)
        self._windows[index].give(len(stranded))
        self._room.wake()
        self.inners[index].drop_unconfirmed()
        task = asyncio.create_task(self._move(stranded, index))
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)

    async def _move(self, stranded: list[tuple[int, _Entry[T]]], index: int) -> None:
        """Re-sends messages of a broken sender elsewhere, retrying until placed or closed."""
        for old_seq, entry in stranded:
            attempt = 0
            while not entry.outer.done():
                try:
                    await self._place(entry, exclude=index)
                    self._entries.pop(old_seq, None)  # listed under its new seq now
                    self.moved += 1
                    break
                except PipeClosed:
                    return
                except PipeError as exc:
                    if not exc.retryable:
                        fail_confirmation(entry.outer, exc)
                        break
                    attempt += 1
                    await asyncio.sleep(min(self._max_cooldown, self._cooldown * attempt))

    def unconfirmed(self) -> Sequence[T]:
        return [entry.message for entry in self._entries.values()]

    def drop_unconfirmed(self) -> None:
        self._entries.clear()
        for sender in self.inners:
            sender.drop_unconfirmed()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._room.close()
        if self._recheck is not None:
            self._recheck.cancel()
        for task in list(self._moves):
            task.cancel()
        await close_all(*self._moves, *(sender.close() for sender in self.inners))


def balance(senders: Sequence[Sender[T]], max_load: int = 1000) -> BalanceSender[T]:
    """Combinator: one sender over many, picking a random ready one below ``max_load`` unconfirmed."""
    return BalanceSender(senders, max_load)
