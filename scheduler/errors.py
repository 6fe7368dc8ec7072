"""Errors the scheduler reports to its callers, and their gRPC status codes.

::

    TrubaError
     └─ SchedulerError
         ├─ InvalidArgument      INVALID_ARGUMENT: a request field is malformed; the message
         │                       starts with the field name ("handler: must look like ...")
         ├─ NotFound             NOT_FOUND: no job with that id
         ├─ FailedPrecondition   FAILED_PRECONDITION: the job's state or the cluster forbids it
         ├─ Unavailable          UNAVAILABLE: a broker could not be reached; retrying may help
         │   └─ StoreUnavailable UNAVAILABLE: the store's database is unreachable or too slow
         └─ StoreTooNew          FAILED_PRECONDITION: the store was written by a newer truba

The scheduler's core raises these; the servicers translate them into a status once, with
``reports_errors`` in :mod:`truba.scheduler.jobs` (the daemon stream reports its own).
"""

from __future__ import annotations

from typing import ClassVar

import grpc

from truba.errors import TrubaError


class SchedulerError(TrubaError):
    """A request the scheduler refuses; ``str(exc)`` is the status details sent to the caller."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL


class InvalidArgument(SchedulerError):
    """A request field is malformed."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(SchedulerError):
    """The job does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SchedulerError):
    """The job's state (or the cluster) does not allow the operation."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(SchedulerError):
    """A dependency (a broker) is unreachable; the operation had no effect and may be retried."""

    code = grpc.StatusCode.UNAVAILABLE


class StoreUnavailable(Unavailable):
    """The store's database cannot be reached, or did not answer within its timeout.

    A write that fails this way had no effect, unless the connection broke during its commit:
    then it may have been committed, and reading it back tells.
    """


class StoreTooNew(SchedulerError):
    """The store's schema was written by a newer truba: this one refuses to start on it."""

    code = grpc.StatusCode.FAILED_PRECONDITION
