"""The daemon's link to the scheduler: one Connect stream, reopened with backoff and jitter.

Up the stream go Hello (who we are, what we run) and heartbeats (applied assignment, stats,
draining); down come Welcome (brokers), Assignments (the complete desired state) and Drain
(finish what runs, take nothing new, exit). When the scheduler is
unreachable the daemon keeps running its last assignment and keeps trying: the two converge
again after reconnect (eventual consistency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from truba.backoff import Backoff
from truba.channel import Credentials, open_channel
from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc

RECONNECT_BACKOFF = Backoff(attempts=None, base=0.2, cap=10.0)

log = logging.getLogger(__name__)


class Assignee(Protocol):
    """What the link needs from the daemon."""

    def hello(self) -> daemons_pb2.Hello: ...

    def heartbeat(self) -> daemons_pb2.Heartbeat: ...

    def welcome(self, welcome: daemons_pb2.Welcome) -> None: ...

    def assign(self, assignment: daemons_pb2.Assignment) -> None: ...

    def drain(self, reason: str = "scheduler") -> None: ...


class SchedulerLink:
    """Keeps a Connect stream to the scheduler open until ``stop`` is set."""

    def __init__(
        self,
        address: str,
        daemon: Assignee,
        backoff: Backoff | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.address = address
        self.credentials = credentials or Credentials.from_env()
        self.daemon = daemon
        self.backoff = backoff or RECONNECT_BACKOFF
        self.connected = asyncio.Event()
        self.connects = 0
        """Connect streams the scheduler welcomed (more than one: it reconnected)."""
        self.heartbeats = 0
        """Heartbeats sent."""
        self._heartbeat_interval = 2.0
        self._nudged = asyncio.Event()

    @property
    def is_connected(self) -> bool:
        """The stream is up and the scheduler welcomed us."""
        return self.connected.is_set()

    def nudge(self) -> None:
        """Sends a heartbeat now instead of at the next interval (e.g. the daemon started draining)."""
        self._nudged.set()

    async def run(self, stop: asyncio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            try:
                await self._session(stop)
                attempt = 0
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "daemon.scheduler.unreachable",
                    extra={"scheduler": self.address, "code": exc.code().name, "details": exc.details()},
                )
            except (OSError, ConnectionError) as exc:
                log.warning(
                    "daemon.scheduler.unreachable", extra={"scheduler": self.address, "error": repr(exc)}
                )
            self.connected.clear()
            if stop.is_set():
                return
            delay = self.backoff.delay(attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _session(self, stop: asyncio.Event) -> None:
        outbox: asyncio.Queue[daemons_pb2.DaemonMessage] = asyncio.Queue()
        outbox.put_nowait(daemons_pb2.DaemonMessage(hello=self.daemon.hello()))

        async def requests() -> AsyncIterator[daemons_pb2.DaemonMessage]:
            while True:
                yield await outbox.get()

        async def beat() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), self._heartbeat_interval)
                self._nudged.clear()
                outbox.put_nowait(daemons_pb2.DaemonMessage(heartbeat=self.daemon.heartbeat()))
                self.heartbeats += 1

        async with open_channel(self.address, self.credentials) as channel:
            stub = daemons_pb2_grpc.DaemonServiceStub(channel)
            call = stub.Connect(requests())
            beating = asyncio.create_task(beat())
            stopping = asyncio.create_task(stop.wait())
            try:
                reader = aiter(call)
                while True:
                    next_message = asyncio.ensure_future(anext(reader))
                    done, _ = await asyncio.wait(
                        {next_message, stopping}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if stopping in done:
                        next_message.cancel()
                        call.cancel()
                        return
                    try:
                        message = next_message.result()
                    except StopAsyncIteration:
                        log.warning("daemon.scheduler.stream_ended", extra={"scheduler": self.address})
                        return
                    self._handle(message)
            finally:
                beating.cancel()
                stopping.cancel()
                call.cancel()

    def _handle(self, message: daemons_pb2.SchedulerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self._heartbeat_interval = message.welcome.heartbeat_interval or 2.0
            self.connects += 1
            log.info(
                "daemon.scheduler.connected",
                extra={"scheduler": self.address, "brokers": len(message.welcome.brokers)},
            )
            self.daemon.welcome(message.welcome)
            self.connected.set()
            self.nudge()  # the first heartbeat now, at the scheduler's interval from then on
        elif kind == "assignment":
            if message.assignment.heartbeat_interval > 0:  # a large cluster's scheduler stretched it
                self._heartbeat_interval = message.assignment.heartbeat_interval
            self.daemon.assign(message.assignment)
        elif kind == "drain":
            self.daemon.drain("scheduler")
