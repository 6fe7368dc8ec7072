"""DaemonService.Connect: the stream over which a daemon and the scheduler converge.

The daemon sends Hello first; the scheduler answers Welcome (brokers, heartbeat interval), then
an Assignment, then a new Assignment whenever the daemon's share changes. The daemon sends
Heartbeats; a reader task hands them to the :class:`~truba.scheduler.assigner.Assigner` while
the handler writes the session's outbox to the stream.

How a stream ends:

- the daemon ends its side: OK, and the daemon is forgotten;
- a second Connect with the same daemon id: the first ends with ABORTED;
- no heartbeat for 3 intervals: UNAVAILABLE (the assigner's watchdog closes it);
- no valid Hello within 3 intervals (as it would be told): INVALID_ARGUMENT naming the field.

In every case the plan is recomputed at once without the daemon.

Every Welcome and Assignment written carries the scheduler's leader ``epoch`` (stamped here, as
it goes out). With a ``leading`` check (high availability), a message is written only while it
holds: once the leader's fence passed, its streams end with UNAVAILABLE instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import final

import grpc
import grpc.aio

from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc
from truba.scheduler.assigner import MISSED_HEARTBEATS, Assigner
from truba.scheduler.brokers import BrokerInfo
from truba.scheduler.convert import welcome_pb
from truba.scheduler.errors import InvalidArgument, SchedulerError
from truba.scheduler.registry import DaemonInfo, DaemonSession
from truba.scheduler.running import DaemonRunning
from truba.scheduler.timeline import TaskTimeline
from truba.scheduler.validate import check_daemon_id, check_slots
from truba.scheduler.view import daemon_pb

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[daemons_pb2.DaemonMessage, daemons_pb2.SchedulerMessage]


@final
class DaemonServicer(daemons_pb2_grpc.DaemonServiceServicer):
    """Serves ``truba.v1.DaemonService``."""

    def __init__(
        self,
        assigner: Assigner,
        brokers: Sequence[BrokerInfo],
        *,
        clock: Callable[[], float] = time.monotonic,
        timeline: TaskTimeline | None = None,
        epoch: int = 0,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        """``timeline`` keeps the task spans heartbeats carry (none kept without one); ``epoch``
        goes into every Welcome and Assignment; nothing is written once ``leading()`` is False."""
        self._epoch = epoch
        self._leading = leading
        self._assigner = assigner
        self._timeline = timeline
        self._brokers = tuple(brokers)
        self._clock = clock
        self._welcomes: dict[float, daemons_pb2.SchedulerMessage] = {}
        """Welcome by heartbeat interval: the same few for every daemon (brokers and epoch are
        fixed for the servicer's life), built once, not once per connect."""

    async def Connect(
        self, request_iterator: AsyncIterator[daemons_pb2.DaemonMessage], context: Context
    ) -> AsyncIterator[daemons_pb2.SchedulerMessage]:
        try:
            session = await self._hello(request_iterator)
        except SchedulerError as exc:
            log.warning("sched.daemon.refused", extra={"peer": context.peer(), "details": str(exc)})
            await context.abort(exc.code, str(exc))
        session.send(self._welcome(self._assigner.welcome(session)))
        self._assigner.connect(session)
        reader = asyncio.create_task(
            self._read(request_iterator, session), name=f"daemon-{session.daemon_id}"
        )
        try:
            async for message in session.messages():
                if self._leading is not None and not self._leading():
                    session.close(grpc.StatusCode.UNAVAILABLE, "this scheduler no longer leads")
                    break
                if message.HasField("assignment"):
                    message.assignment.epoch = self._epoch
                yield message
        finally:
            reader.cancel()
            reason = session.end[1] if session.end else "stream cancelled"
            self._assigner.disconnect(session, reason)
        code, details = session.end or (grpc.StatusCode.OK, "")
        if code is not grpc.StatusCode.OK:
            await context.abort(code, details)

    async def ListDaemons(
        self,
        request: daemons_pb2.ListDaemonsRequest,
        context: grpc.aio.ServicerContext[daemons_pb2.ListDaemonsRequest, daemons_pb2.ListDaemonsResponse],
    ) -> daemons_pb2.ListDaemonsResponse:
        sessions = sorted(self._assigner.sessions(), key=lambda s: s.daemon_id)
        return daemons_pb2.ListDaemonsResponse(daemons=[self._info_pb(s) for s in sessions])

    async def DrainDaemon(
        self,
        request: daemons_pb2.DrainDaemonRequest,
        context: grpc.aio.ServicerContext[daemons_pb2.DrainDaemonRequest, daemons_pb2.DaemonInfo],
    ) -> daemons_pb2.DaemonInfo:
        try:
            session = self._assigner.drain(check_daemon_id(request.daemon_id))
        except SchedulerError as exc:
            log.info("sched.request.refused", extra={"method": "DrainDaemon", "details": str(exc)})
            await context.abort(exc.code, str(exc))
        return self._info_pb(session)

    def _welcome(self, interval: float) -> daemons_pb2.SchedulerMessage:
        welcome = self._welcomes.get(interval)
        if welcome is None:
            welcome = self._welcomes[interval] = welcome_pb(self._brokers, interval)
            welcome.welcome.epoch = self._epoch
        return welcome

    def _info_pb(self, session: DaemonSession) -> daemons_pb2.DaemonInfo:
        return daemon_pb(session, self._clock)

    async def _hello(self, requests: AsyncIterator[daemons_pb2.DaemonMessage]) -> DaemonSession:
        # Judged like silence: three of the intervals a daemon would be told now (on a cluster
        # past the heartbeat budget, longer than the configured one; a loop stalled by a storm of
        # connects must not refuse Hellos that arrived in time but were not read yet).
        timeout = MISSED_HEARTBEATS * self._assigner.interval_for(self._assigner.daemon_count + 1)
        try:
            first = await asyncio.wait_for(anext(requests), timeout)
        except StopAsyncIteration:
            raise InvalidArgument("hello", "required: the stream ended before it") from None
        except TimeoutError:
            raise InvalidArgument(
                "hello", f"required as the first message, none within {timeout:g}s"
            ) from None
        if not first.HasField("hello"):
            raise InvalidArgument("hello", f"required as the first message, got {first.WhichOneof('kind')}")
        hello = first.hello
        info = DaemonInfo(
            daemon_id=check_daemon_id(hello.daemon_id),
            slots=check_slots(hello.slots),
            allow=tuple(hello.allow),
            hostname=hello.hostname,
            pid=hello.pid,
            version=hello.version,
        )
        held = {running.job_id: running.slots for running in hello.running if running.slots > 0}
        return DaemonSession(info, held, self._clock())

    async def _read(self, requests: AsyncIterator[daemons_pb2.DaemonMessage], session: DaemonSession) -> None:
        try:
            async for message in requests:
                if message.HasField("heartbeat"):
                    heartbeat = message.heartbeat
                    self._assigner.heartbeat(session, heartbeat)
                    session.running = DaemonRunning.of(heartbeat)
                    if self._timeline is not None and (heartbeat.spans or heartbeat.spans_dropped):
                        self._timeline.report(session.daemon_id, heartbeat.spans, heartbeat.spans_dropped)
                else:
                    log.warning(
                        "sched.daemon.unexpected_message",
                        extra={"daemon_id": session.daemon_id, "kind": message.WhichOneof("kind")},
                    )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream broke under us: the daemon is gone
            log.info("sched.daemon.stream_broken", extra={"daemon_id": session.daemon_id, "error": repr(exc)})
            session.close(grpc.StatusCode.CANCELLED, f"stream broken: {type(exc).__name__}")
        else:
            session.close(grpc.StatusCode.OK, "the daemon ended its stream")
