"""The scheduler's records as ``truba.v1`` messages: settings reach clients and daemons alike."""

from __future__ import annotations

from truba.proto.v1 import common_pb2
from truba.scheduler.convert import assignment_pb, job_pb, settings_pb
from truba.scheduler.model import Job, JobSettings, JobState, Preemption, QueueType
from truba.scheduler.validate import check_settings


def _job(settings: JobSettings) -> Job:
    return Job(id="j1", handler="m:f", importance=1.0, state=JobState.OPEN, created_at=1.0, settings=settings)


def test_settings_round_trip_through_the_message() -> None:
    settings = JobSettings(
        min_slots=1,
        max_slots=4,
        preemption=Preemption.IMMEDIATE,
        task_timeout=30.0,
        max_attempts=2,
        queue_type=QueueType.CLASSIC,
        priorities=True,
        frames=False,
    )
    message = settings_pb(settings)
    assert message.no_frames and message.priorities
    assert check_settings(message, consumer_timeout=1800) == settings


def test_frames_on_is_the_message_default() -> None:
    assert settings_pb(JobSettings()) == common_pb2.JobSettings(
        preemption=common_pb2.PREEMPTION_GRACEFUL,
        max_attempts=3,
        queue_type=common_pb2.QUEUE_TYPE_QUORUM,
        backoff_initial=1.0,
        backoff_max=60.0,
    )
    assert not settings_pb(JobSettings()).no_frames


def test_frames_off_reaches_clients_and_daemons() -> None:
    job = _job(JobSettings(frames=False))
    assert job_pb(job, assigned_slots=0, problem="").settings.no_frames
    (slots,) = assignment_pb(1, {"j1": 2}, {"j1": job}).assignment.jobs
    assert slots.settings.no_frames and slots.slots == 2
    on = _job(JobSettings())
    assert not job_pb(on, assigned_slots=0, problem="").settings.no_frames
    (slots,) = assignment_pb(1, {"j1": 2}, {"j1": on}).assignment.jobs
    assert not slots.settings.no_frames
