"""How clients, daemons and the CLI reach the scheduler: one place that opens the gRPC channel.

Security is optional and symmetric with the scheduler's options: with ``tls_ca`` (a PEM file of
the certificate authority, or the scheduler's own self-signed certificate) the channel is TLS;
with ``token`` every call carries ``authorization: Bearer <token>``. Defaults come from the
environment (``TRUBA_TOKEN``, ``TRUBA_TLS_CA``) so that tools and examples need no new flags.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import grpc.aio

from truba.follow import FollowingBlockingChannel, FollowingChannel, scheduler_addresses

TOKEN_ENV = "TRUBA_TOKEN"
TLS_CA_ENV = "TRUBA_TLS_CA"
MAX_RECONNECT_BACKOFF_MS = 2000
INITIAL_RECONNECT_BACKOFF_MS = 200
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)
"""gRPC waits 1 s after a refused connect before the next, growing to 120 s: a scheduler that
restarts (or a standby that takes over) would stay unreachable long after it serves. From
0.2 s growing to 2 s, a client reached a scheduler that came back 0.42-0.52 s after it served
(0.82-1.32 s with gRPC's defaults, stop 35)."""
DEFAULT_PORT = 50051
"""The scheduler's port when an address names none (gRPC itself would take 443)."""

SCHEDULER_ENV = "TRUBA_SCHEDULER"


def default_scheduler() -> str:
    """``$TRUBA_SCHEDULER`` (empty = unset), else ``127.0.0.1:50051``: every command's default.

    Like every scheduler address truba takes, it may list several schedulers, comma-separated
    (``a:50051,b:50051``): calls follow the leader among them (:mod:`truba.follow`)."""
    return os.environ.get(SCHEDULER_ENV) or f"127.0.0.1:{DEFAULT_PORT}"


def scheduler_target(address: str) -> str:
    """``address`` with the scheduler's default port added when it names none.

    ``host`` and ``[::1]`` become ``host:50051`` and ``[::1]:50051``; an address with a port or
    a gRPC scheme (``unix:``, ``dns:///``, ``ipv4:``…) is left as it is. In a list of several
    (``a,b``), each one is.
    """
    if "," in address:
        several = scheduler_addresses(address)
        if len(several) > 1:
            return ",".join(scheduler_target(one) for one in several)
        address = several[0]
    address = address.strip()
    if "://" in address or address.startswith(("unix:", "unix-abstract:", "ipv4:", "ipv6:", "dns:")):
        return address
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{DEFAULT_PORT}"
    if address.count(":") == 1:
        return address  # host:port
    if ":" in address:
        return f"[{address}]:{DEFAULT_PORT}"  # a bare IPv6 address
    return f"{address}:{DEFAULT_PORT}"


@dataclass(frozen=True)
class Credentials:
    """What a caller presents to the scheduler: an optional bearer token and TLS root."""

    token: str | None = None
    tls_ca: Path | None = None

    @classmethod
    def from_env(cls, token: str | None = None, tls_ca: str | os.PathLike[str] | None = None) -> Credentials:
        """Explicit values win; otherwise ``TRUBA_TOKEN`` and ``TRUBA_TLS_CA`` (empty = unset)."""
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        ca = tls_ca if tls_ca is not None else os.environ.get(TLS_CA_ENV) or None
        return cls(token=token, tls_ca=Path(ca) if ca is not None else None)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the token (empty without one)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


if TYPE_CHECKING:  # generic in the stubs only
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _StreamStream = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor
    _StreamStream = grpc.aio.StreamStreamClientInterceptor


class _TokenInterceptor(_UnaryUnary, _UnaryStream, _StreamStream):
    """Adds the bearer token to every call (works on insecure channels too, unlike call credentials)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


def open_channel(
    address: str, credentials: Credentials | None = None, *, options: Sequence[tuple[str, int | str]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to the scheduler at ``address`` with ``credentials`` applied; several
    comma-separated addresses make a :class:`~truba.follow.FollowingChannel`."""
    addresses = scheduler_addresses(address) if "," in address else [address]
    if len(addresses) > 1:
        following = FollowingChannel(addresses, lambda one: open_channel(one, credentials, options=options))
        return cast(grpc.aio.Channel, following)
    credentials = credentials or Credentials()
    address = scheduler_target(address)
    options = [*RECONNECT_OPTIONS, *options]
    interceptors = [cast(Any, _TokenInterceptor(credentials.metadata()))] if credentials.token else None
    if credentials.tls_ca is not None:
        root = credentials.tls_ca.read_bytes()
        return grpc.aio.secure_channel(
            address, grpc.ssl_channel_credentials(root), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def open_blocking_channel(address: str, credentials: Credentials | None = None) -> grpc.Channel:
    """A blocking channel (for the CLI); the token goes in each call's ``metadata=``. Several
    comma-separated addresses make a :class:`~truba.follow.FollowingBlockingChannel`."""
    addresses = scheduler_addresses(address) if "," in address else [address]
    if len(addresses) > 1:
        following = FollowingBlockingChannel(addresses, lambda one: open_blocking_channel(one, credentials))
        return cast(grpc.Channel, following)
    credentials = credentials or Credentials()
    address = scheduler_target(address)
    if credentials.tls_ca is not None:
        return grpc.secure_channel(
            address, grpc.ssl_channel_credentials(credentials.tls_ca.read_bytes()), options=RECONNECT_OPTIONS
        )
    return grpc.insecure_channel(address, options=RECONNECT_OPTIONS)
