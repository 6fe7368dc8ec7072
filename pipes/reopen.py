"""Leaf wrapper: when the sender below breaks, open a fresh one and carry on. Nothing else.

A reopen sender/listener wraps a *connector* (an async function returning a fresh leaf), like
tower's ``Reconnect`` wraps a MakeService, and moves through explicit states::

    IDLE ──send/get──▶ CONNECTING ──ok──▶ CONNECTED ──PipeBroken──▶ BROKEN ──reopened──▶ CONNECTED
      ▲                    │ first error goes to the caller             │ (background, backoff)
      └────────────────────┘                                  any ──close()──▶ CLOSED

- The first connect error goes to the caller (fail fast: a wrong URL is not retried forever).
- After a break, reconnecting runs in the background with backoff, each attempt bounded by
  ``connect_timeout``; meanwhile ``send`` raises the break's (retryable) error at once, so an
  outer balancer routes around this broker instead of waiting on it, and ``get`` returns None.
- Sender: every message not yet confirmed is kept with the caller's confirmation; after a
  reopen it is sent again on the new channel and the same confirmation resolves. Duplicates are
  possible only for messages that were never confirmed.
- The listener twin is :mod:`truba.pipes.reopen_listener`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, final

from truba.backoff import Backoff
from truba.pipes.base import Confirmation, Sender, close_all, fail_confirmation
from truba.pipes.errors import PipeBroken, PipeClosed, PipeError, SendTimeout

T = TypeVar("T")
log = logging.getLogger(__name__)

REOPEN_BACKOFF = Backoff(attempts=None, base=0.1, cap=5.0)


P = TypeVar("P")


async def connect_within(connect: Callable[[], Awaitable[P]], timeout: float, label: str) -> P:
    """``await connect()``, bounded: a connector that takes too long is a SendTimeout (retryable)."""
    try:
        return await asyncio.wait_for(connect(), timeout)
    except TimeoutError as exc:
        raise SendTimeout(f"{label}: connect took longer than {timeout} s") from exc


class State(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    BROKEN = "broken"
    CLOSED = "closed"


@dataclass(slots=True)
class _Entry(Generic[T]):
    message: T
    outer: Confirmation
    inner: Confirmation | None = None


def _is_break(exc: BaseException) -> bool:
    return isinstance(exc, PipeBroken | SendTimeout)


@final
class ReopenSender(Generic[T]):
    """A sender that survives its transport: reconnects and re-sends what was unconfirmed."""

    name = "reopen"

    def __init__(
        self,
        connect: Callable[[], Awaitable[Sender[T]]],
        *,
        label: str = "",
        connect_timeout: float = 10.0,
        backoff: Backoff = REOPEN_BACKOFF,
    ) -> None:
        self._connect = connect
        self.label = label
        self._connect_timeout = connect_timeout
        self._backoff = backoff
        self.state = State.IDLE
        self.inner: Sender[T] | None = None
        self.reopened = 0
        self._entries: dict[int, _Entry[T]] = {}
        self._seq = itertools.count()
        self._error: PipeError | None = None
        self._reopener: asyncio.Task[None] | None = None
        self._ahead: asyncio.Task[None] | None = None
        """The first connect, started before the first send (:meth:`connect_ahead`)."""
        self._lock = asyncio.Lock()
        self._break_listeners: list[Callable[[PipeError], None]] = []

    def on_break(self, callback: Callable[[PipeError], None]) -> None:
        """Calls ``callback(error)`` whenever the pipe below breaks (a balancer moves messages then)."""
        self._break_listeners.append(callback)

    @property
    def ready(self) -> bool:
        """False while broken or closed: an outer balancer should send elsewhere."""
        return self.state in (State.IDLE, State.CONNECTED)

    def connect_ahead(self) -> None:
        """Starts the first connect now, in the background, instead of at the first send: for
        an owner that knows sends follow soon (a daemon's results, once it runs a job's tasks),
        so that the first of them need not wait for the channel (a queue declare, a channel
        open: 60-90 ms for a job's results on a local broker). A send meanwhile waits for
        this connect. If it fails, the first send connects again and raises its error."""
        if self.state is State.IDLE and self._ahead is None:
            self._ahead = asyncio.create_task(self._connect_ahead(), name=f"connect-{self.label}")

    async def _connect_ahead(self) -> None:
        try:
            await self._inner_for_send()
        except PipeError as exc:  # the first send tries again, and its caller hears why
            log.debug("pipe.reopen.connect_ahead_failed", extra={"pipe": self.label, "error": repr(exc)})

    async def _open(self) -> Sender[T]:
        return await connect_within(self._connect, self._connect_timeout, self.label)

    async def _inner_for_send(self) -> Sender[T]:
        if self.state is State.CLOSED:
            raise PipeClosed(f"{self.label}: sender is closed")
        if self.state is State.CONNECTED and self.inner is not None:
            return self.inner
        if self.state is State.BROKEN:
            assert self._error is not None
            raise self._error
        async with self._lock:  # IDLE: the first connect, inline; its error goes to the caller
            if self.state is State.IDLE:
                self.state = State.CONNECTING
                try:
                    fresh = await self._open()
                except BaseException:
                    if self.state is State.CONNECTING:
                        self.state = State.IDLE
                    raise
                if self.state is State.CLOSED:  # close() ran while we connected: no leaked channel
                    with contextlib.suppress(PipeError):
                        await fresh.close()
                    raise PipeClosed(f"{self.label}: sender is closed")
                self.inner = fresh
                self.state = State.CONNECTED
                log.info("pipe.reopen.connected", extra={"pipe": self.label})
        return await self._inner_for_send()

    async def send(self, message: T) -> Confirmation:
        inner = self.inner
        if self.state is not State.CONNECTED or inner is None:
            inner = await self._inner_for_send()
        try:
            inner_confirmation = await inner.send(message)
        except PipeError as exc:
            if _is_break(exc):
                self._broke(inner, exc)
            raise
        entry = _Entry(message, asyncio.get_running_loop().create_future(), inner_confirmation)
        seq = next(self._seq)
        self._entries[seq] = entry
        inner_confirmation.add_done_callback(functools.partial(self._settled, seq, entry, inner))
        return entry.outer

    def _settled(self, seq: int, entry: _Entry[T], inner: Sender[T], done: Confirmation) -> None:
        if entry.inner is not done or entry.outer.done():
            return  # superseded by a re-send, or dropped
        exc = None if done.cancelled() else done.exception()
        if done.cancelled():
            exc = PipeBroken(f"{self.label}: confirmation cancelled")
        if exc is None:
            self._entries.pop(seq, None)
            entry.outer.set_result(None)
        elif _is_break(exc):
            assert isinstance(exc, PipeError)
            self._broke(inner, exc)  # the entry waits for the new channel
        else:
            fail_confirmation(entry.outer, exc)  # rejected: still ours, listed as unconfirmed

    def _broke(self, inner: Sender[T], exc: PipeError) -> None:
        if inner is not self.inner or self.state in (State.BROKEN, State.CLOSED):
            return
        self.state = State.BROKEN
        self._error = exc
        log.warning("pipe.reopen.broken", extra={"pipe": self.label, "error": f"{type(exc).__name__}: {exc}"})
        self._reopener = asyncio.create_task(self._reopen(inner))
        for callback in self._break_listeners:
            callback(exc)

    async def _reopen(self, dead: Sender[T]) -> None:
        dead.drop_unconfirmed()
        try:
            await asyncio.wait_for(dead.close(), 1.0)
        except (PipeError, TimeoutError) as exc:
            # Best effort: a blocked connection (a memory alarm) never answers a channel close,
            # and that must not stop the reopen (it did: the leaf then stayed broken for good).
            log.info("pipe.reopen.dead_not_closed", extra={"pipe": self.label, "error": repr(exc)})
        attempt = 0
        while self.state is State.BROKEN:
            await self._backoff.sleep(self._backoff.delay(attempt))
            try:
                fresh = await self._open()
            except PipeError as exc:
                attempt += 1
                self._error = exc if exc.retryable else self._error
                # The first failed attempt of a break is a warning; the rest, at debug, only
                # repeat it (an outage is one line, not one per try).
                log.log(
                    logging.WARNING if attempt == 1 else logging.DEBUG,
                    "pipe.reopen.attempt_failed",
                    extra={"pipe": self.label, "attempt": attempt, "error": f"{type(exc).__name__}: {exc}"},
                )
                continue
            if self.state is not State.BROKEN:  # closed meanwhile
                await fresh.close()
                return
            self.inner, self.state, self.reopened = fresh, State.CONNECTED, self.reopened + 1
            pending = [(seq, e) for seq, e in self._entries.items() if not e.outer.done()]
            log.info(
                "pipe.reopen.reopened",
                extra={"pipe": self.label, "attempts": attempt + 1, "resend": len(pending)},
            )
            for seq, entry in pending:
                try:
                    entry.inner = await fresh.send(entry.message)
                except PipeError as exc:
                    if _is_break(exc):
                        self._broke(fresh, exc)
                        return
                    fail_confirmation(entry.outer, exc)
                    continue
                entry.inner.add_done_callback(functools.partial(self._settled, seq, entry, fresh))
            return

    def unconfirmed(self) -> Sequence[T]:
        return [entry.message for entry in self._entries.values()]

    def drop_unconfirmed(self) -> None:
        for entry in self._entries.values():
            if not entry.outer.done():
                fail_confirmation(entry.outer, PipeBroken(f"{self.label}: dropped, re-sent elsewhere"))
        self._entries.clear()
        if self.inner is not None:
            self.inner.drop_unconfirmed()

    async def close(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        closers: list[Awaitable[object]] = []
        if self._ahead is not None:
            # Not cancelled halfway (a channel half open): seeing the sender closed, it closes
            # what it opened itself; bounded by the connect timeout.
            closers.append(self._ahead)
        if self._reopener is not None:
            self._reopener.cancel()
            closers.append(self._reopener)
        if self.inner is not None:
            closers.append(self.inner.close())
        await close_all(*closers)
        for entry in self._entries.values():
            if not entry.outer.done() and entry.inner is not None and entry.inner.done():
                fail_confirmation(entry.outer, PipeClosed(f"{self.label}: closed before the confirm"))


def reopen(
    connect: Callable[[], Awaitable[Sender[T]]], *, label: str = "", connect_timeout: float = 10.0
) -> ReopenSender[T]:
    """Leaf wrapper: a sender over ``connect()`` that reopens it when it breaks."""
    return ReopenSender(connect, label=label, connect_timeout=connect_timeout)
