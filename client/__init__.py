"""truba.client: the SDK: create jobs, submit tasks, take one outcome per task."""

from truba.client.blocking import BlockingClient, BlockingJob, BlockingJobHandle, connect
from truba.client.callback import CallbackFailed
from truba.client.client import Client
from truba.client.dead_letters import DeadLetter, DeadLetters, DeadReason
from truba.client.errors import (
    FailedPrecondition,
    InvalidArgument,
    NoJournal,
    NotFound,
    SchedulerError,
    Unavailable,
)
from truba.client.job import Job
from truba.client.job_handle import JobHandle
from truba.client.options import ClientOptions, JobOptions
from truba.client.outcome import Outcome, TaskCancelled, TaskFailed, TaskGaveUp
from truba.client.submission import SubmitTimeout

__all__ = [
    "BlockingClient",
    "BlockingJob",
    "BlockingJobHandle",
    "CallbackFailed",
    "Client",
    "ClientOptions",
    "DeadLetter",
    "DeadLetters",
    "DeadReason",
    "FailedPrecondition",
    "InvalidArgument",
    "Job",
    "JobHandle",
    "JobOptions",
    "NoJournal",
    "NotFound",
    "Outcome",
    "SchedulerError",
    "SubmitTimeout",
    "TaskCancelled",
    "TaskFailed",
    "TaskGaveUp",
    "Unavailable",
    "connect",
]
