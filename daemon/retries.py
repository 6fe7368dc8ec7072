"""Retries on exceptions: which handler errors a job tries again, and how long a task waits first.

A job lists exception names in ``retry_on`` (``module.Qualname``, or a builtin's bare name). A
slot reports the names of every class in a raised exception's MRO, so a subclass of a listed
exception matches too. A task whose handler raised a listed exception, with attempts left, goes
back to its queue after a backoff (:meth:`truba.daemon.returns.Returns.requeue_after`): its
delivery stays unacked meanwhile (a daemon that dies in the wait lets the broker deliver it
again, with the attempt counted), while its slot runs other tasks at once. Any other exception,
or one on the last attempt, is the task's outcome.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable

from truba.daemon.settings import JobSettings


def retries_on(kinds: Iterable[str], settings: JobSettings, attempt: int) -> bool:
    """Whether an error of the classes ``kinds`` (names, MRO order) ending attempt number
    ``attempt`` (1-based) makes the task try again."""
    return attempt < settings.max_attempts and _matches(kinds, settings.retry_on)


def _matches(kinds: Iterable[str], retry_on: Collection[str]) -> bool:
    return bool(retry_on) and any(kind in retry_on for kind in kinds)


def retry_delay(
    attempt: int, backoff: tuple[float, float], rng: Callable[[float, float], float] = random.uniform
) -> float:
    """Seconds before the attempt after ``attempt`` (1-based): ``initial·2^(attempt-1)`` capped
    at ``max``, of which a random half is taken off (equal jitter: retries of many tasks that
    failed together spread out, and none comes back at once)."""
    initial, longest = backoff
    delay: float = min(longest, initial * 2.0 ** min(attempt - 1, 60))
    return delay / 2 + rng(0.0, delay / 2)
