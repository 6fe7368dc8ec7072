"""Task counters per job, from the reports of clients and daemons, and the demand they imply.

The scheduler never asks brokers how long a job's queue is (synchronous AMQP
operations are a finite resource); it adds up what the two ends report instead:

- the **client** reports how many tasks it has submitted (``ReportProgress``), how many of
  them are delayed and not due yet, and CloseJob the final count;
- each **daemon** reports, in every heartbeat, per job: attempts done and failed since the
  daemon started (cumulative, so a lost heartbeat loses nothing), slots busy, deliveries
  waiting, and a moving average of a task's run time.

A daemon's numbers are kept per (job, daemon) and replaced by each report; a daemon that
restarted under the same id reports smaller numbers, and its old ones are *retired* (added to
the job's total) first. Totals are therefore exact across daemon restarts and, because the
per-daemon rows are stored, across scheduler restarts too (a daemon reconnecting to a restarted
scheduler reports the same cumulative numbers, which replace the stored row).

**Demand** is the slots a job could use now: its outstanding tasks (submitted, not finished,
not delayed past now: a delayed task is no demand until it is due), and for an open job at
least what Little's law says a steady stream needs (rate of tasks becoming runnable × service
time). A job no client has reported on since the scheduler started has unknown demand
(None): the planner treats it as unbounded until the first report.

**What a listing shows** (:meth:`JobCounters.shown`) differs from the raw sums: the daemons count
a task again when it ran again (a redelivery, a resumed client), so the shown outcomes are
capped at the tasks submitted and are never fewer than the distinct outcomes the client took; a
finished job's outcomes are exactly its tasks, and an ended job runs nothing and has no backlog.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, final

from truba.scheduler.outcome_latency import OutcomeLatencies

RATE_HALF_LIFE: Final = 5.0
"""Seconds over which the submission-rate estimate halves its memory."""
CLIENT_FRESH: Final = 15.0
"""Seconds a client's report counts towards demand (a live client reports every few seconds)."""


@dataclass(frozen=True)
class DaemonJobStats:
    """One heartbeat's numbers for one job on one daemon."""

    job_id: str
    done: int = 0
    failed: int = 0
    busy: int = 0
    waiting: int = 0
    service_time: float = 0.0


@dataclass(frozen=True)
class Counts:
    """A job's counters as GetJob shows them."""

    submitted: int
    done: int
    failed: int
    running: int
    backlog: int
    service_time: float


@dataclass
class _PerDaemon:
    done: int = 0
    failed: int = 0
    busy: int = 0
    waiting: int = 0
    service_time: float = 0.0
    connected: bool = True


@dataclass
class _JobCounters:
    submitted: int = 0
    received: int = 0
    delayed: int = 0
    """Tasks the client last said are delayed and not due yet (not stored: it reports again)."""
    reported: bool = False
    """A client reported since this scheduler started (else demand is unknown)."""
    retired_done: int = 0
    retired_failed: int = 0
    daemons: dict[str, _PerDaemon] = field(default_factory=dict)
    rate: float = 0.0
    """Submissions per second, exponentially weighted."""
    rate_at: float | None = None
    reported_at: float | None = None
    """When a client last reported (scheduler clock)."""
    done: int = field(default=0, compare=False, repr=False)
    failed: int = field(default=0, compare=False, repr=False)
    busy: int = field(default=0, compare=False, repr=False)
    waiting: int = field(default=0, compare=False, repr=False)
    """The sums of ``daemons``' rows, kept as they change (:meth:`JobCounters.daemon_report`,
    :meth:`JobCounters.daemon_lost`): a view of a 10,000-daemon job adds nothing up."""
    service_time: float | None = field(default=None, compare=False, repr=False)
    """The mean of the rows' positive service times; None: to compute again (one changed)."""

    def add_row(self, row: _PerDaemon, sign: int) -> None:
        """Adds (``sign`` 1) or takes away (-1) ``row``'s numbers from the sums."""
        self.done += sign * row.done
        self.failed += sign * row.failed
        self.busy += sign * row.busy
        self.waiting += sign * row.waiting

    def to_json(self) -> str:
        return json.dumps(
            {
                "submitted": self.submitted,
                "received": self.received,
                "retired_done": self.retired_done,
                "retired_failed": self.retired_failed,
                "daemons": {d: [s.done, s.failed] for d, s in self.daemons.items()},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> _JobCounters:
        data = json.loads(text)
        counters = cls(
            submitted=int(data.get("submitted", 0)),
            received=int(data.get("received", 0)),
            retired_done=int(data.get("retired_done", 0)),
            retired_failed=int(data.get("retired_failed", 0)),
        )
        for daemon_id, (done, failed) in data.get("daemons", {}).items():
            row = counters.daemons[str(daemon_id)] = _PerDaemon(int(done), int(failed), connected=False)
            counters.add_row(row, 1)
        return counters


@final
class JobCounters:
    """Counters of every job; :meth:`dirty` says what to store since the last :meth:`stored`."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobCounters] = {}
        self._dirty: set[str] = set()
        self.latencies = OutcomeLatencies()
        """Each runnable job's outcome latency, as its client reports it (in memory only)."""

    def _job(self, job_id: str) -> _JobCounters:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _JobCounters()
        return job

    # -- reports ---------------------------------------------------------------------------------

    def client_report(
        self, job_id: str, submitted: int, received: int, now: float, *, delayed: int = 0
    ) -> bool:
        """A client's numbers; smaller ones than already known are ignored, but for ``delayed``
        (tasks not due yet: it goes down as they fall due). True if anything changed."""
        job = self._job(job_id)
        job.reported = True
        added = submitted - job.submitted
        # The rate is of tasks becoming runnable: delayed ones count when they fall due.
        runnable = (submitted - delayed) - (job.submitted - job.delayed)
        delayed_changed = delayed != job.delayed
        job.delayed = delayed
        if job.rate_at is not None and now > job.rate_at:
            elapsed = now - job.rate_at
            decay = math.exp(-elapsed * math.log(2) / RATE_HALF_LIFE)
            job.rate = job.rate * decay + max(runnable, 0) / elapsed * (1 - decay)
        job.rate_at = now
        job.reported_at = now
        changed = added > 0 or received > job.received
        job.submitted = max(job.submitted, submitted)
        job.received = max(job.received, received)
        if changed:
            self._dirty.add(job_id)
        return changed or delayed_changed

    def daemon_report(self, daemon_id: str, stats: Iterable[DaemonJobStats]) -> set[str]:
        """A daemon's heartbeat numbers; returns the ids of jobs whose counts changed."""
        changed: set[str] = set()
        for report in stats:
            job = self._job(report.job_id)
            row = job.daemons.get(daemon_id)
            if row is None:
                row = job.daemons[daemon_id] = _PerDaemon()
            job.add_row(row, -1)
            if report.done < row.done or report.failed < row.failed:
                # The daemon restarted under the same id: its counting began again at zero.
                job.retired_done += row.done
                job.retired_failed += row.failed
                row.done = row.failed = 0
            before = (row.done, row.failed, row.busy, row.waiting)
            service_time = row.service_time
            row.done, row.failed = report.done, report.failed
            row.busy, row.waiting = report.busy, report.waiting
            row.service_time = report.service_time or row.service_time
            row.connected = True
            job.add_row(row, 1)
            if row.service_time != service_time:
                job.service_time = None
            if (row.done, row.failed, row.busy, row.waiting) != before:
                changed.add(report.job_id)
                self._dirty.add(report.job_id)
        return changed

    def daemon_lost(self, daemon_id: str) -> set[str]:
        """The daemon is gone: what it ran goes back to the queues. Returns the jobs affected."""
        affected = set()
        for job_id, job in self._jobs.items():
            row = job.daemons.get(daemon_id)
            if row is not None and row.connected:
                job.add_row(row, -1)
                row.busy = row.waiting = 0
                job.add_row(row, 1)
                row.connected = False
                affected.add(job_id)
        return affected

    # -- views -----------------------------------------------------------------------------------

    def counts(self, job_id: str, closed_submitted: int = 0) -> Counts:
        """The job's counts; ``closed_submitted`` is the count CloseJob recorded (0 while open)."""
        return _counts(self._jobs.get(job_id) or _JobCounters(), closed_submitted)

    def demand(
        self, job_id: str, *, closed_submitted: int | None = None, now: float | None = None
    ) -> int | None:
        """Slots the job could use now; None when unknown (no client report, job still open).

        The daemons' counts say how many tasks are finished, but count a task twice when it ran
        twice (its daemon died after its result went out, or a resumed client sent it again) and
        count every failed attempt: they can only under-estimate what is left. The client's
        count of distinct outcomes taken (``received``) can only over-estimate it (outcomes not
        taken yet), often by far (a client that reads outcomes only after submitting them all).
        So the daemons' view stands until it says nothing is left; then, while the client
        reports (within :data:`CLIENT_FRESH` seconds of ``now``) outcomes still to come, the job
        keeps the slots that run or wait for its tasks, plus one: it grows a slot a heartbeat
        while there is work, and holds one idle slot at most while its client is slow to take
        outcomes. Duplicates can so never starve a job of its last tasks.

        Args:
            closed_submitted: the final task count if the job is closed, else None.
            now: the scheduler clock, to judge the client's report fresh (None: it is).
        """
        job = self._jobs.get(job_id)
        if closed_submitted is None and (job is None or not job.reported):
            return None
        counts = self.counts(job_id, closed_submitted or 0)
        delayed = job.delayed if job is not None and _fresh(job.reported_at, now) else 0
        outstanding = max(0, counts.submitted - counts.done - counts.failed - delayed)
        if closed_submitted is None and job is not None and counts.service_time > 0:
            outstanding = max(outstanding, math.ceil(job.rate * counts.service_time))
        if (
            outstanding == 0
            and job is not None
            and _fresh(job.reported_at, now)
            and counts.submitted - delayed > job.received
        ):
            # Tasks are left, but not how many: keep what runs or waits, and probe for one more.
            waiting = job.waiting
            outstanding = min(counts.submitted - delayed - job.received, counts.running + waiting + 1)
        return outstanding

    def shown(
        self, job_id: str, closed_submitted: int = 0, *, ended: bool = False, all_outcomes: bool = False
    ) -> Counts:
        """The counts ListJobs, GetJob and WatchJob show: outcomes counted once per task.

        ``done + failed`` is the number of tasks with an outcome: at most ``submitted`` (duplicate
        runs are not counted again), at least what the client has taken; ``failed`` is the
        daemons' count of error outcomes, bounded by that. An ended job has nothing running and
        no backlog.

        Args:
            closed_submitted: the count CloseJob recorded (0 while open).
            ended: the job finished or was cancelled.
            all_outcomes: the client took every outcome of a closed job (it finished): the
                outcomes are exactly the tasks submitted.
        """
        job = self._jobs.get(job_id) or _JobCounters()
        raw = _counts(job, closed_submitted)
        submitted = raw.submitted
        if all_outcomes:
            outcomes = submitted
        else:
            outcomes = min(submitted, max(job.received, raw.done + raw.failed))
        failed = min(raw.failed, outcomes)
        running = 0 if ended else min(raw.running, submitted - outcomes)
        return Counts(
            submitted=submitted,
            done=outcomes - failed,
            failed=failed,
            running=running,
            backlog=0 if ended else submitted - outcomes - running,
            service_time=raw.service_time,
        )

    # -- persistence -----------------------------------------------------------------------------

    def dirty(self) -> dict[str, str]:
        """JSON of every job changed since the last :meth:`stored`."""
        return {job_id: self._jobs[job_id].to_json() for job_id in self._dirty if job_id in self._jobs}

    def stored(self, job_ids: Iterable[str]) -> None:
        self._dirty.difference_update(job_ids)

    def restore(self, stored: Mapping[str, str]) -> None:
        """Loads stored counters (job id -> JSON), at startup."""
        for job_id, text in stored.items():
            self._jobs[job_id] = _JobCounters.from_json(text)


def _fresh(reported_at: float | None, now: float | None) -> bool:
    """A client report recent enough to count (``now`` None: any report is)."""
    return reported_at is not None and (now is None or now - reported_at <= CLIENT_FRESH)


def stored_counts(text: str, closed_submitted: int) -> Counts:
    """Counts of an ended job from its stored JSON (ended jobs have no live counters)."""
    return _counts(_JobCounters.from_json(text), closed_submitted)


def _counts(job: _JobCounters, closed_submitted: int) -> Counts:
    submitted = max(job.submitted, closed_submitted)
    done = job.retired_done + job.done
    failed = job.retired_failed + job.failed
    running = job.busy
    if job.service_time is None:
        times = [d.service_time for d in job.daemons.values() if d.service_time > 0]
        job.service_time = sum(times) / len(times) if times else 0.0
    return Counts(
        submitted=submitted,
        done=done,
        failed=failed,
        running=running,
        backlog=max(0, submitted - done - failed - running),
        service_time=job.service_time,
    )
