"""The daemon's link to the scheduler: one Connect stream, reopened with backoff and jitter.

Up the stream go Hello (who we are, what we run) and heartbeats (applied assignment, stats,
draining); down come Welcome (brokers), Assignments (the complete desired state) and Drain
(finish what runs, take nothing new, exit). When the scheduler is
unreachable the daemon keeps running its last assignment and keeps trying: the two converge
again after reconnect (eventual consistency).

**Several schedulers** (``--scheduler a:50051,b:50051``, high availability): the link talks to
one at a time. A standby answers ``UNAVAILABLE`` naming the leader
(:func:`truba.follow.leader_hint`): the link goes there after a short pause
(:data:`~truba.follow.STANDBY_RETRY`, without growing: an election takes seconds). An address
that fails otherwise makes it try the next one at once; only after a whole round of failures
does it back off, and not while an election is on: for :data:`~truba.follow.ELECTION_WINDOW`
after a standby answered, a failed round waits a standby retry too (the new leader's port is
closed while it loads the store, and a growing backoff there kept a daemon away for seconds
after the leader served).

**Epochs.** Every Welcome and Assignment carries the sending leader's epoch, and the link keeps
the highest it saw. An assignment of an older epoch (a former leader's) is ignored, logged and
counted (:attr:`SchedulerLink.stale_assignments`); a Welcome of an older epoch ends that stream
(the link moves on). Epoch 0 is a scheduler that sends none (older than epochs): accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Protocol

import grpc

from truba.backoff import Backoff
from truba.channel import Credentials, open_channel
from truba.follow import STANDBY_RETRY, Election, leader_hint, scheduler_addresses
from truba.proto.v1 import daemons_pb2, daemons_pb2_grpc

RECONNECT_BACKOFF = Backoff(attempts=None, base=0.2, cap=10.0)
OWN_SUBCHANNEL = (("grpc.use_local_subchannel_pool", 1),)
"""Each session's channel connects on its own: channels to one address share gRPC's global
subchannel, whose reconnect backoff (1 s, growing to 2 s) would fail a new session at once,
without trying, long after the scheduler is back. The link keeps its own backoff."""
WELCOME_TIMEOUT = 10.0
"""Seconds a new stream may take to be welcomed before the link tries the next address."""


class StaleScheduler(Exception):
    """A scheduler welcomed us with an epoch older than one we saw: a former leader."""


log = logging.getLogger(__name__)


class Assignee(Protocol):
    """What the link needs from the daemon."""

    def hello(self) -> daemons_pb2.Hello: ...

    def heartbeat(self) -> daemons_pb2.Heartbeat: ...

    def welcome(self, welcome: daemons_pb2.Welcome) -> None: ...

    def assign(self, assignment: daemons_pb2.Assignment) -> None: ...

    def drain(self, reason: str = "scheduler") -> None: ...


class Outbox:
    """What goes up one Connect stream: gRPC's request iterator, ended with the session.

    A plain iterator, not an async generator: gRPC's task reading it may still wait in it when
    the stream breaks, and closing a generator suspended in another task fails ("aclose():
    asynchronous generator is already running"). :meth:`close` ends the iteration, so that task
    ends with the session instead of staying pending until it is destroyed ("Task was destroyed
    but it is pending").
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[daemons_pb2.DaemonMessage | None] = asyncio.Queue()
        self._closed = False

    def put(self, message: daemons_pb2.DaemonMessage) -> None:
        if not self._closed:
            self._queue.put_nowait(message)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    def __aiter__(self) -> Outbox:
        return self

    async def __anext__(self) -> daemons_pb2.DaemonMessage:
        message = await self._queue.get()
        if message is None or self._closed:
            raise StopAsyncIteration
        return message


class SchedulerLink:
    """Keeps a Connect stream to the scheduler open until ``stop`` is set."""

    def __init__(
        self,
        address: str,
        daemon: Assignee,
        backoff: Backoff | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.addresses = scheduler_addresses(address)
        self.address = self.addresses[0]
        """The scheduler the link talks to now (or tries next)."""
        self.credentials = credentials or Credentials.from_env()
        self.daemon = daemon
        self.backoff = backoff or RECONNECT_BACKOFF
        self.connected = asyncio.Event()
        self.connects = 0
        """Connect streams the scheduler welcomed (more than one: it reconnected)."""
        self.heartbeats = 0
        """Heartbeats sent."""
        self.epoch = 0
        """The highest leader epoch seen in a Welcome or an Assignment."""
        self.applied_epoch = 0
        """The epoch of the last assignment handed to the daemon."""
        self.stale_assignments = 0
        """Assignments ignored for an epoch older than :attr:`epoch`."""
        self._heartbeat_interval = 2.0
        self._nudged = asyncio.Event()
        self._election = Election()

    @property
    def is_connected(self) -> bool:
        """The stream is up and the scheduler welcomed us."""
        return self.connected.is_set()

    @property
    def electing(self) -> bool:
        """A standby answered within the last :data:`~truba.follow.ELECTION_WINDOW` seconds."""
        return self._election.on

    def nudge(self) -> None:
        """Sends a heartbeat now instead of at the next interval (e.g. the daemon started draining)."""
        self._nudged.set()

    async def run(self, stop: asyncio.Event) -> None:
        rounds = misses = 0
        while not stop.is_set():
            hint = ""
            welcomes = self.connects
            try:
                await self._session(stop)
            except grpc.aio.AioRpcError as exc:
                hint = leader_hint(exc)
                self._election.saw(exc)
                log.warning(
                    "daemon.scheduler.unreachable",
                    extra={
                        "scheduler": self.address,
                        "code": exc.code().name,
                        "details": exc.details(),
                        "leader": hint,
                    },
                )
            except (OSError, ConnectionError, TimeoutError, StaleScheduler) as exc:
                log.warning(
                    "daemon.scheduler.unreachable", extra={"scheduler": self.address, "error": repr(exc)}
                )
            self.connected.clear()
            if stop.is_set():
                return
            if self.connects != welcomes:
                rounds = misses = 0  # it worked for a while: start over, same scheduler first
                delay = self.backoff.delay(0)
            elif hint and hint != self.address:
                # A standby answered: the cluster is there, an election is on. No growing backoff.
                self._go(hint)
                rounds = misses = 0
                delay = random.uniform(*STANDBY_RETRY)
            else:
                self._go(self.addresses[(self.addresses.index(self.address) + 1) % len(self.addresses)])
                misses += 1
                delay = 0.0
                if misses >= len(self.addresses):  # a whole round failed: back off
                    misses = 0
                    if self.electing:
                        delay = random.uniform(*STANDBY_RETRY)
                    else:
                        delay = self.backoff.delay(rounds)
                        rounds += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def _go(self, address: str) -> None:
        if address not in self.addresses:
            self.addresses.append(address)
        self.address = address

    async def _session(self, stop: asyncio.Event) -> None:
        outbox = Outbox()
        outbox.put(daemons_pb2.DaemonMessage(hello=self.daemon.hello()))

        async def beat() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudged.wait(), self._heartbeat_interval)
                self._nudged.clear()
                outbox.put(daemons_pb2.DaemonMessage(heartbeat=self.daemon.heartbeat()))
                self.heartbeats += 1

        async with open_channel(self.address, self.credentials, options=OWN_SUBCHANNEL) as channel:
            stub = daemons_pb2_grpc.DaemonServiceStub(channel)
            call = stub.Connect(outbox)
            beating = asyncio.create_task(beat())
            stopping = asyncio.create_task(stop.wait())
            try:
                reader = aiter(call)
                while True:
                    next_message = asyncio.ensure_future(anext(reader))
                    bound = None if self.connected.is_set() else WELCOME_TIMEOUT
                    done, _ = await asyncio.wait(
                        {next_message, stopping}, timeout=bound, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not done:
                        next_message.cancel()
                        raise TimeoutError(f"no welcome within {WELCOME_TIMEOUT:g} s")
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
                outbox.close()
                beating.cancel()
                stopping.cancel()
                call.cancel()

    def _handle(self, message: daemons_pb2.SchedulerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            epoch = message.welcome.epoch
            if epoch and epoch < self.epoch:
                log.warning(
                    "daemon.scheduler.stale_epoch",
                    extra={"scheduler": self.address, "epoch": epoch, "seen": self.epoch},
                )
                raise StaleScheduler(f"{self.address} welcomed with epoch {epoch} < {self.epoch}")
            self.epoch = max(self.epoch, epoch)
            self._heartbeat_interval = message.welcome.heartbeat_interval or 2.0
            self.connects += 1
            log.info(
                "daemon.scheduler.connected",
                extra={"scheduler": self.address, "brokers": len(message.welcome.brokers), "epoch": epoch},
            )
            self.daemon.welcome(message.welcome)
            self.connected.set()
            self.nudge()  # the first heartbeat now, at the scheduler's interval from then on
        elif kind == "assignment":
            epoch = message.assignment.epoch
            if epoch and epoch < self.epoch:
                self.stale_assignments += 1
                log.warning(
                    "daemon.assignment.stale_epoch",
                    extra={
                        "scheduler": self.address,
                        "epoch": epoch,
                        "seen": self.epoch,
                        "version": message.assignment.version,
                    },
                )
                return
            self.epoch = max(self.epoch, epoch)
            self.applied_epoch = epoch
            if message.assignment.heartbeat_interval > 0:  # a large cluster's scheduler stretched it
                self._heartbeat_interval = message.assignment.heartbeat_interval
            self.daemon.assign(message.assignment)
        elif kind == "drain":
            self.daemon.drain("scheduler")
