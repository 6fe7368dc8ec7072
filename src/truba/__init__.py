"""truba: a distributed compute scheduler for Python over RabbitMQ.

Create a job, throw tasks into it, receive one outcome per task::

    import truba

    with truba.connect("localhost:50051") as client:
        outcomes = client.create_job(handler="examples.primes:count").map(chunks)

The SDK names below are imported on first use, so that slot processes and tools importing
``truba.something`` do not pay for gRPC and AMQP imports they never need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "BlockingClient": "truba.client",
    "BlockingJob": "truba.client",
    "Client": "truba.client",
    "SubmitTimeout": "truba.client",
    "NoJournal": "truba.client",
    "CallbackFailed": "truba.client",
    "FailedPrecondition": "truba.client",
    "InvalidArgument": "truba.client",
    "Job": "truba.client",
    "NotFound": "truba.client",
    "Outcome": "truba.client",
    "SchedulerError": "truba.client",
    "TaskCancelled": "truba.client",
    "TaskFailed": "truba.client",
    "TaskGaveUp": "truba.client",
    "Unavailable": "truba.client",
    "connect": "truba.client",
    "ErrorInfo": "truba.wire",
    "batch": "truba.handlers",
    "TrubaError": "truba.errors",
}

__all__ = [
    "BlockingClient",
    "BlockingJob",
    "Client",
    "ErrorInfo",
    "SubmitTimeout",
    "NoJournal",
    "CallbackFailed",
    "FailedPrecondition",
    "InvalidArgument",
    "Job",
    "NotFound",
    "Outcome",
    "SchedulerError",
    "TaskCancelled",
    "TaskFailed",
    "TaskGaveUp",
    "TrubaError",
    "Unavailable",
    "batch",
    "connect",
]

if TYPE_CHECKING:
    from truba.client import (
        BlockingClient,
        BlockingJob,
        CallbackFailed,
        Client,
        FailedPrecondition,
        InvalidArgument,
        Job,
        NoJournal,
        NotFound,
        Outcome,
        SchedulerError,
        SubmitTimeout,
        TaskCancelled,
        TaskFailed,
        TaskGaveUp,
        Unavailable,
        connect,
    )
    from truba.errors import TrubaError
    from truba.handlers import batch
    from truba.wire import ErrorInfo


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'truba' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
