"""A job's recent past for the dashboard: sampled points, rates, and forgetting."""

from __future__ import annotations

from typing import cast

from truba.proto.v1 import jobs_pb2
from truba.scheduler.history import JobHistory
from truba.scheduler.view import ClusterView


class Jobs:
    """A stand-in for ClusterView.jobs(): the jobs given, as they are now."""

    def __init__(self) -> None:
        self.now: list[jobs_pb2.Job] = []

    def jobs(self) -> list[jobs_pb2.Job]:
        return self.now


def job(job_id: str, done: int, failed: int = 0, backlog: int = 0) -> jobs_pb2.Job:
    counts = jobs_pb2.JobCounts(submitted=done + failed + backlog, done=done, failed=failed, backlog=backlog)
    return jobs_pb2.Job(id=job_id, counts=counts, assigned_slots=2, fair_share=2.5)


def test_points_carry_the_rate_of_ended_attempts_since_the_previous_one() -> None:
    jobs, clock = Jobs(), [100.0]
    history = JobHistory(cast(ClusterView, jobs), keep=10, clock=lambda: clock[0])
    jobs.now = [job("a", done=0, backlog=10)]
    history.sample()
    clock[0] = 102.0
    jobs.now = [job("a", done=6, failed=2, backlog=2)]
    history.sample()
    points = history.of("a")
    assert [p.rate for p in points] == [0.0, 4.0]
    assert (points[-1].done, points[-1].failed, points[-1].backlog) == (6, 2, 2)
    assert (points[-1].assigned_slots, points[-1].fair_share) == (2, 2.5)
    assert set(points[-1].to_json()) >= {"at", "rate", "backlog", "assigned_slots"}


def test_an_ended_job_is_kept_for_keep_seconds_then_forgotten_and_points_are_capped() -> None:
    jobs, clock = Jobs(), [0.0]
    history = JobHistory(cast(ClusterView, jobs), interval=1.0, keep=5.0, clock=lambda: clock[0])
    jobs.now = [job("a", done=1)]
    for second in range(10):
        clock[0] = float(second)
        history.sample()
    assert len(history.of("a")) == 6  # keep / interval + 1
    jobs.now = []  # the job ended
    clock[0] = 14.0
    history.sample()
    assert history.of("a") != []
    clock[0] = 15.0
    history.sample()
    assert history.of("a") == [] and history.all() == {}
