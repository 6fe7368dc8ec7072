"""truba.client: the SDK: create jobs, submit tasks, take one outcome per task."""

from truba.client.blocking import BlockingClient, BlockingJob, BlockingJobHandle, BlockingSchedule, connect
from truba.client.call import CallTimeout
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
from truba.client.group import Group, GroupClosed
from truba.client.job import Job
from truba.client.job_handle import JobHandle
from truba.client.options import ClientOptions, JobOptions
from truba.client.outcome import Outcome, TaskCancelled, TaskFailed, TaskGaveUp
from truba.client.running import RunningTask, RunningTasks
from truba.client.schedule import Schedule, ScheduleRun
from truba.client.submission import SubmitTimeout

__all__ = [
    "BlockingClient",
    "BlockingJob",
    "BlockingJobHandle",
    "BlockingSchedule",
    "CallTimeout",
    "CallbackFailed",
    "Client",
    "ClientOptions",
    "DeadLetter",
    "DeadLetters",
    "DeadReason",
    "FailedPrecondition",
    "Group",
    "GroupClosed",
    "InvalidArgument",
    "Job",
    "JobHandle",
    "JobOptions",
    "NoJournal",
    "NotFound",
    "Outcome",
    "RunningTask",
    "RunningTasks",
    "Schedule",
    "ScheduleRun",
    "SchedulerError",
    "SubmitTimeout",
    "TaskCancelled",
    "TaskFailed",
    "TaskGaveUp",
    "Unavailable",
    "connect",
]
