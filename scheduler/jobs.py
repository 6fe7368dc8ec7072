"""JobService: the gRPC face of :class:`~truba.scheduler.lifecycle.JobLifecycle`.

Each method converts the request, calls the lifecycle and converts the answer. Refusals are
:class:`~truba.scheduler.errors.SchedulerError`s, turned into a status by ``reports_errors``:
INVALID_ARGUMENT with the field name first, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, TypeVar, final

import grpc.aio

from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.scheduler.assigner import Assigner
from truba.scheduler.brokers import BrokerInfo
from truba.scheduler.convert import brokers_pb
from truba.scheduler.dead_letters import DeadLetterReader
from truba.scheduler.errors import SchedulerError
from truba.scheduler.events import EventKind
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.model import Job
from truba.scheduler.timeline import TaskTimeline
from truba.scheduler.view import ClusterView

log = logging.getLogger(__name__)

_EVENT_KINDS: Final = {
    EventKind.SNAPSHOT: jobs_pb2.JOB_EVENT_KIND_SNAPSHOT,
    EventKind.STATE: jobs_pb2.JOB_EVENT_KIND_STATE,
    EventKind.SLOTS: jobs_pb2.JOB_EVENT_KIND_SLOTS,
    EventKind.IMPORTANCE: jobs_pb2.JOB_EVENT_KIND_IMPORTANCE,
    EventKind.PROGRESS: jobs_pb2.JOB_EVENT_KIND_PROGRESS,
    EventKind.DRAINED: jobs_pb2.JOB_EVENT_KIND_DRAINED,
}


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Method = Callable[[S, Req, "grpc.aio.ServicerContext[Req, Resp]"], Awaitable[Resp]]


def reports_errors(method: Method[S, Req, Resp]) -> Method[S, Req, Resp]:
    """Wraps a unary servicer method: a :class:`SchedulerError` ends the call with its status.

    Anything else is a bug (or a broken store): it is logged with its traceback and the call
    ends with INTERNAL.
    """

    @functools.wraps(method)
    async def wrapper(self: S, request: Req, context: grpc.aio.ServicerContext[Req, Resp]) -> Resp:
        try:
            return await method(self, request, context)
        except SchedulerError as exc:
            log.info(
                "sched.request.refused",
                extra={"method": method.__name__, "code": exc.code.name, "details": str(exc)},
            )
            await context.abort(exc.code, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug or a broken store: say so, keep the traceback in the log
            log.exception("sched.request.failed", extra={"method": method.__name__, "error": repr(exc)})
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return wrapper


@final
class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    """Serves ``truba.v1.JobService``."""

    def __init__(
        self,
        lifecycle: JobLifecycle,
        assigner: Assigner,
        brokers: Sequence[BrokerInfo],
        dead_letters: DeadLetterReader,
        timeline: TaskTimeline | None = None,
    ) -> None:
        self._jobs = lifecycle
        self._assigner = assigner
        self._brokers = tuple(brokers)
        self._view = ClusterView(lifecycle, assigner)
        self._dead = dead_letters
        self._timeline = timeline or TaskTimeline()

    def _pb(self, job: Job) -> jobs_pb2.Job:
        return self._view.job_pb(job)

    @reports_errors
    async def CreateJob(
        self,
        request: jobs_pb2.CreateJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.CreateJobRequest, jobs_pb2.CreateJobResponse],
    ) -> jobs_pb2.CreateJobResponse:
        settings = request.settings if request.HasField("settings") else None
        job = await self._jobs.create(request.handler, request.importance, request.name, settings)
        return jobs_pb2.CreateJobResponse(job=self._pb(job), brokers=brokers_pb(self._brokers))

    @reports_errors
    async def CloseJob(
        self,
        request: jobs_pb2.CloseJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.CloseJobRequest, jobs_pb2.Job],
    ) -> jobs_pb2.Job:
        return self._pb(self._jobs.close(request.job_id, request.submitted))

    @reports_errors
    async def FinishJob(
        self,
        request: jobs_pb2.FinishJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.FinishJobRequest, jobs_pb2.Job],
    ) -> jobs_pb2.Job:
        return self._pb(await self._jobs.finish(request.job_id))

    @reports_errors
    async def CancelJob(
        self,
        request: jobs_pb2.CancelJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.CancelJobRequest, jobs_pb2.Job],
    ) -> jobs_pb2.Job:
        return self._pb(await self._jobs.cancel(request.job_id))

    @reports_errors
    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.GetJobRequest, jobs_pb2.Job],
    ) -> jobs_pb2.Job:
        return self._pb(self._jobs.get(request.job_id))

    @reports_errors
    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ListJobsRequest, jobs_pb2.ListJobsResponse],
    ) -> jobs_pb2.ListJobsResponse:
        jobs = self._jobs.list(include_done=request.include_done)
        return jobs_pb2.ListJobsResponse(jobs=[self._pb(job) for job in jobs])

    @reports_errors
    async def SetImportance(
        self,
        request: jobs_pb2.SetImportanceRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.SetImportanceRequest, jobs_pb2.Job],
    ) -> jobs_pb2.Job:
        return self._pb(self._jobs.set_importance(request.job_id, request.importance))

    @reports_errors
    async def ReportProgress(
        self,
        request: jobs_pb2.ReportProgressRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ReportProgressRequest, jobs_pb2.ReportProgressResponse],
    ) -> jobs_pb2.ReportProgressResponse:
        latency = (request.latency.counts, request.latency.sum) if request.HasField("latency") else None
        self._jobs.report_progress(
            request.job_id, request.submitted, request.received, request.delayed, latency
        )
        return jobs_pb2.ReportProgressResponse()

    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.WatchJobRequest, jobs_pb2.JobEvent],
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """The job now (SNAPSHOT), then one event per kind of change, until the job ends."""
        try:
            job = self._jobs.get(request.job_id)
        except SchedulerError as exc:
            log.info(
                "sched.request.refused",
                extra={"method": "WatchJob", "code": exc.code.name, "details": str(exc)},
            )
            await context.abort(exc.code, str(exc))
        watch = self._jobs.events.watch(job.id)
        log.debug("sched.watch.started", extra={"job_id": job.id, "peer": context.peer()})
        try:
            yield self._event(EventKind.SNAPSHOT, job)
            if not job.runnable:
                return
            async for kinds in watch.changes():
                job = self._jobs.get(job.id)
                # A state change comes last: after the job ended, it is the stream's last event.
                for kind in sorted(kinds, key=lambda k: k is EventKind.STATE):
                    yield self._event(kind, job)
                if not job.runnable:
                    return
        finally:
            watch.close()
            log.debug("sched.watch.ended", extra={"job_id": job.id})

    def _event(self, kind: EventKind, job: Job) -> jobs_pb2.JobEvent:
        return jobs_pb2.JobEvent(kind=_EVENT_KINDS[kind], job=self._pb(job), at=time.time())

    @reports_errors
    async def GetClusterInfo(
        self,
        request: jobs_pb2.GetClusterInfoRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.GetClusterInfoRequest, jobs_pb2.ClusterInfo],
    ) -> jobs_pb2.ClusterInfo:
        return jobs_pb2.ClusterInfo(
            brokers=brokers_pb(self._brokers),
            daemons=self._assigner.daemon_count,
            slots=self._assigner.total_slots,
            heartbeats=self._assigner.heartbeats,
            assignments=self._assigner.assignments,
        )

    @reports_errors
    async def ListDeadLetters(
        self,
        request: jobs_pb2.ListDeadLettersRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ListDeadLettersRequest, jobs_pb2.ListDeadLettersResponse],
    ) -> jobs_pb2.ListDeadLettersResponse:
        job = self._jobs.get(request.job_id)
        return await self._dead.read(job, request.limit, bodies=request.bodies)

    @reports_errors
    async def RemoveDeadLetters(
        self,
        request: jobs_pb2.RemoveDeadLettersRequest,
        context: grpc.aio.ServicerContext[
            jobs_pb2.RemoveDeadLettersRequest, jobs_pb2.RemoveDeadLettersResponse
        ],
    ) -> jobs_pb2.RemoveDeadLettersResponse:
        job = self._jobs.get(request.job_id)
        return await self._dead.remove(job, request.task_ids)

    @reports_errors
    async def GetTimeline(
        self,
        request: jobs_pb2.GetTimelineRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.GetTimelineRequest, jobs_pb2.Timeline],
    ) -> jobs_pb2.Timeline:
        job = self._jobs.get(request.job_id)  # NotFound for an unknown job
        return self._timeline.timeline_pb(job.id, request.since, request.limit)

    @reports_errors
    async def ListRunning(
        self,
        request: jobs_pb2.ListRunningRequest,
        context: grpc.aio.ServicerContext[jobs_pb2.ListRunningRequest, jobs_pb2.ListRunningResponse],
    ) -> jobs_pb2.ListRunningResponse:
        return self._view.running(request.job_id, request.limit)  # NotFound for an unknown job
