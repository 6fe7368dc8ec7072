"""Fakes for the client's unit tests: an in-process scheduler (the JobService calls a client
makes) and a daemon that answers a job's tasks on a :class:`FakeBroker`.

``FakeScheduler`` keeps jobs in a dict and answers as the real JobService does for the calls the
client makes (CreateJob, GetJob, ListJobs, WatchJob, GetClusterInfo, ReportProgress, CloseJob,
FinishJob, CancelJob, SetImportance); finishing or cancelling a job deletes its queues on the
brokers, as the real scheduler does. It is scriptable: :meth:`FakeScheduler.fail` makes a method
answer with a gRPC error the next ``times`` calls. ``FakeDaemon`` reads task messages off the
job's task queue (unpacking frames), and publishes one result per task to the result queue,
msgpack-encoded with :class:`~truba.wire.ResultCodec`, as a daemon would.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Literal, cast

import grpc

from truba.client import Client
from truba.client.job import Job
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.fake_leaves import FakeBrokerListener, FakeBrokerSender
from truba.pipes.frame import unpack
from truba.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from truba.queues import JobQueues, job_queues, queues_of
from truba.wire import ErrorInfo, ResultCodec, ResultMessage, TaskCodec, TaskMessage

ENDED = (jobs_pb2.JOB_STATE_FINISHED, jobs_pb2.JOB_STATE_CANCELLED)


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


class FakeScheduler:
    """An in-process JobService for one test; see the module."""

    def __init__(self, brokers: Sequence[FakeBroker] = ()) -> None:
        self.brokers = list(brokers)
        self.jobs: dict[str, jobs_pb2.Job] = {}
        self.calls: list[str] = []
        """Every method called, in order (failed calls too)."""
        self.progress: list[tuple[str, int, int]] = []
        self.delayed: list[int] = []
        """The delayed count of each progress report, in order."""
        self.latencies: list[jobs_pb2.OutcomeLatency] = []
        """The outcome latency of each progress report, in order."""
        """ReportProgress calls answered: (job id, submitted, received)."""
        self._failing: dict[str, list[grpc.StatusCode]] = {}
        self.watch_hangs = False
        """WatchJob streams never answer (a scheduler that accepts and never answers)."""
        self.watch_breaks = 0
        """The next WatchJob streams that break with UNAVAILABLE after their first event (a
        scheduler killed, a leader stepping down)."""
        self.running: dict[str, jobs_pb2.ListRunningResponse] = {}
        """What ListRunning answers per job (empty, at Unix time 0, for a job not here)."""
        self._ids = itertools.count(1)

    @property
    def stub(self) -> jobs_pb2_grpc.JobServiceAsyncStub:
        """This fake, typed as the stub a Client or Job takes."""
        return cast("jobs_pb2_grpc.JobServiceAsyncStub", self)  # the class exists only in the stubs

    def fail(self, method: str, times: int = 1, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """``method``'s next ``times`` calls answer with ``code``."""
        self._failing.setdefault(method, []).extend([code] * times)

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        failing = self._failing.get(method)
        if failing:
            raise rpc_error(failing.pop(0), f"{method} failed (scripted)")

    def _job(self, job_id: str) -> jobs_pb2.Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"job {job_id}: no such job")
        return job

    def _live(self, job_id: str) -> jobs_pb2.Job:
        job = self._job(job_id)
        if job.state in ENDED:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has ended")
        return job

    def _cluster(self) -> list[common_pb2.Broker]:
        return [common_pb2.Broker(url=b.url, name=f"b{i}") for i, b in enumerate(self.brokers)]

    def queues(self, job_id: str) -> JobQueues:
        job = self._job(job_id)
        return queues_of(job.queues, job.settings)

    def _delete_queues(self, job_id: str) -> None:
        queues = self.queues(job_id)
        for broker in self.brokers:
            for name in (*queues.all(), queues.marker):
                broker.drop_queue(name)

    async def CreateJob(self, request: jobs_pb2.CreateJobRequest, **_: object) -> jobs_pb2.CreateJobResponse:
        self._enter("CreateJob")
        job_id = f"job{next(self._ids)}"
        names = job_queues(job_id)
        job = jobs_pb2.Job(
            id=job_id,
            handler=request.handler,
            importance=request.importance,
            name=request.name,
            state=jobs_pb2.JOB_STATE_OPEN,
            queues=common_pb2.JobQueues(tasks=names.tasks, results=names.results, dead=names.dead),
            settings=request.settings,
        )
        self.jobs[job_id] = job
        return jobs_pb2.CreateJobResponse(job=job, brokers=self._cluster())

    async def GetJob(self, request: jobs_pb2.GetJobRequest, **_: object) -> jobs_pb2.Job:
        self._enter("GetJob")
        return self._job(request.job_id)

    async def ListJobs(self, request: jobs_pb2.ListJobsRequest, **_: object) -> jobs_pb2.ListJobsResponse:
        self._enter("ListJobs")
        jobs = [job for job in self.jobs.values() if request.include_done or job.state not in ENDED]
        return jobs_pb2.ListJobsResponse(jobs=jobs)

    def WatchJob(self, request: jobs_pb2.WatchJobRequest, **_: object) -> FakeWatch:
        self.calls.append("WatchJob")
        return FakeWatch(self, request.job_id)

    async def GetClusterInfo(
        self, request: jobs_pb2.GetClusterInfoRequest, **_: object
    ) -> jobs_pb2.ClusterInfo:
        self._enter("GetClusterInfo")
        return jobs_pb2.ClusterInfo(brokers=self._cluster())

    async def ReportProgress(
        self, request: jobs_pb2.ReportProgressRequest, **_: object
    ) -> jobs_pb2.ReportProgressResponse:
        self._enter("ReportProgress")
        self._live(request.job_id)
        self.progress.append((request.job_id, request.submitted, request.received))
        self.delayed.append(request.delayed)
        self.latencies.append(request.latency)
        return jobs_pb2.ReportProgressResponse()

    async def CloseJob(self, request: jobs_pb2.CloseJobRequest, **_: object) -> jobs_pb2.Job:
        self._enter("CloseJob")
        job = self._live(request.job_id)
        job.state = jobs_pb2.JOB_STATE_CLOSED
        job.submitted = request.submitted
        return job

    async def FinishJob(self, request: jobs_pb2.FinishJobRequest, **_: object) -> jobs_pb2.Job:
        self._enter("FinishJob")
        job = self._live(request.job_id)
        job.state = jobs_pb2.JOB_STATE_FINISHED
        self._delete_queues(job.id)
        return job

    async def CancelJob(self, request: jobs_pb2.CancelJobRequest, **_: object) -> jobs_pb2.Job:
        self._enter("CancelJob")
        job = self._live(request.job_id)
        job.state = jobs_pb2.JOB_STATE_CANCELLED
        self._delete_queues(job.id)
        return job

    async def ListRunning(
        self, request: jobs_pb2.ListRunningRequest, **_: object
    ) -> jobs_pb2.ListRunningResponse:
        self._enter("ListRunning")
        self._job(request.job_id)
        return self.running.get(request.job_id) or jobs_pb2.ListRunningResponse(job_id=request.job_id)

    async def SetImportance(self, request: jobs_pb2.SetImportanceRequest, **_: object) -> jobs_pb2.Job:
        self._enter("SetImportance")
        if not request.importance > 0:
            raise rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "importance: must be > 0")
        job = self._live(request.job_id)
        job.importance = request.importance
        return job


class FakeWatch:
    """A WatchJob stream: the job now, then nothing more (or nothing at all while the
    scheduler's ``watch_hangs``: a scheduler that accepts and never answers)."""

    def __init__(self, scheduler: FakeScheduler, job_id: str) -> None:
        self._scheduler = scheduler
        self._job_id = job_id
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[jobs_pb2.JobEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[jobs_pb2.JobEvent]:
        scheduler = self._scheduler
        failing = scheduler._failing.get("WatchJob")
        if failing:  # fail("WatchJob"): the stream ends with that code before any event
            raise rpc_error(failing.pop(0), "WatchJob failed (scripted)")
        if scheduler.watch_hangs:
            await asyncio.Event().wait()
        yield jobs_pb2.JobEvent(job=scheduler._job(self._job_id))
        if scheduler.watch_breaks > 0:
            scheduler.watch_breaks -= 1
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "WatchJob stream broken (scripted)")

    def cancel(self) -> None:
        self.cancelled = True


Handler = Callable[[object], object]


def echo(payload: object) -> object:
    return payload


class FakeDaemon:
    """Answers the tasks of one job on one :class:`FakeBroker`: reads task messages (frames
    too), runs ``handler`` on each payload, publishes each result; see the module."""

    def __init__(self, broker: FakeBroker, queues: JobQueues, handler: Handler = echo) -> None:
        self.broker = broker
        self.queues = queues
        self.handler = handler
        self.order: Callable[[list[TaskMessage]], list[TaskMessage]] = lambda tasks: tasks
        """The order results of a batch are published in (default: the tasks' order)."""
        self.seen: list[TaskMessage] = []
        """Every task taken, in order (a task sent again shows twice)."""
        self._tasks: FakeBrokerListener | None = None
        self._results: FakeBrokerSender | None = None

    async def take(self, limit: int | None = None) -> list[TaskMessage]:
        """Takes (and acks) the task messages ready now, at most ``limit`` tasks' worth."""
        if self._tasks is None:
            spec = self.queues.spec(self.queues.tasks)
            self._tasks = await self.broker.listener(spec, prefetch=1_000_000)
        taken: list[TaskMessage] = []
        while limit is None or len(taken) < limit:
            delivery = await self._tasks.get(0.0)
            if delivery is None:
                break
            members = unpack(delivery.message)
            taken.extend(TaskCodec().decode(member) for member in members or [delivery.message])
            await delivery.ack()
        self.seen.extend(taken)
        return taken

    async def answer(self, tasks: Sequence[TaskMessage]) -> None:
        """Publishes one result per task: the handler's value, or its error."""
        if self._results is None:
            self._results = await self.broker.sender(self.queues.spec(self.queues.results))
        codec = ResultCodec()
        for task in self.order(list(tasks)):
            try:
                result = ResultMessage(task.task_id, True, self.handler(task.payload), None, "d1", 0.001)
            except Exception as exc:
                error = ErrorInfo(type(exc).__name__, str(exc), "")
                result = ResultMessage(task.task_id, False, None, error, "d1", 0.001)
            await (await self._results.send(codec.encode(result)))

    async def run(self, limit: int | None = None) -> list[TaskMessage]:
        """Takes the tasks ready now and answers them."""
        tasks = await self.take(limit)
        await self.answer(tasks)
        return tasks

    def forget_leaves(self) -> None:
        """Its leaves broke (the broker lost its data): open fresh ones next time."""
        self._tasks = None
        self._results = None


def client_for(
    scheduler: FakeScheduler, journal: Path | Literal[False] = False, *, unavailable_after: float = 60.0
) -> Client:
    """A client of ``scheduler`` reaching its brokers (by URL) through the fakes themselves."""
    by_url = {broker.url: broker for broker in scheduler.brokers}
    return Client(
        "fake:0",
        scheduler=scheduler.stub,
        brokers=lambda url: by_url[url],
        journal=journal,
        unavailable_after=unavailable_after,
    )


def daemons_for(scheduler: FakeScheduler, job: Job, handler: Handler = echo) -> list[FakeDaemon]:
    """One daemon per broker for ``job``."""
    return [FakeDaemon(broker, scheduler.queues(job.id), handler) for broker in scheduler.brokers]
