"""truba.client: the SDK: create jobs, submit tasks, take one outcome per task."""

from truba.client.blocking import BlockingClient, BlockingJob, connect
from truba.client.client import Client
from truba.client.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SchedulerError,
    Unavailable,
)
from truba.client.job import Job
from truba.client.options import JobOptions
from truba.client.outcome import Outcome, TaskCancelled, TaskFailed, TaskGaveUp

__all__ = [
    "BlockingClient",
    "BlockingJob",
    "Client",
    "FailedPrecondition",
    "InvalidArgument",
    "Job",
    "JobOptions",
    "NotFound",
    "Outcome",
    "SchedulerError",
    "TaskCancelled",
    "TaskFailed",
    "TaskGaveUp",
    "Unavailable",
    "connect",
]
