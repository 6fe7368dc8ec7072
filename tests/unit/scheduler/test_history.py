"""A job's recent past for the dashboard: sampled points, rates, and forgetting."""

from __future__ import annotations

from typing import cast

from truba.latency import LatencyCounts
from truba.proto.v1 import jobs_pb2
from truba.scheduler.history import LATENCY_WINDOW, JobHistory
from truba.scheduler.view import ClusterView


class Jobs:
    """A stand-in for ClusterView.jobs(): the jobs given, as they are now."""

    def __init__(self) -> None:
        self.now: list[jobs_pb2.Job] = []
        self.latencies: dict[str, LatencyCounts] = {}

    def jobs(self) -> list[jobs_pb2.Job]:
        return self.now

    def latency(self, job_id: str) -> LatencyCounts | None:
        found = self.latencies.get(job_id)
        return None if found is None else found.copy()


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


def test_points_carry_the_outcome_latency_of_the_last_seconds() -> None:
    jobs, clock = Jobs(), [0.0]
    history = JobHistory(cast(ClusterView, jobs), interval=1.0, keep=60.0, clock=lambda: clock[0])
    jobs.now = [job("a", done=0, backlog=10)]
    history.sample()  # no client report yet: no latency
    assert (history.of("a")[-1].latency_p50, history.of("a")[-1].latency_p99) == (None, None)
    counts = LatencyCounts()
    jobs.latencies["a"] = counts
    for _ in range(100):
        counts.observe(2.0)  # slow ones first: in (1, 2.5]
    clock[0] = 1.0
    history.sample()
    p50 = history.of("a")[-1].latency_p50
    assert p50 is not None and 1.0 < p50 <= 2.5
    for second in range(2, 2 + LATENCY_WINDOW + 1):  # then fast ones only, for a whole window
        for _ in range(100):
            counts.observe(0.003)
        clock[0] = float(second)
        history.sample()
    last = history.of("a")[-1]
    assert last.latency_p99 is not None and last.latency_p99 <= 0.005  # the slow ones left the window
    clock[0] += 1
    history.sample()  # no outcome in the window
    assert history.of("a")[-1].to_json()["latency_p50"] is not None
    for _ in range(LATENCY_WINDOW):
        clock[0] += 1
        history.sample()
    assert history.of("a")[-1].to_json()["latency_p50"] is None
