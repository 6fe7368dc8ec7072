"""A periodic schedule and its runs as the scheduler keeps them, and when a schedule is due.

Plain data and pure functions (no I/O): the store persists :class:`Schedule` and
:class:`ScheduleRun`, the firing loop (:mod:`truba.scheduler.schedule_loop`) asks
:func:`next_due` when to fire next, and :func:`check_timing` validates a new schedule's timing.

Timing: ``every`` seconds keeps its phase (the runs are due at ``first + k * every``): a due time
missed (the previous run still held the schedule, or the scheduler was down) is skipped, not
made up, so at most one run is ever late. ``cron`` is a five-field expression evaluated in UTC
by croniter (https://github.com/pallets-eco/croniter).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from croniter import CroniterError, croniter

from truba.scheduler.errors import InvalidArgument

MIN_EVERY: Final = 0.1
"""Seconds: the shortest period (the firing loop wakes every few tens of milliseconds)."""
LEASE_GRACE: Final = 1.0
"""Seconds a run holds its schedule past its deadline: time for the daemon to kill it and for its
outcome to come back. A run with no outcome by then is counted lost and the schedule fires again."""
START_WITHIN: Final = 0.75 * LEASE_GRACE
"""Seconds after it was sent that a run may still start (its task expires then: a daemon that
gets it later gives it up unrun). So a run starts early enough to be killed at its deadline
before its lease expires (with a quarter of the grace left for its outcome to come back), and
runs sent while no daemon served the schedule never run late."""
KEEP_RUNS: Final = 100
"""Runs kept per schedule, newest first; older ones are deleted as new ones end."""
MAX_PAYLOAD: Final = 1024 * 1024
"""Bytes a schedule's payload may take (it is stored and sent with every run)."""


class ScheduleState(enum.Enum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"


class RunOutcome(enum.Enum):
    """How a run ended (RUNNING: not yet)."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    LOST = "lost"


@dataclass(frozen=True)
class Schedule:
    """One schedule. Times are Unix seconds; ``every`` 0 means ``cron`` is set, and the reverse.

    ``lease_until`` > now while a run holds the schedule (``run_task`` is that run's task id);
    the firing loop claims a due schedule only when it is not held.
    """

    id: str
    handler: str
    job_id: str
    every: float
    cron: str
    payload: bytes
    deadline: float
    importance: float
    created_at: float
    next_due: float
    name: str = ""
    state: ScheduleState = ScheduleState.ACTIVE
    lease_until: float = 0.0
    run_task: str = ""
    runs: int = 0

    @property
    def active(self) -> bool:
        return self.state is ScheduleState.ACTIVE


@dataclass(frozen=True)
class ScheduleRun:
    """One run of a schedule: its task, when it was due, fired and ended, and how it ended."""

    schedule_id: str
    task_id: str
    due: float
    started: float
    ended: float = 0.0
    outcome: RunOutcome = RunOutcome.RUNNING
    error: str = ""
    duration: float = 0.0
    daemon_id: str = ""


def check_timing(
    every: float, cron: str, deadline: float, *, max_deadline: float
) -> tuple[float, str, float]:
    """``(every, cron, deadline)`` cleaned; a deadline of 0 becomes the period.

    Raises:
        InvalidArgument: not exactly one of every and cron, a period under :data:`MIN_EVERY`,
            a cron expression croniter refuses, or a deadline <= 0 after defaults, above the
            period (two runs would overlap) or above ``max_deadline`` (the brokers'
            consumer timeout).
    """
    cron = cron.strip()
    if not math.isfinite(every) or every < 0:
        raise InvalidArgument("every", f"must be a finite number of seconds > 0, got {every:g}")
    if bool(every) == bool(cron):
        raise InvalidArgument("every", "give exactly one of every (seconds) and cron (an expression)")
    if every:
        if every < MIN_EVERY:
            raise InvalidArgument("every", f"must be at least {MIN_EVERY:g} seconds, got {every:g}")
        period = every
    else:
        period = cron_gap(cron)
    if not math.isfinite(deadline) or deadline < 0:
        raise InvalidArgument("deadline", f"must be a finite number of seconds > 0, got {deadline:g}")
    deadline = deadline or min(period, max_deadline)
    if deadline > period:
        raise InvalidArgument(
            "deadline", f"{deadline:g}s is longer than the period of {period:g}s: runs would overlap"
        )
    if deadline > max_deadline:
        raise InvalidArgument(
            "deadline",
            f"{deadline:g}s exceeds the brokers' consumer_timeout of {max_deadline:g}s"
            " (see the scheduler's --consumer-timeout)",
        )
    return every, cron, deadline


def cron_gap(cron: str) -> float:
    """The shortest gap in seconds between two consecutive times of ``cron`` (over its next 64).

    Raises:
        InvalidArgument: croniter refuses the expression, or it is not five fields.
    """
    if len(cron.split()) != 5:
        raise InvalidArgument("cron", f"must have five fields (minute hour day month weekday), got {cron!r}")
    try:
        times = croniter(cron, datetime(2026, 1, 1, tzinfo=UTC))
        stamps = [times.get_next(float) for _ in range(64)]
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument("cron", f"{cron!r} is not a valid cron expression: {exc}") from None
    return min(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def first_due(every: float, cron: str, now: float) -> float:
    """When a schedule created at ``now`` is first due: at once for ``every``, the next cron time."""
    return now if every else _next_cron(cron, now)


def next_due(schedule: Schedule, due: float, now: float) -> float:
    """When ``schedule`` is due after its run due at ``due`` fired at ``now``: the first of its
    times after both (missed times are skipped, the phase of ``every`` is kept)."""
    if schedule.every:
        periods = max(1, math.floor((now - due) / schedule.every) + 1)
        return due + periods * schedule.every
    return _next_cron(schedule.cron, max(due, now))


def resumed_due(schedule: Schedule, now: float) -> float:
    """The first due time at or after ``now`` for a schedule resumed at ``now`` (phase kept)."""
    if schedule.every:
        if schedule.next_due >= now:
            return schedule.next_due
        return next_due(schedule, schedule.next_due, now)
    return _next_cron(schedule.cron, now)


def _next_cron(cron: str, after: float) -> float:
    return float(croniter(cron, datetime.fromtimestamp(after, UTC)).get_next(float))


def may_fire(schedule: Schedule, now: float) -> bool:
    """The firing decision: active, due, and no run holds it (its lease is absent or expired).

    The store's claim applies the same condition in one conditional UPDATE, so two loops (or a
    loop and a restarted one) never both fire the same due time.
    """
    return schedule.active and schedule.next_due <= now and schedule.lease_until <= now


def lease_until(schedule: Schedule, now: float) -> float:
    """Until when a run fired at ``now`` holds ``schedule``: its deadline plus :data:`LEASE_GRACE`."""
    return now + schedule.deadline + LEASE_GRACE
