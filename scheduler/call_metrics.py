"""Counts every gRPC call the scheduler serves, by method and status code, as it ends.

A server interceptor wraps each method handler in one of the same shape; the count lands in
``truba_scheduler_grpc_calls_total{method, code}`` (see :mod:`truba.scheduler.metrics`).
Streams (``WatchJob``, a daemon's ``Connect``) count when they end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, final

import grpc
import grpc.aio
from prometheus_client import Counter

if TYPE_CHECKING:  # generic in the stubs only
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

Context = grpc.aio.ServicerContext[Any, Any]


@final
class CallCounter(_ServerInterceptor):
    """Counts calls into ``calls`` (labels ``method``, ``code``)."""

    def __init__(self, calls: Counter) -> None:
        self._calls = calls

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rpartition("/")[2] or details.method
        return _counted(handler, lambda code: self._calls.labels(method, code).inc())


def _code(context: Context, failed: BaseException | None) -> str:
    """The call's status: the one the servicer set (``abort`` sets it), else from how it ended."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if failed is None:
        return grpc.StatusCode.OK.name
    if isinstance(failed, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    return grpc.StatusCode.UNKNOWN.name


def _counted(
    handler: grpc.RpcMethodHandler[Any, Any], count: Callable[[str], None]
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that calls ``count(code)`` once per call."""
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    # The stubs type handlers' behaviours as synchronous; on grpc.aio they are coroutines or
    # async generators, hence Any.
    def unary(inner: Any) -> Callable[[Any, Context], Awaitable[Any]]:
        async def behaviour(request: Any, context: Context) -> Any:
            failed: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                count(_code(context, failed))

        return behaviour

    def streaming(inner: Any) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def behaviour(request: Any, context: Context) -> AsyncIterator[Any]:
            failed: BaseException | None = None
            try:
                async for response in inner(request, context):
                    yield response
            except BaseException as exc:
                failed = exc
                raise
            finally:
                count(_code(context, failed))

        return behaviour

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **codec)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **codec)
    return handler
