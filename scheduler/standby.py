"""What a scheduler that does not lead answers: UNAVAILABLE naming the leader, on every face.

- :class:`StandbyFace` serves a standby's ``--listen`` and ``--http`` addresses: every
  JobService, DaemonService and ScheduleService call ends with ``UNAVAILABLE`` and the details
  ``standby; the leader is at HOST:PORT`` (or ``standby; no leader yet``), with the leader's
  address in the trailing metadata :data:`LEADER_KEY` as well, which clients and daemons follow
  (:mod:`truba.follow`). Health answers ``NOT_SERVING`` for the truba services (``SERVING`` for
  the server as a whole: the process is well). Every HTTP path answers 503 with the same text
  in JSON and the leader in a ``X-Truba-Leader`` header.
- :class:`LeaderGate` is the leader's own interceptor: once its fence has passed (it is about
  to step down), calls are refused the same way.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from truba.follow import LEADER_KEY

if TYPE_CHECKING:
    from aiohttp import web

    from truba.http_server import HttpServer

log = logging.getLogger(__name__)

OPEN_PREFIXES: Final = ("/grpc.health.v1.Health/",)


def standby_details(leader: str) -> str:
    """The one line a standby answers with."""
    return f"standby; the leader is at {leader}" if leader else "standby; no leader yet"


if TYPE_CHECKING:  # generic in the stubs only
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor


def _refusals(leader: Callable[[], str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A coroutine and an async generator, each ending its call with UNAVAILABLE naming the leader."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        where = leader()
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, standby_details(where), trailing_metadata=((LEADER_KEY, where),)
        )

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await refuse(request, context)
        yield b""  # pragma: no cover - makes this an async generator

    return refuse, refuse_stream


@final
class _Refuser(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Every method but health's: a handler (bytes in, bytes out; it reads nothing) that refuses."""

    def __init__(self, leader: Callable[[], str]) -> None:
        self._handler = grpc.stream_stream_rpc_method_handler(_refusals(leader)[1])

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        return None if details.method.startswith(OPEN_PREFIXES) else self._handler


@final
class LeaderGate(_ServerInterceptor):
    """Refuses every call but health once ``leading()`` turns False (the leader's fence passed)."""

    def __init__(self, leading: Callable[[], bool], leader: Callable[[], str]) -> None:
        self._leading = leading
        self._refuse, self._refuse_stream = _refusals(leader)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        if handler is None or self._leading() or details.method.startswith(OPEN_PREFIXES):
            return handler
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._refuse, **codec)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(self._refuse_stream, **codec)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._refuse, **codec)
        return grpc.stream_stream_rpc_method_handler(self._refuse_stream, **codec)


@final
class StandbyFace:
    """A standby's gRPC server and HTTP face on the addresses the leader would serve.

    Raises (from start):
        RuntimeError: an address cannot be bound.
    """

    def __init__(
        self,
        listen: str,
        http: str | None,
        *,
        leader: Callable[[], str],
        services: Sequence[str],
        grpc_options: Sequence[tuple[str, int | str]] = (),
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        self._listen = listen
        self._http_listen = http
        self._leader = leader
        self._services = services
        self._options = grpc_options
        self._tls = tls
        self._server: grpc.aio.Server | None = None
        self._http: HttpServer | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self._listen.rpartition(':')[0]}:{self.port}"

    @property
    def http_address(self) -> str | None:
        return self._http.address if self._http is not None else None

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *self._options])
        server.add_generic_rpc_handlers((_Refuser(self._leader),))
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        if self._tls is not None:
            port = server.add_secure_port(self._listen, grpc.ssl_server_credentials([self._tls]))
        else:
            port = server.add_insecure_port(self._listen)
        if not port:
            raise RuntimeError(f"cannot serve on {self._listen}")
        await server.start()
        self._server = server
        self.port = port
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        for service in self._services:
            await health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._http_listen is not None:
            from truba.http_server import HttpServer

            self._http = HttpServer(_http_app(self._leader), self._http_listen, started="sched.standby.http")
            await self._http.start()
        log.info("sched.standby.serving", extra={"listen": self.address, "http": self.http_address})

    async def stop(self) -> None:
        """Stops both faces (their ports are free on return); idempotent."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)


def _http_app(leader: Callable[[], str]) -> web.Application:
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        where = leader()
        return web.json_response(
            {"error": standby_details(where), "leader": where},
            status=503,
            headers={"X-Truba-Leader": where, "Retry-After": "1"},
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app
