"""Each runnable job's outcome latency, from its client's progress reports.

A client counts, per latency bucket, the outcomes it took since it opened the job
(:mod:`truba.latency`; cumulative, so a lost report loses nothing) and sends them with every
``ReportProgress``; the scheduler keeps the latest. A client that opened the job again (a resume
after a crash, in another process) counts from zero: a report with any bucket smaller than
before is such a new start, and what the previous one counted is *retired* into the job's total
first, so the total only grows (as a Prometheus histogram must). Kept in memory only, while the
job runs: a restarted scheduler knows what each client counted since it opened the job.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import final

from truba.latency import BUCKETS, LatencyCounts

log = logging.getLogger(__name__)


@dataclass
class _Job:
    retired: LatencyCounts = field(default_factory=LatencyCounts)
    last: LatencyCounts = field(default_factory=LatencyCounts)


@final
class OutcomeLatencies:
    """The outcome latency histograms of the jobs whose clients reported one."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}

    def report(self, job_id: str, counts: Sequence[int], total: float) -> bool:
        """A client's cumulative counts for ``job_id``; True if they changed the job's total.

        Counts with another number of buckets (a client of another version) or a sum that is
        not a finite number of seconds are ignored.
        """
        if len(counts) != BUCKETS or not (math.isfinite(total) and total >= 0):
            log.debug("sched.latency.ignored", extra={"job_id": job_id, "buckets": len(counts), "sum": total})
            return False
        counts = list(counts)
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job()
        last = job.last.counts
        if counts == last and total == job.last.sum:
            return False
        if any(now < before for now, before in zip(counts, last, strict=True)):
            job.retired = job.retired + job.last  # a new client process counts from zero
        job.last = LatencyCounts(counts, total)
        return True

    def of(self, job_id: str) -> LatencyCounts | None:
        """The job's outcomes by latency so far (None: no client reported any)."""
        job = self._jobs.get(job_id)
        return None if job is None else job.retired + job.last

    def forget(self, job_id: str) -> None:
        """The job ended."""
        self._jobs.pop(job_id, None)
