"""Errors the client raises for answers of the scheduler, translated from gRPC in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc

from truba.errors import TrubaError


class SchedulerError(TrubaError):
    """The scheduler refused a request; ``code`` is the gRPC status name."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class InvalidArgument(SchedulerError, ValueError):
    """A request argument is invalid; ``details`` starts with the field name."""


class NotFound(SchedulerError, LookupError):
    """No such job."""


class FailedPrecondition(SchedulerError):
    """The request cannot be served in the current state (e.g. no daemon allows the handler)."""


class Unavailable(SchedulerError, ConnectionError):
    """The scheduler, or every broker, could not be reached within the client's
    ``unavailable_after`` seconds (``code`` is ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``)."""


_BY_CODE: dict[grpc.StatusCode, type[SchedulerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,  # no answer in time: as good as unreachable
}


@contextlib.contextmanager
def map_rpc_errors() -> Iterator[None]:
    """Translates ``grpc.aio.AioRpcError`` into :class:`SchedulerError` subclasses."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        cls = _BY_CODE.get(exc.code(), SchedulerError)
        raise cls(exc.code().name, exc.details() or "") from exc


class NoJournal(TrubaError, LookupError):
    """There is no journal to resume a job from (none kept, or none for that job here)."""
