"""Conversions from the scheduler's records to ``truba.v1`` messages, in one place."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from truba.proto.v1 import common_pb2, daemons_pb2, jobs_pb2
from truba.scheduler.brokers import BrokerInfo
from truba.scheduler.counters import Counts
from truba.scheduler.model import Job, JobQueues, JobSettings, JobState, Preemption, QueueType

_STATES: Final = {
    JobState.OPEN: jobs_pb2.JOB_STATE_OPEN,
    JobState.CLOSED: jobs_pb2.JOB_STATE_CLOSED,
    JobState.FINISHED: jobs_pb2.JOB_STATE_FINISHED,
    JobState.CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
}


def queues_pb(queues: JobQueues) -> common_pb2.JobQueues:
    """The names only: a queue's type travels in the job's settings."""
    return common_pb2.JobQueues(tasks=queues.tasks, results=queues.results, dead=queues.dead)


def brokers_pb(brokers: Iterable[BrokerInfo]) -> list[common_pb2.Broker]:
    return [common_pb2.Broker(url=b.url, name=b.name) for b in brokers]


_PREEMPTION: Final = {
    Preemption.GRACEFUL: common_pb2.PREEMPTION_GRACEFUL,
    Preemption.IMMEDIATE: common_pb2.PREEMPTION_IMMEDIATE,
}
_QUEUE_TYPE: Final = {
    QueueType.QUORUM: common_pb2.QUEUE_TYPE_QUORUM,
    QueueType.CLASSIC: common_pb2.QUEUE_TYPE_CLASSIC,
}


def settings_pb(settings: JobSettings) -> common_pb2.JobSettings:
    return common_pb2.JobSettings(
        min_slots=settings.min_slots,
        max_slots=settings.max_slots or None,  # unset: no limit (an explicit 0 is refused)
        preemption=_PREEMPTION[settings.preemption],
        task_timeout=settings.task_timeout,
        max_attempts=settings.max_attempts,
        queue_type=_QUEUE_TYPE[settings.queue_type],
        priorities=settings.priorities,
        no_frames=not settings.frames,
        retry_on=settings.retry_on,
        backoff_initial=settings.backoff_initial,
        backoff_max=settings.backoff_max,
        codec="" if settings.codec == "msgpack" else settings.codec,
        preemption_grace=settings.preemption_grace,
    )


def counts_pb(counts: Counts) -> jobs_pb2.JobCounts:
    return jobs_pb2.JobCounts(
        submitted=counts.submitted,
        done=counts.done,
        failed=counts.failed,
        running=counts.running,
        backlog=counts.backlog,
        service_time=counts.service_time,
    )


def job_pb(
    job: Job, *, assigned_slots: int, problem: str, counts: Counts | None = None, fair_share: float = 0.0
) -> jobs_pb2.Job:
    """``job`` as the API shows it; ``problem`` is used when the job has no stored problem."""
    return jobs_pb2.Job(
        settings=settings_pb(job.settings),
        counts=counts_pb(counts) if counts is not None else None,
        fair_share=fair_share,
        id=job.id,
        name=job.name,
        handler=job.handler,
        importance=job.importance,
        state=_STATES[job.state],
        queues=queues_pb(job.queues),
        submitted=job.submitted,
        assigned_slots=assigned_slots,
        created_at=job.created_at,
        closed_at=job.closed_at or 0.0,
        finished_at=job.finished_at or 0.0,
        problem=job.problem or problem,
    )


def assignment_pb(
    version: int, slots: dict[str, int], jobs: dict[str, Job], heartbeat_interval: float = 0.0
) -> daemons_pb2.SchedulerMessage:
    """An Assignment message: ``slots`` (job id -> slots) with each job's handler and queues, and
    a new heartbeat interval if not 0."""
    return daemons_pb2.SchedulerMessage(
        assignment=daemons_pb2.Assignment(
            version=version,
            heartbeat_interval=heartbeat_interval,
            jobs=[
                daemons_pb2.JobSlots(
                    job_id=job_id,
                    handler=jobs[job_id].handler,
                    slots=n,
                    queues=queues_pb(jobs[job_id].queues),
                    settings=settings_pb(jobs[job_id].settings),
                )
                for job_id, n in slots.items()
            ],
        )
    )


def welcome_pb(brokers: Iterable[BrokerInfo], heartbeat_interval: float) -> daemons_pb2.SchedulerMessage:
    return daemons_pb2.SchedulerMessage(
        welcome=daemons_pb2.Welcome(brokers=brokers_pb(brokers), heartbeat_interval=heartbeat_interval)
    )
