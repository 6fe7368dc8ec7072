"""A job's life on this client: where it is (:class:`JobStatus`) and its calls to the scheduler
(:class:`JobCalls`: close, finish, cancel, importance, watch, info).

The calls go through the JobService stub the client hands in (never through the client itself);
gRPC errors come out as :mod:`truba.client.errors`. FinishJob is the one call retried: a job
whose outcomes are all taken keeps asking an unreachable scheduler (it may be restarting) to
delete its queues, waiting with :data:`FINISH_BACKOFF`, for at most :data:`FINISH_PATIENCE`
seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Final, final

from truba.backoff import Backoff
from truba.client.errors import Unavailable, map_rpc_errors
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

FINISH_PATIENCE: Final = 120.0
"""Seconds a finished job keeps asking an unreachable scheduler to delete its queues."""
FINISH_BACKOFF: Final = Backoff(attempts=None, base=0.2, cap=5.0)
"""Waits between FinishJob tries while the scheduler is unreachable (bounded by the patience)."""

_OPEN: Final = (jobs_pb2.JOB_STATE_UNSPECIFIED, jobs_pb2.JOB_STATE_OPEN)


@dataclass(slots=True)
class JobStatus:
    """Where a job is in its life on this client; shared by the job's parts."""

    closed: bool = False
    """No more tasks (closed here, before this client picked the job up, or cancelled)."""
    cancelled: bool = False
    """Cancelled, here or by another client: outcomes still missing become cancelled ones."""

    @classmethod
    def of(cls, info: jobs_pb2.Job) -> JobStatus:
        """The status of a job the scheduler describes as ``info``."""
        return cls(closed=info.state not in _OPEN)


@final
class JobCalls:
    """One job's calls to the scheduler; :attr:`info` is the scheduler's latest word on it."""

    def __init__(
        self,
        jobs: jobs_pb2_grpc.JobServiceAsyncStub,
        info: jobs_pb2.Job,
        *,
        backoff: Backoff = FINISH_BACKOFF,
        patience: float = FINISH_PATIENCE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._jobs = jobs
        self.info = info
        self._backoff = backoff
        self._patience = patience
        self._clock = clock

    @property
    def job_id(self) -> str:
        return self.info.id

    async def close(self, submitted: int) -> jobs_pb2.Job:
        """CloseJob: no more tasks than ``submitted``."""
        with map_rpc_errors():
            self.info = await self._jobs.CloseJob(
                jobs_pb2.CloseJobRequest(job_id=self.job_id, submitted=submitted)
            )
        return self.info

    async def finish(self) -> jobs_pb2.Job:
        """FinishJob, retried while the scheduler is unreachable for at most the patience;
        only then does the error reach the caller."""
        request = jobs_pb2.FinishJobRequest(job_id=self.job_id)
        deadline = self._clock() + self._patience
        attempt = 0
        while True:
            try:
                with map_rpc_errors():
                    self.info = await self._jobs.FinishJob(request)
                return self.info
            except Unavailable as exc:
                delay = self._backoff.delay(attempt)
                if self._backoff.gives_up_after(attempt) or self._clock() + delay > deadline:
                    raise
                log.warning(
                    "client.finish.retry", extra={"job_id": self.job_id, "error": str(exc), "retry_in": delay}
                )
                await self._backoff.sleep(delay)
                attempt += 1

    async def cancel(self) -> jobs_pb2.Job:
        """CancelJob: the scheduler deletes the job's queues."""
        with map_rpc_errors():
            self.info = await self._jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=self.job_id))
        return self.info

    async def set_importance(self, importance: float) -> jobs_pb2.Job:
        """SetImportance. Raises InvalidArgument (not > 0) or FailedPrecondition (ended)."""
        with map_rpc_errors():
            self.info = await self._jobs.SetImportance(
                jobs_pb2.SetImportanceRequest(job_id=self.job_id, importance=importance)
            )
        return self.info

    async def get(self) -> jobs_pb2.Job:
        """GetJob: the scheduler's current view of the job."""
        with map_rpc_errors():
            self.info = await self._jobs.GetJob(jobs_pb2.GetJobRequest(job_id=self.job_id))
        return self.info

    async def watch(self) -> AsyncGenerator[jobs_pb2.JobEvent, None]:
        """WatchJob: the job now, then on every change until it ends."""
        call = self._jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=self.job_id))
        try:
            with map_rpc_errors():
                async for event in call:
                    self.info = event.job
                    yield event
        finally:
            call.cancel()
