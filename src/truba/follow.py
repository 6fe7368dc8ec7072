"""Following the leader among several schedulers: ``"a:50051,b:50051"`` as one channel.

With high availability (docs/scheduler.md), several schedulers share one store and one of them
leads; the others answer every call with ``UNAVAILABLE`` and the leader's address in the
trailing metadata :data:`LEADER_KEY`. A :class:`FollowingChannel` (asyncio) or
:class:`FollowingBlockingChannel` (the CLI) holds one channel per address and sends each call
to the current one; a unary call that ends ``UNAVAILABLE`` moves on (to the leader named in the
answer, else to the next address) and is made again there at once, each address at most once
per call and within the call's own deadline; then the caller's usual bounded retries take over.
Streams go to the current address; the next unary call moves it when that one is down.

Any gRPC stub works over these channels (they offer ``unary_unary``, ``unary_stream``,
``stream_unary``, ``stream_stream`` and ``close``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar, final

import grpc
import grpc.aio

log = logging.getLogger(__name__)

LEADER_KEY: Final = "truba-leader"
"""Trailing metadata of a standby's answer: the leader's address ("" when none is known)."""
ELECTION_WINDOW: Final = 30.0
"""Seconds after a standby's answer during which an election counts as under way: a failed try
waits :data:`STANDBY_RETRY`, not a growing backoff (the new leader's port is closed while it
loads the store). The lease's ttl (3 s by default) plus that load, with room to spare."""
STANDBY_RETRY: Final = (0.1, 0.5)
"""Seconds (uniform) before trying again while an election is under way: it ends within seconds."""

GRPC_SCHEMES: Final = ("unix:", "unix-abstract:", "ipv4:", "ipv6:", "dns:")
C = TypeVar("C")


def scheduler_addresses(text: str) -> list[str]:
    """``"a:50051, b:50051"`` as ``["a:50051", "b:50051"]`` (blanks dropped, order kept, no
    repeats).

    A gRPC target with a scheme (``ipv4:a,b``, ``dns:``, ``unix:``) is one address: gRPC
    balances over its list itself.

    Raises:
        ValueError: no address at all.
    """
    if text.strip().startswith(GRPC_SCHEMES):
        return [text.strip()]
    addresses: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part and part not in addresses:
            addresses.append(part)
    if not addresses:
        raise ValueError(f"scheduler: no address in {text!r}")
    return addresses


def leader_hint(error: BaseException) -> str:
    """The leader's address a standby named in ``error`` (a gRPC error), or ""."""
    return _leader_entry(error) or ""


def from_standby(error: BaseException) -> bool:
    """``error`` is a standby's answer (it names the leader, or says there is none yet)."""
    return _leader_entry(error) is not None


def _leader_entry(error: BaseException) -> str | None:
    """The :data:`LEADER_KEY` entry of ``error``'s trailing metadata; None without one."""
    trailing = getattr(error, "trailing_metadata", None)
    if not callable(trailing):
        return None
    try:
        metadata = trailing()
    except Exception:  # a call object that has no trailing metadata yet
        return None
    for key, value in metadata or ():
        if key == LEADER_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


@final
class Election:
    """Whether an election is under way: a standby answered within :data:`ELECTION_WINDOW` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen = -math.inf

    def saw(self, error: BaseException | None) -> None:
        """A call failed with ``error``: notes when, if a standby gave it."""
        if error is not None and from_standby(error):
            self._seen = self._clock()

    @property
    def on(self) -> bool:
        """A standby answered within the last :data:`ELECTION_WINDOW` seconds."""
        return self._clock() - self._seen < ELECTION_WINDOW


def _code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


class _Addresses(Generic[C]):
    """The addresses, the current one, and a channel per address opened on first use."""

    def __init__(self, addresses: Sequence[str], open_one: Callable[[str], C]) -> None:
        self.addresses = list(addresses)
        self.current = self.addresses[0]
        self.election = Election()
        self._open = open_one
        self.channels: dict[str, C] = {}

    def channel(self, address: str) -> C:
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = self._open(address)
        return channel

    def moved(self, failed: str, error: BaseException) -> str:
        """``failed`` answered UNAVAILABLE: the address to try next (the leader it named, or the
        next in the list), which becomes the current one."""
        self.election.saw(error)
        if self.current == failed:
            hint = leader_hint(error)
            if hint and hint != failed:
                if hint not in self.addresses:
                    self.addresses.append(hint)
                self.current = hint
            else:
                index = self.addresses.index(failed) if failed in self.addresses else -1
                self.current = self.addresses[(index + 1) % len(self.addresses)]
            log.info("scheduler.follow", extra={"failed": failed, "next": self.current})
        return self.current


@final
class FollowingChannel:
    """An asyncio channel over several scheduler addresses; see the module."""

    def __init__(self, addresses: Sequence[str], open_one: Callable[[str], grpc.aio.Channel]) -> None:
        self._book = _Addresses(addresses, open_one)

    @property
    def current(self) -> str:
        """The address calls go to now."""
        return self._book.current

    @property
    def electing(self) -> bool:
        """A standby answered a call within the last :data:`ELECTION_WINDOW` seconds."""
        return self._book.election.on

    def unary_unary(self, method: str, **codec: Any) -> Callable[..., Any]:
        book = self._book

        async def call(request: Any, *, timeout: float | None = None, **options: Any) -> Any:
            deadline = None if timeout is None else time.monotonic() + timeout
            tried: set[str] = set()
            while True:
                address = book.current
                tried.add(address)
                left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    return await book.channel(address).unary_unary(method, **codec)(
                        request, timeout=left, **options
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    following = book.moved(address, exc)
                    if following in tried or (deadline is not None and time.monotonic() >= deadline):
                        raise

        return call

    def unary_stream(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).unary_stream(method, **codec)(*a, **k)

    def stream_unary(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).stream_unary(method, **codec)(*a, **k)

    def stream_stream(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).stream_stream(method, **codec)(*a, **k)

    async def close(self, grace: float | None = None) -> None:
        channels = list(self._book.channels.values())
        self._book.channels.clear()
        for channel in channels:
            await channel.close(grace)

    async def __aenter__(self) -> FollowingChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close(None)


@final
class FollowingBlockingChannel:
    """The blocking twin of :class:`FollowingChannel`, for the command line."""

    def __init__(self, addresses: Sequence[str], open_one: Callable[[str], grpc.Channel]) -> None:
        self._book = _Addresses(addresses, open_one)

    @property
    def current(self) -> str:
        return self._book.current

    def unary_unary(self, method: str, **codec: Any) -> Callable[..., Any]:
        book = self._book

        def call(request: Any, *, timeout: float | None = None, **options: Any) -> Any:
            deadline = None if timeout is None else time.monotonic() + timeout
            tried: set[str] = set()
            while True:
                address = book.current
                tried.add(address)
                left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                try:
                    return book.channel(address).unary_unary(method, **codec)(
                        request, timeout=left, **options
                    )
                except grpc.RpcError as exc:
                    if _code(exc) != grpc.StatusCode.UNAVAILABLE:
                        raise
                    following = book.moved(address, exc)
                    if following in tried or (deadline is not None and time.monotonic() >= deadline):
                        raise

        return call

    def unary_stream(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).unary_stream(method, **codec)(*a, **k)

    def stream_unary(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).stream_unary(method, **codec)(*a, **k)

    def stream_stream(self, method: str, **codec: Any) -> Callable[..., Any]:
        return lambda *a, **k: self._book.channel(self.current).stream_stream(method, **codec)(*a, **k)

    def close(self) -> None:
        channels = list(self._book.channels.values())
        self._book.channels.clear()
        for channel in channels:
            channel.close()

    def __enter__(self) -> FollowingBlockingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
