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

import grpc

from truba.client.errors import map_rpc_errors
from truba.client.job import Job
from truba.pipes.prefetch import Window
from truba.pipes.rabbit import RabbitBroker
from truba.pipes.spool import FsyncPolicy, spool
from truba.pipes.stacks import SendOptions, listen_stack, send_stack
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.wire import ResultCodec, TaskCodec

log = logging.getLogger(__name__)


class Client:
    """Creates and drives jobs. Use as ``async with Client(address) as client``."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        max_unconfirmed: int = 1000,
        result_prefetch: int = 1000,
        broker_heartbeat: float = 10.0,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_fsync: FsyncPolicy = "interval",
        use_spool: bool = True,
    ) -> None:
        """A client of the scheduler at ``address``.

        Args:
            max_unconfirmed: tasks awaiting a broker confirm, per broker (backpressure beyond).
            result_prefetch: results a broker may push before they are taken, per broker.
            spool_dir: where tasks wait on disk until a broker confirms them, one folder per job
                (default ``$XDG_STATE_HOME/truba/spool``); ``use_spool=False`` keeps them in
                memory only. See :mod:`truba.pipes.spool` for the fsync policies.
        """
        self.address = address
        self._spool_root = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        self._spool_fsync: FsyncPolicy = spool_fsync
        self._use_spool = use_spool
        self._max_unconfirmed = max_unconfirmed
        self._result_prefetch = result_prefetch
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
            self._channel = grpc.aio.insecure_channel(self.address)
            self._stub = jobs_pb2_grpc.JobServiceStub(self._channel)

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceAsyncStub:
        """The raw JobService stub."""
        if self._stub is None:
            raise RuntimeError("client is not connected: use 'async with Client(...)'")
        return self._stub

    async def create_job(self, handler: str, importance: float = 1.0, *, name: str = "") -> Job:
        """Creates a job whose tasks daemons run with ``handler`` ("package.module:function").

        Raises:
            InvalidArgument: a malformed handler or importance (the message names the field).
            FailedPrecondition: no connected daemon allows this handler.
            Unavailable: the scheduler or a broker cannot be reached.
        """
        request = jobs_pb2.CreateJobRequest(handler=handler, importance=importance, name=name)
        with map_rpc_errors():
            response = await self.jobs.CreateJob(request)
        info = response.job
        links = [self._link(broker.url) for broker in response.brokers]
        options = SendOptions(max_unconfirmed=self._max_unconfirmed)
        spool_layer = None
        if self._use_spool:
            spool_layer = spool(self.spool_path(info.id), fsync=self._spool_fsync)
        tasks = send_stack(
            TaskCodec(), links, info.queues.tasks, role="tasks", spool=spool_layer, options=options
        )
        window = Window(self._result_prefetch)
        results = listen_stack(ResultCodec(), links, info.queues.results, window, role="results")
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
