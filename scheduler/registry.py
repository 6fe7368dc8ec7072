"""Connected daemons: one :class:`DaemonSession` per Connect stream, in a :class:`DaemonRegistry`.

A session holds what the daemon offers (from its Hello), what it holds (what it reported at
Hello, then what it was last assigned), when it was last heard from, what its last heartbeat
said runs there (:mod:`truba.scheduler.running`), and its outbox: the messages waiting to be
written to its stream. Assignments are complete desired states, so a new one replaces an unsent
older one instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import final

import grpc

from truba.proto.v1 import daemons_pb2
from truba.scheduler.planner import Capacity
from truba.scheduler.running import DaemonRunning


@dataclass(frozen=True)
class DaemonInfo:
    """A daemon as it introduced itself in Hello."""

    daemon_id: str
    slots: int
    allow: tuple[str, ...]
    hostname: str = ""
    pid: int = 0
    version: str = ""

    @functools.cached_property
    def capacity(self) -> Capacity:
        """What the planner sees of this daemon (made once: every plan reads every daemon's)."""
        return Capacity(self.daemon_id, self.slots, self.allow)


@final
class DaemonSession:
    """One daemon's Connect stream, from the scheduler's side."""

    def __init__(self, info: DaemonInfo, held: dict[str, int], now: float) -> None:
        self.info = info
        self.daemon_id = info.daemon_id
        """The daemon's id (an attribute, not a property: every plan reads every daemon's)."""
        self.held = held
        """Slots per job the daemon holds: reported in Hello, then the last assignment sent."""
        self.version = 0
        """Version of the last assignment sent; 0 before the first."""
        self.applied_version = 0
        self.sent_at = now
        self.last_seen = now
        self.draining = False
        """Told to drain (DrainDaemon) or said so in a heartbeat: it gets no slots."""
        self.stats: list[daemons_pb2.JobStats] = []
        """Per-job counters of the last heartbeat."""
        self.running = DaemonRunning()
        """The task attempts in progress, as of the last heartbeat."""
        self.heartbeat_interval = 0.0
        """The interval this daemon was told (Welcome, then assignments); 0 before Welcome."""
        self.silence_interval = 0.0
        """The interval its silence is judged by: the longer of the last two it was told, until
        its next heartbeat (a daemon told a shorter one may still wait the longer one once)."""
        self.end: tuple[grpc.StatusCode, str] | None = None
        """Why the scheduler ended the stream (status and details), once it has."""
        self._outbox: collections.deque[daemons_pb2.SchedulerMessage] = collections.deque()
        self._wake = asyncio.Event()

    @property
    def hostname(self) -> str:
        return self.info.hostname

    def send(self, message: daemons_pb2.SchedulerMessage) -> None:
        """Queues ``message``; an assignment replaces any assignment not yet written."""
        if self.end is not None:
            return
        if message.HasField("assignment"):
            unsent = [m for m in self._outbox if not m.HasField("assignment")]
            self._outbox = collections.deque(unsent)
        self._outbox.append(message)
        self._wake.set()

    def close(self, code: grpc.StatusCode, details: str) -> None:
        """Ends the stream: :meth:`messages` stops, unsent messages are dropped. Idempotent."""
        if self.end is None:
            self.end = (code, details)
            self._wake.set()

    async def messages(self) -> AsyncIterator[daemons_pb2.SchedulerMessage]:
        """The outgoing messages, in order, until :meth:`close`."""
        while self.end is None:
            if self._outbox:
                yield self._outbox.popleft()
                continue
            self._wake.clear()
            await self._wake.wait()


@final
class DaemonRegistry:
    """The current session of every connected daemon, by daemon id."""

    def __init__(self) -> None:
        self._sessions: dict[str, DaemonSession] = {}

    def add(self, session: DaemonSession) -> DaemonSession | None:
        """Registers ``session``; returns the session it replaced (already closed), if any."""
        old = self._sessions.get(session.daemon_id)
        self._sessions[session.daemon_id] = session
        if old is not None:
            old.close(
                grpc.StatusCode.ABORTED, f"replaced by a newer connection of daemon {session.daemon_id!r}"
            )
        return old

    def remove(self, session: DaemonSession) -> bool:
        """Forgets ``session`` if it is still the daemon's current one; True if it was."""
        if self._sessions.get(session.daemon_id) is session:
            del self._sessions[session.daemon_id]
            return True
        return False

    def get(self, daemon_id: str) -> DaemonSession | None:
        return self._sessions.get(daemon_id)

    def __iter__(self) -> Iterator[DaemonSession]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    def silent_since(self, deadline: float) -> list[DaemonSession]:
        """Sessions last heard from before ``deadline`` (a monotonic time)."""
        return [s for s in self._sessions.values() if s.last_seen < deadline]

    def silent(self, now: float, missed: int, default: float) -> list[DaemonSession]:
        """Sessions silent for ``missed`` of their intervals (``default`` for one not told any)."""
        return [
            s for s in self._sessions.values() if now - s.last_seen > missed * (s.silence_interval or default)
        ]

    @property
    def total_slots(self) -> int:
        return sum(s.info.slots for s in self._sessions.values())
