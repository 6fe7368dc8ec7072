"""Optional bearer-token authentication of every scheduler call.

With a token configured, a call without ``authorization: Bearer <token>`` ends with
UNAUTHENTICATED before it reaches a servicer. The health service stays open, so load balancers
and ``truba up`` can probe the scheduler without the secret. Tokens are compared in constant
time.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, final

import grpc
import grpc.aio

log = logging.getLogger(__name__)

OPEN_PREFIXES: Final = ("/grpc.health.v1.Health/",)


if TYPE_CHECKING:  # generic in the stubs only
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor


@final
class TokenAuth(_ServerInterceptor):
    """Refuses calls that do not carry the bearer ``token``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("token: must not be empty")
        self._expected = f"Bearer {token}".encode()

    def _allows(self, details: grpc.HandlerCallDetails) -> bool:
        if details.method.startswith(OPEN_PREFIXES):
            return True
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        if handler is None or self._allows(details):
            return handler
        log.warning("sched.auth.refused", extra={"method": details.method})
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that ends every call with UNAUTHENTICATED."""

    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "a valid 'authorization: Bearer <token>' is required"
        )

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "a valid 'authorization: Bearer <token>' is required"
        )
        yield  # pragma: no cover - makes this an async generator

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **codec)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **codec)
