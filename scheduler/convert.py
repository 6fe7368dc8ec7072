"""Conversions from the scheduler's records to ``truba.v1`` messages, in one place."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from truba.proto.v1 import common_pb2, daemons_pb2, jobs_pb2
from truba.scheduler.brokers import BrokerInfo
from truba.scheduler.model import Job, JobQueues, JobState

_STATES: Final = {
    JobState.OPEN: jobs_pb2.JOB_STATE_OPEN,
    JobState.CLOSED: jobs_pb2.JOB_STATE_CLOSED,
    JobState.FINISHED: jobs_pb2.JOB_STATE_FINISHED,
    JobState.CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
}


def queues_pb(queues: JobQueues) -> common_pb2.JobQueues:
    return common_pb2.JobQueues(tasks=queues.tasks, results=queues.results, dead=queues.dead)


def brokers_pb(brokers: Iterable[BrokerInfo]) -> list[common_pb2.Broker]:
    return [common_pb2.Broker(url=b.url, name=b.name) for b in brokers]


def job_pb(job: Job, *, assigned_slots: int, problem: str) -> jobs_pb2.Job:
    """``job`` as the API shows it; ``problem`` is used when the job has no stored problem."""
    return jobs_pb2.Job(
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


def assignment_pb(version: int, slots: dict[str, int], jobs: dict[str, Job]) -> daemons_pb2.SchedulerMessage:
    """An Assignment message: ``slots`` (job id -> slots) with each job's handler and queues."""
    return daemons_pb2.SchedulerMessage(
        assignment=daemons_pb2.Assignment(
            version=version,
            jobs=[
                daemons_pb2.JobSlots(
                    job_id=job_id,
                    handler=jobs[job_id].handler,
                    slots=n,
                    queues=queues_pb(jobs[job_id].queues),
                )
                for job_id, n in slots.items()
            ],
        )
    )


def welcome_pb(brokers: Iterable[BrokerInfo], heartbeat_interval: float) -> daemons_pb2.SchedulerMessage:
    return daemons_pb2.SchedulerMessage(
        welcome=daemons_pb2.Welcome(brokers=brokers_pb(brokers), heartbeat_interval=heartbeat_interval)
    )
