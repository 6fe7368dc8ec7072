"""Each job's task history, for ``truba timeline`` and the dashboard: the spans daemons report.

Daemons send, in every heartbeat, the task attempts that ended since the last one (and slots
that left a job), each a ``truba.v1.Span`` (:mod:`truba.daemon.spans`). The scheduler keeps,
**in memory only** (a restart forgets them), the newest :data:`PER_JOB` spans of each job, for
at most :data:`JOBS` jobs (the least recently reported one goes first), and forgets a job
:data:`KEEP` seconds after its last span arrived. ``dropped`` counts the spans a job lost to
these bounds or to a daemon's per-heartbeat bound.

Besides, the newest :data:`FAILURES` failed attempts of each job (an error, a retry, a timeout,
a crash, a give-up) are kept apart with their error's message (the daemon sends at most
:data:`~truba.daemon.spans.MESSAGE_CHARS` of it), for the dashboard's table of a job's errors:
a job of many short good tasks does not push its failures out of sight.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple, final

from truba.proto.v1 import daemons_pb2, jobs_pb2

PER_JOB: Final = 50_000
"""Spans kept per job (the newest): about 10 MB each in the worst case."""
JOBS: Final = 32
"""Jobs whose spans are kept at once."""
KEEP: Final = 3600.0
"""Seconds a job's spans are kept after its last one arrived (so after the job ended)."""
ANSWER_BYTES: Final = 3 * 1024 * 1024
"""An answer's spans stay under this, encoded (gRPC's default limit per message is 4 MiB)."""
_SPAN_BYTES: Final = 40
"""A span's encoded size besides its strings, at most (a little over, to be safe)."""
FAILURES: Final = 200
"""Failed attempts kept apart per job (the newest), with their error messages."""
FAILED: Final = frozenset(
    {
        daemons_pb2.SPAN_OUTCOME_ERROR,
        daemons_pb2.SPAN_OUTCOME_RETRIED,
        daemons_pb2.SPAN_OUTCOME_TIMEOUT,
        daemons_pb2.SPAN_OUTCOME_CRASHED,
        daemons_pb2.SPAN_OUTCOME_GAVE_UP,
    }
)
"""The outcomes of a failed attempt."""
OUTCOMES: Final[dict[int, str]] = {
    int(value): name.removeprefix("SPAN_OUTCOME_").lower() for name, value in daemons_pb2.SpanOutcome.items()
}
"""Each outcome's word in JSON (``ok``, ``error``, ``retried``, ``preempted``, ...)."""


class Entry(NamedTuple):
    """One span as kept (a tuple: a proto message per span would cost several times more)."""

    daemon_id: str
    task_id: str
    slot: int
    start: float
    end: float
    outcome: int
    attempt: int
    error: str

    def to_pb(self) -> jobs_pb2.TimelineSpan:
        span = daemons_pb2.Span(
            job_id="",
            task_id=self.task_id,
            slot=self.slot,
            start=self.start,
            end=self.end,
            outcome=daemons_pb2.SpanOutcome.ValueType(self.outcome),
            attempt=self.attempt,
            error=self.error,
        )
        return jobs_pb2.TimelineSpan(daemon_id=self.daemon_id, span=span)

    def to_json(self) -> dict[str, object]:
        return {
            "daemon_id": self.daemon_id,
            "task_id": self.task_id,
            "slot": self.slot,
            "start": self.start,
            "end": self.end,
            "outcome": OUTCOMES.get(self.outcome, "unspecified"),
            "attempt": self.attempt,
            "error": self.error,
        }


class Failure(NamedTuple):
    """A failed attempt as kept for the errors table: the span's facts and its error's message."""

    entry: Entry
    message: str

    def to_json(self) -> dict[str, object]:
        return {**self.entry.to_json(), "message": self.message}


@dataclass
class _JobSpans:
    spans: deque[Entry]
    seen: float
    dropped: int = 0
    failures: deque[Failure] = field(default_factory=lambda: deque(maxlen=FAILURES))


@final
@dataclass
class TaskTimeline:
    """The spans of recent jobs; see the module docstring. ``clock`` is Unix time."""

    per_job: int = PER_JOB
    jobs: int = JOBS
    keep: float = KEEP
    clock: Callable[[], float] = time.time
    _jobs: dict[str, _JobSpans] = field(default_factory=dict)

    def report(self, daemon_id: str, spans: Iterable[daemons_pb2.Span], dropped: int = 0) -> None:
        """Keeps one heartbeat's spans; ``dropped`` ones the daemon left out go to every job the
        heartbeat names (the daemon does not know whose they were)."""
        now = self.clock()
        touched: dict[str, _JobSpans] = {}
        for span in spans:
            job = touched.get(span.job_id)
            if job is None:
                old = self._jobs.pop(span.job_id, None)  # reinserted below: the newest come last
                job = old if old is not None else _JobSpans(deque(maxlen=self.per_job), now)
                touched[span.job_id] = job
            if len(job.spans) == job.spans.maxlen:
                job.dropped += 1
            entry = Entry(
                daemon_id,
                span.task_id,
                span.slot,
                span.start,
                span.end,
                span.outcome,
                span.attempt,
                span.error,
            )
            job.spans.append(entry)
            if span.outcome in FAILED:
                job.failures.append(Failure(entry, span.error_message))
        for job_id, job in touched.items():  # the most recently reported jobs come last
            job.seen = now
            job.dropped += dropped
            self._jobs[job_id] = job
        self._forget(now)

    def _forget(self, now: float) -> None:
        for job_id in [j for j, job in self._jobs.items() if now - job.seen > self.keep]:
            del self._jobs[job_id]
        while len(self._jobs) > self.jobs:
            del self._jobs[next(iter(self._jobs))]

    def of(self, job_id: str, since: float = 0.0) -> tuple[list[Entry], int]:
        """The job's spans that ended after ``since`` (oldest end first), and how many it dropped."""
        job = self._jobs.get(job_id)
        if job is None:
            return [], 0
        spans = sorted((e for e in job.spans if e.end > since), key=lambda e: e.end)
        return spans, job.dropped

    def timeline_pb(self, job_id: str, since: float = 0.0, limit: int = 0) -> jobs_pb2.Timeline:
        """The newest spans after ``since``: at most ``limit`` (0: any number) and
        :data:`ANSWER_BYTES` encoded; ``left_out`` counts the older ones that did not fit."""
        spans, dropped = self.of(job_id, since)
        kept = _newest(spans, limit)
        return jobs_pb2.Timeline(
            job_id=job_id, spans=[e.to_pb() for e in kept], dropped=dropped, left_out=len(spans) - len(kept)
        )

    def timeline_json(self, job_id: str, since: float = 0.0, limit: int = 0) -> dict[str, object]:
        """The same as :meth:`timeline_pb`, as the HTTP API's JSON."""
        spans, dropped = self.of(job_id, since)
        kept = _newest(spans, limit)
        return {
            "job_id": job_id,
            "spans": [e.to_json() for e in kept],
            "dropped": dropped,
            "left_out": len(spans) - len(kept),
        }

    def errors_json(self, job_id: str, limit: int = FAILURES) -> dict[str, object]:
        """The job's newest failed attempts (at most ``limit``), newest first, each a span's
        JSON with its error's ``message``, as the HTTP API's JSON."""
        job = self._jobs.get(job_id)
        failures = sorted(job.failures, key=lambda f: f.entry.end, reverse=True) if job else []
        return {"job_id": job_id, "errors": [f.to_json() for f in failures[: max(0, limit)]]}


def _newest(spans: list[Entry], limit: int) -> list[Entry]:
    """The newest of ``spans`` (oldest end first) within ``limit`` and :data:`ANSWER_BYTES`."""
    if limit:
        spans = spans[-limit:]
    budget, first = ANSWER_BYTES, len(spans)
    while first > 0:
        entry = spans[first - 1]
        budget -= _SPAN_BYTES + len(entry.task_id) + len(entry.daemon_id) + len(entry.error)
        if budget < 0:
            break
        first -= 1
    return spans[first:]
