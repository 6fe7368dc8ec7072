"""A job's life on this client: where it is (:class:`JobStatus`) and its calls to the scheduler
(:class:`JobCalls`: close, finish, cancel, importance, watch, info, running).

The calls go through the JobService stub the client hands in (never through the client itself);
gRPC errors come out as :mod:`truba.client.errors`. Each is bounded by the client's
:class:`~truba.client.reach.Reach`: while the scheduler is unreachable (it may be restarting) a
call is tried again, for at most the client's ``unavailable_after`` seconds, then raises
Unavailable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Final, final

from truba.client.errors import Unavailable, map_rpc_errors
from truba.client.reach import Reach
from truba.client.running import RunningTasks, read_running
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

_OPEN: Final = (jobs_pb2.JOB_STATE_UNSPECIFIED, jobs_pb2.JOB_STATE_OPEN)
WATCH_REOPENS: Final = 3
"""WatchJob streams opened again in a row without an event before the watch gives up."""


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

    def __init__(self, jobs: jobs_pb2_grpc.JobServiceAsyncStub, info: jobs_pb2.Job, *, reach: Reach) -> None:
        self._jobs = jobs
        self.info = info
        self._reach = reach

    @property
    def job_id(self) -> str:
        return self.info.id

    async def close(self, submitted: int) -> jobs_pb2.Job:
        """CloseJob: no more tasks than ``submitted``."""
        request = jobs_pb2.CloseJobRequest(job_id=self.job_id, submitted=submitted)
        self.info = await self._reach.call("CloseJob", lambda t: self._jobs.CloseJob(request, timeout=t))
        return self.info

    async def finish(self) -> jobs_pb2.Job:
        """FinishJob: the scheduler deletes the job's queues."""
        request = jobs_pb2.FinishJobRequest(job_id=self.job_id)
        self.info = await self._reach.call("FinishJob", lambda t: self._jobs.FinishJob(request, timeout=t))
        return self.info

    async def cancel(self) -> jobs_pb2.Job:
        """CancelJob: the scheduler deletes the job's queues."""
        request = jobs_pb2.CancelJobRequest(job_id=self.job_id)
        self.info = await self._reach.call("CancelJob", lambda t: self._jobs.CancelJob(request, timeout=t))
        return self.info

    async def set_importance(self, importance: float) -> jobs_pb2.Job:
        """SetImportance. Raises InvalidArgument (not > 0) or FailedPrecondition (ended)."""
        request = jobs_pb2.SetImportanceRequest(job_id=self.job_id, importance=importance)
        self.info = await self._reach.call(
            "SetImportance", lambda t: self._jobs.SetImportance(request, timeout=t)
        )
        return self.info

    async def get(self, *, patience: bool = True) -> jobs_pb2.Job:
        """GetJob: the scheduler's current view of the job (one try only without ``patience``)."""
        request = jobs_pb2.GetJobRequest(job_id=self.job_id)
        if patience:
            self.info = await self._reach.call("GetJob", lambda t: self._jobs.GetJob(request, timeout=t))
        else:
            self.info = await self._reach.call_once("GetJob", lambda t: self._jobs.GetJob(request, timeout=t))
        return self.info

    async def running(self) -> RunningTasks:
        """ListRunning: the job's tasks running now (:mod:`truba.client.running`)."""
        return await read_running(self._reach, self._jobs, self.job_id)

    async def watch(self) -> AsyncGenerator[jobs_pb2.JobEvent, None]:
        """WatchJob: the job now, then on every change until it ends. The first event (the job
        now) comes within the client's patience, or Unavailable; later ones come when it changes.

        A stream that breaks with UNAVAILABLE (the scheduler restarted, a standby took over, or
        the address tried first is a standby) is opened again on the scheduler that answers
        GetJob, which follows the leader within the client's patience: its first event is the job
        at that moment, so the last state is never missed (states passed through meanwhile may
        be). At most :data:`WATCH_REOPENS` opens in a row without an event, then Unavailable.
        """
        failures = 0
        while True:
            try:
                async for event in self._watch_once():
                    failures = 0
                    yield event
                return
            except Unavailable as exc:
                failures += 1
                if exc.code != "UNAVAILABLE" or failures > WATCH_REOPENS:
                    raise
                log.warning(
                    "client.watch.reopen",
                    extra={"job_id": self.job_id, "error": str(exc), "attempt": failures},
                )
                await self.get()  # follows the leader (bounded by patience), or raises Unavailable

    async def _watch_once(self) -> AsyncGenerator[jobs_pb2.JobEvent, None]:
        """One WatchJob stream, its first event within the client's patience."""
        call = self._jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=self.job_id))
        events = aiter(call)
        try:
            with map_rpc_errors():
                try:
                    async with asyncio.timeout(self._reach.patience):
                        first = await anext(events)
                except TimeoutError:
                    raise Unavailable(
                        "DEADLINE_EXCEEDED",
                        f"WatchJob: no answer within {self._reach.patience:g} s",
                    ) from None
                except StopAsyncIteration:
                    return
                self.info = first.job
                yield first
                async for event in events:
                    self.info = event.job
                    yield event
        finally:
            call.cancel()
