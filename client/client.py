"""The async client: a connection to the scheduler and, through it, to the brokers.

::

    async with truba.Client("localhost:50051") as client:
        job = await client.create_job(handler="examples.primes:count", importance=1.0)
        for chunk in chunks:
            await job.submit(chunk)
        await job.close()
        async for outcome in job.results():
            ...

A client needs only the scheduler's address: the scheduler hands out the broker list.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Unpack, overload

import grpc.aio

from truba.channel import Credentials, open_channel
from truba.client.encoded import DelayedTaskCodec, EncodedTask, EncodedTaskCodec
from truba.client.errors import NoJournal, NotFound, map_rpc_errors
from truba.client.framing import FrameSizer
from truba.client.handler_name import handler_name
from truba.client.interrupt import left_running
from truba.client.job import Job, P
from truba.client.job_handle import JobHandle, check_job_id, drop_journal
from truba.client.journal import Journal, MemoryJournal, TaskJournal
from truba.client.notices import quiet_by_default
from truba.client.options import JOB_OPTIONS, JobOptions, check_importance, check_names, settings_pb
from truba.client.outcome import R
from truba.client.outcome_codec import OutcomeCodec
from truba.client.reach import ONCE_TIMEOUT, UNAVAILABLE_AFTER, Reach
from truba.client.schedule import ScheduleCalls
from truba.client.wiring import default_brokers
from truba.pipes.base import Codec, Sender
from truba.pipes.broker import Broker, BrokerFactory
from truba.pipes.frame import FrameLimits
from truba.pipes.fsync import FsyncPolicy, check_policy
from truba.pipes.prefetch import Window
from truba.pipes.route import RouteSender
from truba.pipes.stacks import DEFAULT_MAX_MESSAGE_SIZE, SendOptions, listen_stack, send_stack
from truba.proto.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from truba.queues import queues_of

log = logging.getLogger(__name__)
CREATE_JOB_ARGUMENTS: Final = JOB_OPTIONS | {"handler", "importance", "name"}
"""What ``create_job`` takes by keyword: a misspelt one is refused naming the nearest."""


class Client(ScheduleCalls):
    """Creates and drives jobs (and schedules: :class:`~truba.client.schedule.ScheduleCalls`).
    Use as ``async with Client(address) as client``."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        max_unconfirmed: int = 1000,
        result_prefetch: int = 1000,
        max_payload: int = DEFAULT_MAX_MESSAGE_SIZE,
        broker_heartbeat: float = 10.0,
        journal: str | os.PathLike[str] | Literal[False] | None = None,
        journal_fsync: FsyncPolicy = "interval",
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        brokers: BrokerFactory | None = None,
        scheduler: jobs_pb2_grpc.JobServiceAsyncStub | None = None,
        unavailable_after: float = UNAVAILABLE_AFTER,
    ) -> None:
        """A client of the scheduler at ``address``.

        Args:
            max_unconfirmed: tasks awaiting a broker confirm, per broker (backpressure beyond).
            result_prefetch: results a broker may push before they are taken, per broker.
            max_payload: bytes a task may take encoded; ``submit`` refuses a bigger one with
                MessageTooLarge before anything is sent (default 16 MiB).
            journal: where each job's tasks wait on disk until their outcomes are taken, one
                folder per job (default ``$XDG_STATE_HOME/truba/journal``); :meth:`resume`
                picks a job up from there after a crash. ``False`` keeps tasks in memory only.
            journal_fsync: when a submitted task is durable, see :mod:`truba.pipes.fsync`
                (default ``"interval"``: within 10 ms, without waiting for it).
            token: the scheduler's bearer token (default: ``$TRUBA_TOKEN``).
            tls_ca: PEM file to verify the scheduler's TLS certificate with (default:
                ``$TRUBA_TLS_CA``); without it the channel is plaintext.
            brokers: opens the link to each broker the scheduler lists (default: RabbitMQ;
                :class:`truba.pipes.testing.FakeBroker` in tests).
            scheduler: the JobService to call (default: a gRPC stub on a channel to ``address``;
                an in-process fake in tests).
            unavailable_after: seconds any wait that needs the cluster lasts at most while the
                scheduler, or every broker, is unreachable; then it raises Unavailable (the
                job goes on in the cluster: resume it later). Default 60.
        """
        quiet_by_default()
        self._credentials = Credentials.from_env(token, tls_ca)
        self.address = address
        self._reach = Reach(unavailable_after, scheduler=address, electing=self._electing)
        self._journal_root = None if journal is False else Path(journal or default_journal_dir())
        self._journal_fsync = check_policy(journal_fsync)
        self._max_unconfirmed = max_unconfirmed
        self._result_prefetch = result_prefetch
        if max_payload < 1:
            raise ValueError(f"max_payload: must be at least 1 byte, got {max_payload}")
        self._max_payload = max_payload
        self._channel: grpc.aio.Channel | None = None
        self._scheduler = scheduler
        self._stub: jobs_pb2_grpc.JobServiceAsyncStub | None = None
        self._links: dict[str, Broker] = {}
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self._name = f"truba-client-{socket.gethostname()}-{os.getpid()}"
        self._open_broker = brokers or default_brokers(self._name, heartbeat=broker_heartbeat)

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Opens the gRPC channel (lazily connected; the first call reports an unreachable scheduler)."""
        if self._scheduler is not None:
            self._stub = self._scheduler
        elif self._channel is None:
            self._channel = open_channel(self.address, self._credentials)
            self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)

    def _electing(self) -> bool:
        """The channel (over several scheduler addresses) saw a standby's answer lately."""
        return bool(getattr(self._channel, "electing", False))

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceAsyncStub:
        """The raw JobService stub."""
        if self._stub is None:
            raise RuntimeError("client is not connected: use 'async with Client(...)'")
        return self._stub

    @overload
    async def create_job(
        self,
        handler: Callable[[P], R],
        importance: float = 1.0,
        *,
        name: str = "",
        **options: Unpack[JobOptions],
    ) -> Job[P, R]: ...

    @overload
    async def create_job(
        self, handler: str, importance: float = 1.0, *, name: str = "", **options: Unpack[JobOptions]
    ) -> Job: ...

    async def create_job(
        self,
        handler: str | Callable[[Any], Any],
        importance: float = 1.0,
        *,
        name: str = "",
        **options: Unpack[JobOptions],
    ) -> Job[Any, Any]:
        """Creates a job whose tasks daemons run with ``handler``: a ``"package.module:function"``
        string, or a module-level function (its name is derived: ``"module:qualname"``). A
        function's type hints type the job: ``Job[P, R]`` takes payloads of type P and its
        outcomes are ``Outcome[R]`` (a batch handler is typed by its list signature: give its
        name instead).

        Args:
            importance: the job's weight in the cluster's fair share (> 0); can change later
                with :meth:`Job.set_importance`.
            name: shown in listings.
            options: the job's settings, see :class:`~truba.client.options.JobOptions`
                (``min_slots``, ``max_slots``, ``preemption``, ``task_timeout``,
                ``max_attempts``, ``queue_type``, ``priorities``, ``frames``, ``retry_on``,
                ``backoff``, ``codec``).

        Raises:
            TypeError: an unknown option (the message names the nearest valid one).
            InvalidArgument: a bad value (checked before anything is sent, and again by the
                scheduler; the message names the option), or a function daemons cannot import.
            FailedPrecondition: no connected daemon allows this handler.
            Unavailable: the scheduler or a broker cannot be reached.
        """
        check_names(options, CREATE_JOB_ARGUMENTS)
        settings = settings_pb(**options)
        request = jobs_pb2.CreateJobRequest(
            handler=handler_name(handler),
            importance=check_importance(importance),
            name=name,
            settings=settings,
        )
        stub = self.jobs
        response = await self._reach.call(
            "CreateJob", lambda t: stub.CreateJob(request, timeout=t), repeatable=False
        )
        job = await self._open(response.job, response.brokers, resumed=False)
        log.info("client.job.created", extra={"job_id": job.id, "handler": request.handler})
        return job

    async def resume(self, job_id: str) -> Job:
        """Picks up a job this client's journal holds, after a crash or :meth:`Job.detach`.

        Tasks no broker confirmed are sent again at once; the others are waited for (and sent
        again if their broker turns out to have lost its data). Outcomes taken before are not
        delivered again. Go on as with a new job: submit more if it is open, ``close()``, and
        take the outcomes.

        Raises:
            InvalidArgument: ``job_id`` is not a job id (checked before any path is made of it).
            NotFound: the scheduler does not know the job, or it has ended (finished or
                cancelled: its journal here, if any, is removed).
            NoJournal: this client keeps no journal, or none for this job.
            SpoolLocked: another client has the job's journal open.
            Unavailable: the scheduler did not answer within ``unavailable_after``.
        """
        check_job_id(job_id)
        if self._journal_root is None:
            raise NoJournal("resume needs a journal: this client was made with journal=False")
        folder = self.journal_path(job_id)
        info = await self.get_job_info(job_id)
        if info.state in (jobs_pb2.JOB_STATE_FINISHED, jobs_pb2.JOB_STATE_CANCELLED):
            drop_journal(folder)
            state = jobs_pb2.JobState.Name(info.state)
            raise NotFound("NOT_FOUND", f"job {job_id} has ended ({state}): nothing to resume")
        if not folder.is_dir():
            raise NoJournal(f"job {job_id}: no journal at {folder}: nothing to resume here")
        cluster = await self.cluster_info()
        job = await self._open(info, cluster.brokers, resumed=True)
        log.info(
            "client.job.resumed",
            extra={"job_id": job_id, "outstanding": job.outstanding, "submitted": job.submitted},
        )
        return job

    def job(self, job_id: str) -> JobHandle:
        """A job by id, from any process: ``info()``, ``watch()``, ``running()``,
        ``set_importance(x)``, ``cancel()``. Outcomes go only to the owner of the job's journal
        (:meth:`resume`).

        Raises:
            InvalidArgument: ``job_id`` is not a job id. (An unknown id: NotFound, at the first call.)
        """
        check_job_id(job_id)
        journal = None if self._journal_root is None else self._journal_root / job_id
        return JobHandle(self.jobs, job_id, reach=self._reach, journal=journal)

    async def _open(self, info: jobs_pb2.Job, brokers: Sequence[common_pb2.Broker], *, resumed: bool) -> Job:
        """The client's side of a job: its journal, task stacks and result listener."""
        links = [self._link(broker.url) for broker in brokers]
        # The queues' specs, so a broker that lost them (data wiped) gets them back on reconnect.
        queues = queues_of(info.queues, info.settings)
        priorities = info.settings.priorities

        def task_stack(route: tuple[int, bool]) -> Sender[EncodedTask]:
            # One stack per priority level in use: RabbitMQ reads priority from the AMQP
            # properties, so each level's leaves publish with their own. Delayed tasks have
            # stacks of their own, without frames: a frame's members would share one due time.
            priority, delayed = route
            options = SendOptions(
                max_unconfirmed=self._max_unconfirmed,
                max_message_size=None,  # the job checks max_payload before the journal
                priority=priority if priorities else None,
                delayed=delayed,
            )
            codec: Codec[EncodedTask] = DelayedTaskCodec() if delayed else EncodedTaskCodec()
            return send_stack(
                codec,
                links,
                queues.spec(queues.tasks),
                role="delayed-tasks" if delayed else "tasks",
                options=options,
                frames=None if delayed else frames,
                log_confirms=False,  # the submission logs each failed confirm, with its task id
                share_confirmations=True,  # the submission watches a frame's tasks with one callback
            ).sender

        # Every leaf shares one set of limits, which the job sizes (FrameSizer). Tasks of a job with
        # priorities go one per message: a frame of low ones would keep its place in the queue.
        framed = not info.settings.no_frames and not priorities
        frames = FrameLimits() if framed else None
        journal: TaskJournal = MemoryJournal()
        if self._journal_root is not None:
            journal = Journal.open(self.journal_path(info.id), fsync=self._journal_fsync)
        tasks: RouteSender[EncodedTask, tuple[int, bool]] = RouteSender(
            lambda task: (task.priority, task.not_before > 0), task_stack
        )
        window = Window(self._result_prefetch)
        codec = OutcomeCodec(unpickle=info.settings.codec == "pickle")
        results = listen_stack(codec, links, queues.spec(queues.results), window, role="results")
        job = Job(
            self.jobs,
            info,
            tasks,
            results,
            journal,
            links=links,
            marker=queues.marker,
            max_payload=self._max_payload,
            reach=self._reach,
            resumed=resumed,
            sizer=None if frames is None else FrameSizer(frames),
        )
        try:
            await job._start()
        except BaseException:
            await job.detach()
            raise
        self._jobs.add(job)
        return job

    async def get_job_info(self, job_id: str) -> jobs_pb2.Job:
        """The scheduler's view of a job. Raises NotFound for an unknown id."""
        request = jobs_pb2.GetJobRequest(job_id=check_job_id(job_id))
        stub = self.jobs
        return await self._reach.call("GetJob", lambda t: stub.GetJob(request, timeout=t))

    async def list_jobs(self, include_done: bool = False) -> list[jobs_pb2.Job]:
        """The scheduler's jobs, ended ones too with ``include_done``; asked once (a listing is
        not worth waiting for a restarting scheduler), at most 5 s.

        Raises:
            Unavailable: the scheduler did not answer.
        """
        request = jobs_pb2.ListJobsRequest(include_done=include_done)
        with map_rpc_errors():
            response = await self.jobs.ListJobs(request, timeout=min(ONCE_TIMEOUT, self._reach.patience))
        return list(response.jobs)

    async def cluster_info(self) -> jobs_pb2.ClusterInfo:
        """Brokers, connected daemons and their slots, as the scheduler sees them."""
        request = jobs_pb2.GetClusterInfoRequest()
        stub = self.jobs
        return await self._reach.call("GetClusterInfo", lambda t: stub.GetClusterInfo(request, timeout=t))

    def journal_path(self, job_id: str) -> Path:
        """The folder holding a job's tasks until their outcomes (see ``journal``)."""
        if self._journal_root is None:
            raise NoJournal("this client keeps no journal (journal=False)")
        return self._journal_root / check_job_id(job_id)

    def _link(self, url: str) -> Broker:
        """The shared link to one broker (one AMQP connection per broker per client)."""
        link = self._links.get(url)
        if link is None:
            link = self._open_broker(url)
            self._links[url] = link
        return link

    async def close(self) -> None:
        """Detaches jobs still going (see :meth:`Job.detach`: :meth:`resume` picks them up; one
        line says so per job), closes broker connections and the scheduler channel; idempotent."""
        jobs = [job for job in self._jobs if not job.ended]
        self._jobs.clear()
        await asyncio.gather(*(job.detach() for job in jobs), return_exceptions=True)
        for job in jobs:
            left_running(job.id, resumable=job.journal_path is not None)
        await asyncio.gather(*(link.close() for link in self._links.values()), return_exceptions=True)
        self._links.clear()
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
        self._stub = None


def default_journal_dir() -> Path:
    """``$XDG_STATE_HOME/truba/journal``, or ``~/.local/state/truba/journal``."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "truba" / "journal"
