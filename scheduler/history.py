"""The recent past of every job, for the dashboard's charts: its numbers sampled once a second.

The scheduler keeps no time series of its own anywhere else (Prometheus does that for anyone who
runs one); this is the short memory a dashboard needs to draw a job's last minutes the moment it
is opened: :data:`KEEP` seconds per job, kept as long after the job ended, in memory only.

Each point also has the job's outcome latency over the last :data:`LATENCY_WINDOW` seconds: the
median and 99th percentile of the outcomes its client took meanwhile, estimated from the
difference of its latency histogram (:mod:`truba.latency`) between then and now; None (``null``
in JSON) when none was taken.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from truba.latency import LatencyCounts
from truba.proto.v1 import jobs_pb2
from truba.scheduler.view import ClusterView

INTERVAL: Final = 1.0
"""Seconds between samples."""
KEEP: Final = 600.0
"""Seconds of history kept per job (and kept after the job ended)."""
LATENCY_WINDOW: Final = 5
"""Samples (seconds) a point's outcome latency is taken over."""


@dataclass(frozen=True)
class Point:
    """One job at one moment: ``at`` is Unix time; ``rate`` is attempts ended per second since
    the previous point (0 for the first); ``latency_p50`` and ``latency_p99`` are the outcome
    latency's quantiles over the last :data:`LATENCY_WINDOW` samples, seconds (None: no outcome)."""

    at: float
    submitted: int
    done: int
    failed: int
    running: int
    backlog: int
    assigned_slots: int
    fair_share: float
    task_seconds: float
    rate: float
    latency_p50: float | None = None
    latency_p99: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@final
class JobHistory:
    """Samples every runnable job of ``view`` every ``interval`` seconds; ``run()`` is the loop."""

    def __init__(
        self,
        view: ClusterView,
        *,
        interval: float = INTERVAL,
        keep: float = KEEP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._view = view
        self._interval = interval
        self._keep = keep
        self._clock = clock
        self._points: dict[str, deque[Point]] = {}
        self._latency: dict[str, deque[LatencyCounts]] = {}
        """Each job's latency histogram at its last samples (the window's start is the first)."""

    async def run(self) -> None:
        """Samples until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self._interval)

    def sample(self) -> None:
        """Adds a point for every runnable job; forgets jobs with no point in the last ``keep`` s."""
        now = self._clock()
        for job in self._view.jobs():
            self._add(job, now)
        horizon = now - self._keep
        for job_id in [j for j, points in self._points.items() if points[-1].at < horizon]:
            del self._points[job_id]
            self._latency.pop(job_id, None)

    def _add(self, job: jobs_pb2.Job, now: float) -> None:
        points = self._points.setdefault(job.id, deque(maxlen=max(2, int(self._keep / self._interval) + 1)))
        counts = job.counts
        ended = counts.done + counts.failed
        p50, p99 = self._latency_of(job.id)
        rate = 0.0
        if points:
            last = points[-1]
            seconds = now - last.at
            if seconds > 0:
                rate = max(0, ended - (last.done + last.failed)) / seconds
        points.append(
            Point(
                at=now,
                submitted=counts.submitted,
                done=counts.done,
                failed=counts.failed,
                running=counts.running,
                backlog=counts.backlog,
                assigned_slots=job.assigned_slots,
                fair_share=job.fair_share,
                task_seconds=counts.service_time,
                rate=rate,
                latency_p50=p50,
                latency_p99=p99,
            )
        )

    def _latency_of(self, job_id: str) -> tuple[float | None, float | None]:
        """The job's latency p50 and p99 over the window (its histogram is kept for the next)."""
        seen = self._latency.setdefault(job_id, deque(maxlen=LATENCY_WINDOW + 1))
        now = self._view.latency(job_id)
        if now is None:
            return None, None
        recent = now - seen[0] if seen else now
        seen.append(now.copy())
        return recent.quantile(0.5), recent.quantile(0.99)

    def of(self, job_id: str) -> list[Point]:
        """The job's points, oldest first (empty for a job never sampled or long gone)."""
        return list(self._points.get(job_id, ()))

    def all(self) -> dict[str, list[Point]]:
        """Every job's points."""
        return {job_id: list(points) for job_id, points in self._points.items()}
