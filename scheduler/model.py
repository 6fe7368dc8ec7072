"""The scheduler's job record, its states, its id and the names of its queues.

Everything here is plain data with no I/O: the store persists :class:`Job`, the planner reads it,
the gRPC layer converts it to ``truba.v1.Job``.
"""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, final

from truba.queues import JobQueues, job_queues

__all__ = ["Job", "JobIds", "JobQueues", "JobSettings", "JobState", "Preemption", "QueueType", "job_queues"]

_BASE36: Final = "0123456789abcdefghijklmnopqrstuvwxyz"
_EPOCH: Final = 1_704_067_200.0
"""2024-01-01T00:00:00Z: job ids count milliseconds from here."""
_TIME_DIGITS: Final = 8
"""Base-36 digits of the millisecond clock: 36**8 ms from the epoch last until the year 2113."""
_RANDOM_DIGITS: Final = 4


class JobState(enum.Enum):
    """A job's lifecycle, as ``truba.v1.JobState``: OPEN → CLOSED → FINISHED, or → CANCELLED."""

    OPEN = "OPEN"
    CLOSED = "CLOSED"
    FINISHED = "FINISHED"
    CANCELLED = "CANCELLED"

    @property
    def runnable(self) -> bool:
        """Open and closed jobs still have tasks to run and get slots."""
        return self in (JobState.OPEN, JobState.CLOSED)


class Preemption(enum.Enum):
    """How a job's slots leave it when the planner gives them to another job."""

    GRACEFUL = "graceful"
    """At a task boundary: the running task finishes first."""
    IMMEDIATE = "immediate"
    """At once: the daemon interrupts the running task and returns it to its queue."""


class QueueType(enum.Enum):
    """The RabbitMQ type of a job's task and result queues."""

    QUORUM = "quorum"
    CLASSIC = "classic"


DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_BACKOFF: Final = (1.0, 60.0)
"""Seconds before a task's first retry, and the longest wait between two of its attempts."""


@dataclass(frozen=True)
class JobSettings:
    """A job's settings, fixed at creation. ``max_slots`` 0 is no limit; ``task_timeout`` 0 is none.

    ``frames``: small tasks and results are packed into frames under load (``truba.v1``'s
    ``no_frames`` inverted); False sends each in its own AMQP message.
    ``retry_on``: exception names after which a task that raised is tried again (after a
    backoff from ``backoff_initial`` doubling up to ``backoff_max`` seconds); ``codec``:
    ``"msgpack"`` or ``"pickle"``.
    """

    min_slots: int = 0
    max_slots: int = 0
    preemption: Preemption = Preemption.GRACEFUL
    task_timeout: float = 0.0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    queue_type: QueueType = QueueType.QUORUM
    priorities: bool = False
    frames: bool = True
    retry_on: tuple[str, ...] = ()
    backoff_initial: float = DEFAULT_BACKOFF[0]
    backoff_max: float = DEFAULT_BACKOFF[1]
    codec: str = "msgpack"
    preemption_grace: float = 0.0
    """Graceful preemption's bound in seconds (0: none): a task still running that long after
    its slot was taken is interrupted and goes back unspent."""


@dataclass(frozen=True)
class Job:
    """One job as the scheduler keeps it. Timestamps are Unix seconds; None until reached."""

    id: str
    handler: str
    importance: float
    state: JobState
    created_at: float
    name: str = ""
    submitted: int = 0
    closed_at: float | None = None
    finished_at: float | None = None
    problem: str = ""
    settings: JobSettings = JobSettings()

    @property
    def queues(self) -> JobQueues:
        return job_queues(self.id, self.settings.queue_type.value, priorities=self.settings.priorities)

    @property
    def runnable(self) -> bool:
        return self.state.runnable


def _base36(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, digit = divmod(value, 36)
        digits.append(_BASE36[digit])
    if value:
        raise ValueError(f"{value} does not fit in {width} base-36 digits")
    return "".join(reversed(digits))


@final
class JobIds:
    """Makes job ids: 8 base-36 digits of milliseconds since 2024, then 4 random ones.

    Ids match ``[a-z0-9]+``, are 12 characters long and sort by creation: within one process
    strictly (the clock part never repeats or goes back), across restarts as far as the wall
    clock does. The random part keeps two schedulers' (or a clock step back's) ids apart.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        randbelow: Callable[[int], int] = secrets.randbelow,
    ) -> None:
        self._clock = clock
        self._randbelow = randbelow
        self._last_ms = -1

    def new(self) -> str:
        """A fresh id, greater than every id this instance made before."""
        ms = max(int((self._clock() - _EPOCH) * 1000), self._last_ms + 1, 0)
        self._last_ms = ms
        return _base36(ms, _TIME_DIGITS) + _base36(self._randbelow(36**_RANDOM_DIGITS), _RANDOM_DIGITS)
