"""What each slot did and does, for the scheduler: one span per task attempt that ended, kept
until the next heartbeat takes them (the timeline), and the attempts in progress (the running
list).

The task path pays one small tuple appended to a bounded deque per attempt (no encoding, no
lock, no wait); the heartbeat turns what is there into ``truba.v1.Span`` messages. When more
than :data:`PER_HEARTBEAT` attempts end between two heartbeats, the newest are kept and the
heartbeat counts the rest as dropped. A span is the attempt's job, task, slot, wall-clock start
and end, how it ended (:class:`~truba.proto.v1.daemons_pb2.SpanOutcome`), its number and its
error's type and the start of its message (at most :data:`MESSAGE_CHARS`: cut on the failure
path only); a slot leaving its job (the scheduler took it, or the daemon drains) is a span of
its own, ``SLOT_TAKEN``, with no task and no length.

An attempt in progress is one entry in a dict, set when it starts (:meth:`JobSpans.started`)
and popped when it ends (:meth:`JobSpans.ended`); every heartbeat carries them all
(:meth:`SpanLog.running_now`), the oldest :data:`RUNNING_PER_HEARTBEAT` when there are more,
with per-job counts of the ones left out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias, final

from truba.proto.v1 import daemons_pb2

Outcome: TypeAlias = daemons_pb2.SpanOutcome.ValueType
PER_HEARTBEAT: Final = 2000
"""Spans one heartbeat carries at most (the newest; about 150 kB encoded, more with errors)."""
RUNNING_PER_HEARTBEAT: Final = 2000
"""Attempts in progress one heartbeat carries at most (the oldest; about 120 kB encoded)."""
MESSAGE_CHARS: Final = 300
"""Characters of a failed attempt's error message a span carries at most."""

OK: Final = daemons_pb2.SPAN_OUTCOME_OK
ERROR: Final = daemons_pb2.SPAN_OUTCOME_ERROR
RETRIED: Final = daemons_pb2.SPAN_OUTCOME_RETRIED
TIMEOUT: Final = daemons_pb2.SPAN_OUTCOME_TIMEOUT
CRASHED: Final = daemons_pb2.SPAN_OUTCOME_CRASHED
PREEMPTED: Final = daemons_pb2.SPAN_OUTCOME_PREEMPTED
GAVE_UP: Final = daemons_pb2.SPAN_OUTCOME_GAVE_UP
SLOT_TAKEN: Final = daemons_pb2.SPAN_OUTCOME_SLOT_TAKEN

_Row = tuple[str, str, int, float, float, Outcome, int, str, str]
"""job_id, task_id, slot, start, end, outcome, attempt, error type, error message: what the task
path appends."""
_Key = tuple[str, str, int]
"""job_id, task_id, slot: an attempt in progress."""


@final
class SpanLog:
    """The daemon's spans since the last heartbeat, the newest ``limit`` of them."""

    def __init__(self, limit: int = PER_HEARTBEAT, running_limit: int = RUNNING_PER_HEARTBEAT) -> None:
        self._rows: deque[_Row] = deque(maxlen=limit)
        self._dropped = 0
        self.running: dict[_Key, tuple[int, float]] = {}
        """The attempts in progress: (job_id, task_id, slot) → (attempt, start)."""
        self._running_limit = running_limit

    def add(self, row: _Row) -> None:
        """Keeps one span (the oldest kept one goes when full, and is counted as dropped)."""
        rows = self._rows
        if len(rows) == rows.maxlen:
            self._dropped += 1
        rows.append(row)

    def for_job(self, job_id: str, clock: Callable[[], float] = time.time) -> JobSpans:
        """A recorder that fills in ``job_id`` (one per job runner)."""
        return JobSpans(self, job_id, clock)

    def take(self) -> tuple[list[daemons_pb2.Span], int]:
        """The spans kept since the last call, oldest first, and how many were dropped; empties."""
        rows, dropped = list(self._rows), self._dropped
        self._rows.clear()
        self._dropped = 0
        spans = [
            daemons_pb2.Span(
                job_id=job_id,
                task_id=task_id,
                slot=slot,
                start=start,
                end=end,
                outcome=outcome,
                attempt=attempt,
                error=error,
                error_message=message,
            )
            for job_id, task_id, slot, start, end, outcome, attempt, error, message in rows
        ]
        return spans, dropped

    def running_now(self) -> tuple[list[daemons_pb2.RunningAttempt], dict[str, int]]:
        """The attempts in progress, oldest start first (the oldest ``running_limit``), and how
        many were left out per job."""
        rows = sorted(self.running.items(), key=lambda row: row[1][1])
        left_out: dict[str, int] = {}
        for (job_id, _, _), _ in rows[self._running_limit :]:
            left_out[job_id] = left_out.get(job_id, 0) + 1
        del rows[self._running_limit :]
        attempts = [
            daemons_pb2.RunningAttempt(
                job_id=job_id, task_id=task_id, slot=slot, attempt=attempt, start=start
            )
            for (job_id, task_id, slot), (attempt, start) in rows
        ]
        return attempts, left_out


@dataclass(frozen=True, slots=True)
class JobSpans:
    """Records one job's spans into a :class:`SpanLog`; ``clock`` is the wall clock."""

    log: SpanLog
    job_id: str
    clock: Callable[[], float] = time.time

    def started(self, task_id: str, slot: int, start: float, attempt: int) -> None:
        """Attempt ``attempt`` of ``task_id`` began on ``slot`` at ``start`` (Unix seconds)."""
        self.log.running[(self.job_id, task_id, slot)] = (attempt, start)

    def ended(self, task_id: str, slot: int) -> None:
        """The attempt of ``task_id`` on ``slot`` is over (or never began): no longer in progress."""
        self.log.running.pop((self.job_id, task_id, slot), None)

    def attempt(
        self,
        task_id: str,
        slot: int,
        start: float,
        end: float,
        outcome: Outcome,
        attempt: int,
        error: str = "",
        message: str = "",
    ) -> None:
        """A task attempt on ``slot`` from ``start`` to ``end`` (Unix seconds) ended ``outcome``,
        with an error of type ``error`` saying ``message`` (cut to :data:`MESSAGE_CHARS`)."""
        if message:
            message = message[:MESSAGE_CHARS]
        self.log.add((self.job_id, task_id, slot, start, end, outcome, attempt, error, message))

    def slot_taken(self, slot: int) -> None:
        """``slot`` left the job now (taken by the scheduler, or the daemon drains)."""
        now = self.clock()
        self.log.add((self.job_id, "", slot, now, now, SLOT_TAKEN, 0, "", ""))


def unrecorded() -> JobSpans:
    """A recorder whose spans nobody takes (a runner outside a daemon, e.g. in tests)."""
    return SpanLog(limit=1).for_job("")
