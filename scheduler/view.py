"""What the scheduler knows right now, as the API shows it: jobs and daemons as protobuf messages.

One read model for every face of the scheduler: the gRPC servicers, the HTTP API and dashboard,
and the Prometheus collector all show the same numbers, built here from the job lifecycle (jobs
and their counters) and the assigner (slots, fair shares, problems, connected daemons).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import final

from truba.latency import LatencyCounts
from truba.proto.v1 import daemons_pb2, jobs_pb2
from truba.scheduler.assigner import Assigner
from truba.scheduler.convert import job_pb
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.model import Job, JobState
from truba.scheduler.registry import DaemonSession
from truba.scheduler.running import running_json, running_pb


@final
class ClusterView:
    """Jobs and daemons as ``truba.v1`` messages, built on demand (nothing is cached)."""

    def __init__(
        self, lifecycle: JobLifecycle, assigner: Assigner, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._jobs = lifecycle
        self._assigner = assigner
        self._clock = clock

    def job(self, job_id: str) -> jobs_pb2.Job:
        """One job; raises :class:`~truba.scheduler.errors.NotFound` for an unknown id."""
        return self.job_pb(self._jobs.get(job_id))

    def jobs(self, *, include_done: bool = False) -> list[jobs_pb2.Job]:
        """Runnable jobs (and ended ones with ``include_done``), oldest first."""
        return [self.job_pb(job) for job in self._jobs.list(include_done=include_done)]

    def job_pb(self, job: Job) -> jobs_pb2.Job:
        """``job`` with its live slots, fair share, counts and problem."""
        closed = job.submitted if job.state is not JobState.OPEN else 0
        counts = self._jobs.counters.shown(
            job.id,
            closed,
            ended=not job.runnable,
            all_outcomes=job.state is JobState.FINISHED and job.closed_at is not None,
        )
        shown = job_pb(
            job,
            assigned_slots=self._assigner.slots_of(job.id),
            problem=self._assigner.problem_of(job),
            counts=counts,
            fair_share=self._assigner.fair_share_of(job.id),
        )
        latency = self.latency(job.id)
        if latency is not None and latency.count:
            shown.counts.outcome_latency_p50 = latency.quantile(0.5) or 0.0
            shown.counts.outcome_latency_p99 = latency.quantile(0.99) or 0.0
        return shown

    def latency(self, job_id: str) -> LatencyCounts | None:
        """The runnable job's outcomes by latency, as its client reported them (None: none yet)."""
        return self._jobs.counters.latencies.of(job_id)

    def running(self, job_id: str, limit: int = 0) -> jobs_pb2.ListRunningResponse:
        """The job's task attempts in progress (:mod:`truba.scheduler.running`); raises
        :class:`~truba.scheduler.errors.NotFound` for an unknown id."""
        return running_pb(self._assigner.sessions(), self._jobs.get(job_id).id, limit)

    def running_json(self, job_id: str, limit: int = 0) -> dict[str, object]:
        """The same as :meth:`running`, as the HTTP API's JSON."""
        return running_json(self._assigner.sessions(), self._jobs.get(job_id).id, limit)

    def daemons(self) -> list[daemons_pb2.DaemonInfo]:
        """Connected daemons, by id."""
        sessions = sorted(self._assigner.sessions(), key=lambda s: s.daemon_id)
        return [daemon_pb(session, self._clock) for session in sessions]


def daemon_pb(session: DaemonSession, clock: Callable[[], float] = time.monotonic) -> daemons_pb2.DaemonInfo:
    """A connected daemon: its slots, what it holds, its last heartbeat's counters (``clock`` is
    the one its ``last_seen`` was read on)."""
    info = session.info
    age = clock() - session.last_seen
    return daemons_pb2.DaemonInfo(
        daemon_id=info.daemon_id,
        hostname=info.hostname,
        pid=info.pid,
        slots=info.slots,
        allow=info.allow,
        version=info.version,
        assigned=[daemons_pb2.JobSlots(job_id=j, slots=n) for j, n in session.held.items()],
        stats=session.stats,
        draining=session.draining,
        last_seen=time.time() - age,
    )
