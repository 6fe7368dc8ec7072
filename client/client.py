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
from pathlib import Path
from types import TracebackType
from typing import Unpack

import grpc.aio

from truba.channel import Credentials, open_channel
from truba.client.errors import map_rpc_errors
from truba.client.job import Job
from truba.client.options import JobOptions, queue_kind, settings_pb
from truba.pipes.base import Sender
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker
from truba.pipes.route import RouteSender
from truba.pipes.spool import FsyncPolicy, spool
from truba.pipes.stacks import DEFAULT_MAX_MESSAGE_SIZE, SendOptions, listen_stack, send_stack
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.queues import JobQueues
from truba.wire import ResultCodec, TaskCodec, TaskMessage

log = logging.getLogger(__name__)


class Client:
    """Creates and drives jobs. Use as ``async with Client(address) as client``."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        max_unconfirmed: int = 1000,
        result_prefetch: int = 1000,
        max_payload: int = DEFAULT_MAX_MESSAGE_SIZE,
        broker_heartbeat: float = 10.0,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_fsync: FsyncPolicy = "interval",
        use_spool: bool = True,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
    ) -> None:
        """A client of the scheduler at ``address``.

        Args:
            max_unconfirmed: tasks awaiting a broker confirm, per broker (backpressure beyond).
            result_prefetch: results a broker may push before they are taken, per broker.
            max_payload: bytes a task may take encoded; ``submit`` refuses a bigger one with
                MessageTooLarge before anything is sent (default 16 MiB).
            spool_dir: where tasks wait on disk until a broker confirms them, one folder per job
                (default ``$XDG_STATE_HOME/truba/spool``); ``use_spool=False`` keeps them in
                memory only. See :mod:`truba.pipes.spool` for the fsync policies.
            token: the scheduler's bearer token (default: ``$TRUBA_TOKEN``).
            tls_ca: PEM file to verify the scheduler's TLS certificate with (default:
                ``$TRUBA_TLS_CA``); without it the channel is plaintext.
        """
        self._credentials = Credentials.from_env(token, tls_ca)
        self.address = address
        self._spool_root = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        self._spool_fsync: FsyncPolicy = spool_fsync
        self._use_spool = use_spool
        self._max_unconfirmed = max_unconfirmed
        self._result_prefetch = result_prefetch
        if max_payload < 1:
            raise ValueError(f"max_payload: must be at least 1 byte, got {max_payload}")
        self._max_payload = max_payload
        self._broker_heartbeat = broker_heartbeat
        self._channel: grpc.aio.Channel | None = None
        self._stub: jobs_pb2_grpc.JobServiceAsyncStub | None = None
        self._links: dict[str, RabbitBroker] = {}
        self._name = f"truba-client-{socket.gethostname()}-{os.getpid()}"

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Opens the gRPC channel (lazily connected; the first call reports an unreachable scheduler)."""
        if self._channel is None:
            self._channel = open_channel(self.address, self._credentials)
            self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceAsyncStub:
        """The raw JobService stub."""
        if self._stub is None:
            raise RuntimeError("client is not connected: use 'async with Client(...)'")
        return self._stub

    async def create_job(
        self, handler: str, importance: float = 1.0, *, name: str = "", **options: Unpack[JobOptions]
    ) -> Job:
        """Creates a job whose tasks daemons run with ``handler`` ("package.module:function").

        Args:
            importance: the job's weight in the cluster's fair share (> 0); can change later
                with :meth:`Job.set_importance`.
            name: shown in listings.
            options: the job's settings, see :class:`~truba.client.options.JobOptions`
                (``min_slots``, ``max_slots``, ``preemption``, ``task_timeout``,
                ``max_attempts``, ``queue_type``, ``priorities``).

        Raises:
            ValueError: an option of the wrong kind (checked before anything is sent).
            InvalidArgument: the scheduler refused a value (the message names the field).
            FailedPrecondition: no connected daemon allows this handler.
            Unavailable: the scheduler or a broker cannot be reached.
        """
        settings = settings_pb(**options)
        request = jobs_pb2.CreateJobRequest(
            handler=handler, importance=importance, name=name, settings=settings
        )
        with map_rpc_errors():
            response = await self.jobs.CreateJob(request)
        info = response.job
        links = [self._link(broker.url) for broker in response.brokers]
        # The queues' specs, so a broker that lost them (data wiped) gets them back on reconnect.
        queues = JobQueues(
            info.queues.tasks,
            info.queues.results,
            info.queues.dead,
            kind=queue_kind(info.settings),
            priorities=info.settings.priorities,
        )
        priorities = info.settings.priorities

        def task_stack(priority: int) -> Sender[TaskMessage]:
            # One stack per priority level in use: RabbitMQ reads priority from the AMQP
            # properties, so each level's leaves publish with their own.
            options = SendOptions(
                max_unconfirmed=self._max_unconfirmed,
                max_message_size=self._max_payload,
                priority=priority if priorities else None,
            )
            spool_layer = None
            if self._use_spool:
                folder = self.spool_path(info.id)
                spool_layer = spool(folder / f"p{priority}" if priority else folder, fsync=self._spool_fsync)
            return send_stack(
                TaskCodec(),
                links,
                queues.spec(queues.tasks),
                role="tasks",
                spool=spool_layer,
                options=options,
            )

        tasks: RouteSender[TaskMessage, int] = RouteSender(lambda task: task.priority, task_stack)
        tasks.route(0)  # the default level opens at once, replaying what its spool holds
        window = Window(self._result_prefetch)
        results = listen_stack(ResultCodec(), links, queues.spec(queues.results), window, role="results")
        log.info("client.job.created", extra={"job_id": info.id, "handler": handler, "brokers": len(links)})
        return Job(self, info, tasks, results)

    async def get_job_info(self, job_id: str) -> jobs_pb2.Job:
        """The scheduler's view of a job. Raises NotFound for an unknown id."""
        with map_rpc_errors():
            return await self.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job_id))

    async def list_jobs(self, include_done: bool = False) -> list[jobs_pb2.Job]:
        with map_rpc_errors():
            response = await self.jobs.ListJobs(jobs_pb2.ListJobsRequest(include_done=include_done))
        return list(response.jobs)

    async def cluster_info(self) -> jobs_pb2.ClusterInfo:
        """Brokers, connected daemons and their slots, as the scheduler sees them."""
        with map_rpc_errors():
            return await self.jobs.GetClusterInfo(jobs_pb2.GetClusterInfoRequest())

    def spool_path(self, job_id: str) -> Path:
        """The folder holding a job's unconfirmed tasks."""
        return self._spool_root / job_id

    def _link(self, url: str) -> RabbitBroker:
        """The shared link to one broker (one AMQP connection per broker per client)."""
        link = self._links.get(url)
        if link is None:
            link = RabbitBroker(url, name=self._name, heartbeat=self._broker_heartbeat)
            self._links[url] = link
        return link

    async def close(self) -> None:
        """Closes broker connections and the scheduler channel; idempotent."""
        await asyncio.gather(*(link.close() for link in self._links.values()), return_exceptions=True)
        self._links.clear()
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
            self._stub = None


def default_spool_dir() -> Path:
    """``$XDG_STATE_HOME/truba/spool``, or ``~/.local/state/truba/spool``."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "truba" / "spool"
