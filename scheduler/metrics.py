"""The scheduler's Prometheus metrics: per job, per connected daemon, and of the scheduler itself.

Two kinds, in one registry per scheduler (never the process-wide default, so several schedulers
in one process, as in tests, do not mix):

- **Instruments** the scheduler updates as things happen: plan time
  (``truba_scheduler_plan_duration_seconds``), assignments pushed, gRPC calls by method and code,
  and slots taken from jobs (``truba_job_slot_revocations_total``, by reason: *preempted* while
  the job still had work for them, *released* when it had none).
- **Schedules**: runs of periodic schedules that ended, by schedule and outcome
  (``truba_schedule_runs_total``), and how late the scheduler sent each run after its due time
  (``truba_schedule_fire_lateness_seconds``).
- **State** read at each scrape from :class:`~truba.scheduler.view.ClusterView`, the same read
  model the gRPC API shows: each runnable job's importance, fair share, assigned slots, backlog,
  running tasks, outcomes, mean task time, and each connected daemon's slots and busy slots;
  and each runnable job's outcome latency (``truba_job_outcome_latency_seconds``), a histogram
  of the counts its client reports (:mod:`truba.latency`), exported as they are.

Label cardinality is bounded: jobs are labelled by id while they are runnable (a finished job's
series disappear with it; its revocation counts are forgotten then), daemons by id while
connected; never by task. Per-daemon execution metrics (task durations, slot recycles, broker
reconnects and confirms) are exported by each daemon itself (``truba daemon --metrics``): a
daemon knows them first-hand, and one scrape per daemon scales where gathering them all through
the scheduler would not.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from truba.latency import LatencyCounts
from truba.proto.v1 import daemons_pb2, jobs_pb2
from truba.scheduler.view import ClusterView

LATENESS_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds a schedule's run is sent after its due time: a few milliseconds when all is well."""
PLAN_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds: a plan of a small cluster takes well under a millisecond, 10,000 slots tens of them."""


@final
class SchedulerMetrics:
    """The scheduler's registry and the instruments its parts update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.plan_seconds = Histogram(
            "truba_scheduler_plan_duration_seconds",
            "Time to compute one plan (who gets which slots), seconds.",
            buckets=PLAN_BUCKETS,
            registry=self.registry,
        )
        self.assignments = Counter(
            "truba_scheduler_assignments",
            "Assignments pushed to daemons (one per daemon whose share changed).",
            registry=self.registry,
        )
        self.grpc_calls = Counter(
            "truba_scheduler_grpc_calls",
            "gRPC calls served, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.schedule_runs = Counter(
            "truba_schedule_runs",
            "Runs of periodic schedules that ended, by schedule and outcome (ok, error, timeout, lost).",
            ["schedule_id", "outcome"],
            registry=self.registry,
        )
        self.schedule_lateness = Histogram(
            "truba_schedule_fire_lateness_seconds",
            "How late the scheduler sent each run of a periodic schedule after its due time, seconds.",
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self._revoked: Tally[tuple[str, str]] = Tally()
        self._view: ClusterView | None = None
        self._outcomes: dict[str, set[str]] = {}

    def watch(self, view: ClusterView) -> None:
        """Reads jobs and daemons from ``view`` at every scrape."""
        if self._view is not None:
            raise RuntimeError("SchedulerMetrics already watches a view")
        self._view = view
        self.registry.register(_ClusterCollector(view, self._revoked))

    # -- the assigner's observer (truba.scheduler.assigner.PlanObserver) ---------------------------

    def planned(self, seconds: float, live_jobs: Sequence[str]) -> None:
        """A plan took ``seconds``; revocation counts of jobs no longer runnable are dropped."""
        self.plan_seconds.observe(seconds)
        live = set(live_jobs)
        for key in [key for key in self._revoked if key[0] not in live]:
            del self._revoked[key]

    def revoked(self, job_id: str, slots: int, *, preempted: bool) -> None:
        """A plan took ``slots`` slots from runnable job ``job_id``."""
        self._revoked[(job_id, "preempted" if preempted else "released")] += slots

    def pushed(self) -> None:
        """An assignment went to a daemon."""
        self.assignments.inc()

    # -- the firing loop's observer (truba.scheduler.schedule_loop.RunObserver) --------------------

    def schedule_fired(self, schedule_id: str, late: float) -> None:
        """A run was sent ``late`` seconds after its due time."""
        self.schedule_lateness.observe(max(0.0, late))

    def schedule_ended(self, schedule_id: str, outcome: str) -> None:
        """A run ended with ``outcome``."""
        self.schedule_runs.labels(schedule_id, outcome).inc()
        self._outcomes.setdefault(schedule_id, set()).add(outcome)

    def schedule_gone(self, schedule_id: str) -> None:
        """The schedule was deleted: its series go with it."""
        for outcome in self._outcomes.pop(schedule_id, ()):
            self.schedule_runs.remove(schedule_id, outcome)


@final
class _ClusterCollector(Collector):
    """Jobs and daemons as they are at scrape time."""

    def __init__(self, view: ClusterView, revoked: Mapping[tuple[str, str], int]) -> None:
        self._view = view
        self._revoked = revoked

    def describe(self) -> Iterable[Metric]:
        return [*_job_families([], {}), latency_family({}), *_daemon_families([])]

    def collect(self) -> Iterable[Metric]:
        jobs = self._view.jobs()
        latencies = {job.id: self._view.latency(job.id) for job in jobs}
        return [
            *_job_families(jobs, self._revoked),
            latency_family(latencies),
            *_daemon_families(self._view.daemons()),
        ]


def latency_family(latencies: Mapping[str, LatencyCounts | None]) -> HistogramMetricFamily:
    """``truba_job_outcome_latency_seconds`` of each job (all zero while its client reported none)."""
    family = HistogramMetricFamily(
        "truba_job_outcome_latency_seconds",
        "Seconds from a task's submission to its outcome taken by the client, as the client reports.",
        labels=["job_id"],
    )
    for job_id, latency in latencies.items():
        counts = latency or LatencyCounts()
        family.add_metric([job_id], counts.cumulative(), counts.sum)
    return family


def _job_families(jobs: list[jobs_pb2.Job], revoked: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "truba_job_info",
        "A runnable job (always 1), with its name, handler and state as labels.",
        labels=["job_id", "name", "handler", "state"],
    )
    importance = GaugeMetricFamily("truba_job_importance", "The job's importance.", labels=["job_id"])
    share = GaugeMetricFamily(
        "truba_job_fair_share_slots", "Slots the job should hold by weighted fair share.", labels=["job_id"]
    )
    assigned = GaugeMetricFamily("truba_job_assigned_slots", "Slots the job holds now.", labels=["job_id"])
    backlog = GaugeMetricFamily(
        "truba_job_backlog_tasks", "Tasks submitted and not yet run (an estimate).", labels=["job_id"]
    )
    running = GaugeMetricFamily("truba_job_running_tasks", "Tasks running on a slot now.", labels=["job_id"])
    submitted = CounterMetricFamily(
        "truba_job_submitted_tasks", "Tasks submitted, as the client reports them.", labels=["job_id"]
    )
    outcomes = CounterMetricFamily(
        "truba_job_attempts",
        "Attempts that ended with a result (ok) or an error (failed), as daemons report them.",
        labels=["job_id", "result"],
    )
    task_time = GaugeMetricFamily(
        "truba_job_task_duration_seconds",
        "Moving average of a task's run time, seconds (0 until one has finished).",
        labels=["job_id"],
    )
    revocations = CounterMetricFamily(
        "truba_job_slot_revocations",
        "Slots plans took from the job: preempted (it still had work) or released (it had none).",
        labels=["job_id", "reason"],
    )
    for job in jobs:
        state = jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
        info.add_metric([job.id, job.name, job.handler, state], 1)
        importance.add_metric([job.id], job.importance)
        share.add_metric([job.id], job.fair_share)
        assigned.add_metric([job.id], job.assigned_slots)
        counts = job.counts
        backlog.add_metric([job.id], counts.backlog)
        running.add_metric([job.id], counts.running)
        submitted.add_metric([job.id], counts.submitted)
        outcomes.add_metric([job.id, "ok"], counts.done)
        outcomes.add_metric([job.id, "failed"], counts.failed)
        task_time.add_metric([job.id], counts.service_time)
        for reason in ("preempted", "released"):
            revocations.add_metric([job.id, reason], revoked.get((job.id, reason), 0))
    yield from (info, importance, share, assigned, backlog, running, submitted, outcomes, task_time)
    yield revocations
    states = GaugeMetricFamily("truba_scheduler_jobs", "Runnable jobs, by state.", labels=["state"])
    tally = Tally(jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower() for job in jobs)
    for state in ("open", "closed"):
        states.add_metric([state], tally.get(state, 0))
    yield states


def _daemon_families(daemons: Iterable[daemons_pb2.DaemonInfo]) -> Iterator[Metric]:
    connected = GaugeMetricFamily("truba_scheduler_daemons", "Daemons connected now.")
    slots = GaugeMetricFamily("truba_daemon_slots", "A connected daemon's slots.", labels=["daemon"])
    busy = GaugeMetricFamily(
        "truba_daemon_busy_slots", "Slots running a task, per the daemon's last heartbeat.", labels=["daemon"]
    )
    draining = GaugeMetricFamily(
        "truba_daemon_draining", "1 while the daemon drains (takes no new tasks).", labels=["daemon"]
    )
    seen = GaugeMetricFamily(
        "truba_daemon_last_heartbeat_age_seconds",
        "Seconds since the daemon's last heartbeat.",
        labels=["daemon"],
    )
    count = 0
    now = time.time()
    for daemon in daemons:
        count += 1
        slots.add_metric([daemon.daemon_id], daemon.slots)
        busy.add_metric([daemon.daemon_id], sum(s.busy_slots for s in daemon.stats))
        draining.add_metric([daemon.daemon_id], 1 if daemon.draining else 0)
        seen.add_metric([daemon.daemon_id], max(0.0, now - daemon.last_seen))
    connected.add_metric([], count)
    yield from (connected, slots, busy, draining, seen)
