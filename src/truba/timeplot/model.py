"""A task attempt as the timelines draw it, built from the scheduler's ``truba.v1.Timeline``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final

from truba.proto.v1 import daemons_pb2, jobs_pb2

OUTCOMES: Final[dict[str, tuple[str, str]]] = {
    "ok": ("#2e9d5b", "ok"),
    "error": ("#d0443c", "failed (error)"),
    "retried": ("#e59a1c", "retried"),
    "timeout": ("#8a4fd0", "timed out"),
    "crashed": ("#7a3b12", "slot crashed / memory"),
    "preempted": ("#2f6fdf", "preempted (put back)"),
    "gave_up": ("#111111", "given up"),
    "slot_taken": ("#6b7585", "slot taken from the job"),
}
"""Each outcome's colour and legend label (the same as ``timeline.js``)."""


@dataclass(frozen=True, slots=True)
class Span:
    """One task attempt on one slot (``slot_taken``: the slot leaving the job, no task)."""

    job_id: str
    daemon_id: str
    slot: int
    task_id: str
    start: float
    end: float
    outcome: str
    attempt: int
    error: str

    @property
    def lane(self) -> str:
        return f"{self.daemon_id} · slot {self.slot}"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def outcome_word(outcome: int) -> str:
    """``SPAN_OUTCOME_PREEMPTED`` → ``preempted``."""
    return daemons_pb2.SpanOutcome.Name(outcome).removeprefix("SPAN_OUTCOME_").lower()  # type: ignore[arg-type]


def spans_of(timeline: jobs_pb2.Timeline) -> list[Span]:
    """The timeline's spans, oldest end first."""
    return [
        Span(
            job_id=timeline.job_id,
            daemon_id=entry.daemon_id,
            slot=entry.span.slot,
            task_id=entry.span.task_id,
            start=entry.span.start,
            end=entry.span.end,
            outcome=outcome_word(entry.span.outcome),
            attempt=entry.span.attempt,
            error=entry.span.error,
        )
        for entry in timeline.spans
    ]


def lanes_of(spans: list[Span]) -> list[str]:
    """The lanes the spans use, in daemon then slot order."""
    keys = {(s.daemon_id, s.slot) for s in spans}
    return [f"{daemon} · slot {slot}" for daemon, slot in sorted(keys)]
