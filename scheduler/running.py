"""The task attempts running now, per daemon, for ``ListRunning`` and ``/api/v1/jobs/{id}/running``.

Every heartbeat carries the daemon's attempts in progress (job, task, slot, attempt number, start;
:mod:`truba.daemon.spans`), the oldest ones when there are more than fit, with per-job counts of
those left out. The scheduler keeps only the latest list of each connected daemon, on its
:class:`~truba.scheduler.registry.DaemonSession` (:class:`DaemonRunning`): a new heartbeat
replaces it, and it goes with the session when the daemon goes. Nothing is stored or replayed: a
job's running list is read from the sessions on demand, oldest start first, as of each daemon's
last heartbeat (so at most a heartbeat interval old).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from truba.proto.v1 import daemons_pb2, jobs_pb2

ANSWER_LIMIT: Final = 10_000
"""Attempts one answer holds at most (the oldest; about 700 kB encoded)."""


@dataclass(frozen=True, slots=True)
class DaemonRunning:
    """What one daemon's last heartbeat said runs there."""

    attempts: Sequence[daemons_pb2.RunningAttempt] = ()
    left_out: Mapping[str, int] = field(default_factory=dict)
    """Attempts in progress per job that did not fit in the heartbeat."""

    @classmethod
    def of(cls, heartbeat: daemons_pb2.Heartbeat) -> DaemonRunning:
        if not heartbeat.attempts and not heartbeat.attempts_left_out:
            return NOTHING  # an idle daemon's heartbeat: one shared empty list, nothing built
        return cls(heartbeat.attempts, dict(heartbeat.attempts_left_out))


NOTHING: Final = DaemonRunning()
"""Nothing runs (shared: it is immutable)."""


class Running(NamedTuple):
    """One attempt in progress, with where it runs."""

    daemon_id: str
    hostname: str
    slot: int
    task_id: str
    attempt: int
    started_at: float
    """Unix time, seconds (the daemon's wall clock)."""

    def to_pb(self) -> jobs_pb2.RunningTask:
        return jobs_pb2.RunningTask(
            daemon_id=self.daemon_id,
            hostname=self.hostname,
            slot=self.slot,
            task_id=self.task_id,
            attempt=self.attempt,
            started_at=self.started_at,
        )

    def to_json(self) -> dict[str, object]:
        return self._asdict()


class Reported(Protocol):
    """A daemon as :func:`running_of` reads it (a :class:`~truba.scheduler.registry.DaemonSession`)."""

    @property
    def daemon_id(self) -> str: ...

    @property
    def hostname(self) -> str: ...

    @property
    def running(self) -> DaemonRunning: ...


def running_of(daemons: Iterable[Reported], job_id: str, limit: int = 0) -> tuple[list[Running], int]:
    """The job's attempts in progress on ``daemons``, oldest start first, at most ``limit``
    (0: :data:`ANSWER_LIMIT`), and how many more there are (over the limit, or left out of a
    daemon's heartbeat)."""
    found: list[Running] = []
    left_out = 0
    for daemon in daemons:
        reported = daemon.running
        left_out += reported.left_out.get(job_id, 0)
        found.extend(
            Running(daemon.daemon_id, daemon.hostname, a.slot, a.task_id, a.attempt, a.start)
            for a in reported.attempts
            if a.job_id == job_id
        )
    found.sort(key=lambda r: (r.started_at, r.daemon_id, r.slot))
    limit = min(limit or ANSWER_LIMIT, ANSWER_LIMIT)
    left_out += max(0, len(found) - limit)
    return found[:limit], left_out


def running_pb(daemons: Iterable[Reported], job_id: str, limit: int = 0) -> jobs_pb2.ListRunningResponse:
    """:func:`running_of` as the gRPC answer, stamped with the scheduler's time."""
    found, left_out = running_of(daemons, job_id, limit)
    return jobs_pb2.ListRunningResponse(
        job_id=job_id, running=[r.to_pb() for r in found], left_out=left_out, at=time.time()
    )


def running_json(daemons: Iterable[Reported], job_id: str, limit: int = 0) -> dict[str, object]:
    """:func:`running_of` as the HTTP API's JSON (the same fields as :func:`running_pb`)."""
    found, left_out = running_of(daemons, job_id, limit)
    return {
        "job_id": job_id,
        "running": [r.to_json() for r in found],
        "left_out": left_out,
        "at": time.time(),
    }
