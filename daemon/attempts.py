"""Attempt accounting: how many attempts a delivered task has spent, and what to do with it.

An attempt is *spent* when it ends without an outcome: its slot crashed, timed out or passed
the memory limit (the daemon sees these and writes the new count into the task when it puts
the task back), or its daemon or broker connection died (the broker redelivers the task; the
count is read from the delivery). An attempt interrupted on purpose (preemption, draining) is
not spent: the daemon puts the task back by publishing it again with the same count and acking
the original, never by ``reject(requeue=True)``, which would look like a death.

Reading deaths from a delivery:

- quorum queues count every return of a message in the ``x-delivery-count`` header: exact, so
  the task runs at once with ``attempts + x-delivery-count`` spent;
- classic queues only say ``redelivered``: at least one death. The task is then *recounted*:
  published again with ``attempts + 1`` and the original acked, so that a second death is
  seen again as ``redelivered`` on the new copy instead of hiding behind the first.

A task with ``max_attempts`` spent is given up: its give-up is its outcome.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from truba.wire import ErrorInfo, TaskMessage

DELIVERY_COUNT: Final = "x-delivery-count"

LOST: Final = ErrorInfo(
    "AttemptLost",
    "an attempt ended without an outcome: its daemon or its broker connection died "
    "(the broker delivered the task again)",
)


class Verdict(enum.Enum):
    RUN = "run"
    """Run it now; ``spent`` attempts are behind it."""
    RECOUNT = "recount"
    """Publish it again with ``attempts=spent``, ack the original (classic queues)."""
    GIVE_UP = "give_up"
    """Every attempt is spent: publish the give-up, keep the task in the dead-letter queue."""


@dataclass(slots=True)
class Admission:
    """What to do with one delivery, and the attempts it has spent."""

    verdict: Verdict
    spent: int
    error: ErrorInfo | None = None
    """Why the last spent attempt ended, when known (a give-up reports it)."""


def deaths(redelivered: bool, headers: Mapping[str, object]) -> tuple[int, bool]:
    """Attempts of this message that died in the broker's view, and whether the count is exact."""
    count = headers.get(DELIVERY_COUNT)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count, True
    return (1 if redelivered else 0), False


def admit(
    task: TaskMessage, redelivered: bool, headers: Mapping[str, object], max_attempts: int
) -> Admission:
    """The verdict on a delivered task (see the module docstring)."""
    died, exact = deaths(redelivered, headers)
    spent = task.attempts + died
    if spent >= max_attempts:
        error = LOST if died else ErrorInfo("AttemptsExhausted", f"{spent} attempts spent before delivery")
        return Admission(Verdict.GIVE_UP, spent, error)
    if died and not exact:
        return Admission(Verdict.RECOUNT, spent, LOST)
    return Admission(Verdict.RUN, spent, LOST if died else None)


def after_failure(spent: int, max_attempts: int) -> tuple[bool, int]:
    """An attempt the daemon saw end without an outcome: (give up?, attempts now spent)."""
    spent += 1
    return spent >= max_attempts, spent


def with_attempts(task: TaskMessage, attempts: int) -> TaskMessage:
    """``task`` carrying ``attempts`` spent (itself when it does already), as it is put back."""
    return task if task.attempts == attempts else dataclasses.replace(task, attempts=attempts)
