"""A job's progress reports to the scheduler: how many tasks were submitted, how many
outcomes taken, and how many delayed tasks are not due yet, which the scheduler sizes the job's
share by; and the outcomes taken by latency (:attr:`ProgressReporter.latency`, filled by the
result stream), which the scheduler exports.

Every submit and every outcome taken pokes the reporter (:meth:`ProgressReporter.poke`: a flag,
nothing more on the hot path); one background task coalesces the pokes into at most one
ReportProgress every :data:`PROGRESS_INTERVAL` seconds, and says an unchanged progress again
every :data:`PROGRESS_KEEPALIVE` seconds (the scheduler counts a report only while it is
recent). An unreachable scheduler only delays the report; a job the scheduler says has ended
stops the reporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, final

from truba.client.errors import SchedulerError, Unavailable, map_rpc_errors
from truba.latency import LatencyCounts
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

PROGRESS_INTERVAL: Final = 0.25
"""Seconds between progress reports to the scheduler at most (they feed the job's demand)."""
PROGRESS_KEEPALIVE: Final = 5.0
"""Seconds after which an unchanged progress is reported again: the scheduler counts a client's
report towards the job's demand only while it is recent."""


@final
class ProgressReporter:
    """Reports ``counts()`` (submitted, received, delayed) of job ``job_id``, coalesced; see the module."""

    def __init__(
        self,
        jobs: jobs_pb2_grpc.JobServiceAsyncStub,
        job_id: str,
        counts: Callable[[], tuple[int, int, int]],
        *,
        interval: float = PROGRESS_INTERVAL,
        keepalive: float = PROGRESS_KEEPALIVE,
    ) -> None:
        self._jobs = jobs
        self._job_id = job_id
        self._counts = counts
        self._interval = interval
        self._keepalive = keepalive
        self.latency = LatencyCounts()
        """The outcomes taken so far by latency (cumulative: sent whole with every report)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        """The reporter, started by the first poke; once stopped, never started again."""

    def poke(self) -> None:
        """Submitted, received or delayed changed: the scheduler hears of it soon."""
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"progress-{self._job_id}")

    async def stop(self) -> None:
        """Stops reporting for good (the job ended here, or was left to a later resume)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        last = (-1, -1, -1)
        while True:
            keepalive = False
            try:
                async with asyncio.timeout(self._keepalive):
                    await self._wake.wait()
            except TimeoutError:
                keepalive = True  # unchanged, but said again: the scheduler trusts recent reports
            self._wake.clear()
            now = self._counts()
            if now != last or keepalive:
                submitted, received, delayed = now
                latency = jobs_pb2.OutcomeLatency(counts=self.latency.counts, sum=self.latency.sum)
                request = jobs_pb2.ReportProgressRequest(
                    job_id=self._job_id,
                    submitted=submitted,
                    received=received,
                    delayed=delayed,
                    latency=latency,
                )
                try:
                    with map_rpc_errors():  # bounded: a scheduler that never answers only delays it
                        await self._jobs.ReportProgress(request, timeout=self._keepalive)
                    last = now
                except Unavailable as exc:
                    log.debug(
                        "client.progress.unreachable", extra={"job_id": self._job_id, "error": str(exc)}
                    )
                    self._wake.set()
                except SchedulerError as exc:  # the job ended: nothing left to report
                    log.debug("client.progress.stopped", extra={"job_id": self._job_id, "error": str(exc)})
                    return
            await asyncio.sleep(self._interval)
