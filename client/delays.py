"""A job's delayed tasks on the client's side: their due times from ``delay=``/``not_before=``,
and how many are not due yet (the scheduler counts them as no demand for slots until then).

The brokers hold a delayed task (:mod:`truba.pipes.delay`); the client only counts them, and
pokes its progress reporter when one falls due, :data:`DEMAND_LEAD` seconds early so that the
scheduler has slots ready when the task comes out of the delay levels.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final, final

from truba.pipes.delay import MAX_DELAY

DEMAND_LEAD: Final = 2.0
"""Seconds before its due time that a delayed task counts as demand for a slot again: the
scheduler's report, plan and assignment take about a heartbeat."""


def due_time(delay: float | None, not_before: datetime | None, now: float) -> float:
    """The due time (Unix) of a task submitted at ``now`` with ``delay`` seconds or
    ``not_before`` (an aware datetime); 0.0 when it is due at once.

    Raises:
        ValueError: both given, a negative or non-finite delay, a naive datetime, or a due
            time further than :data:`~truba.pipes.delay.MAX_DELAY` away.
    """
    if delay is None and not_before is None:
        return 0.0
    if delay is not None and not_before is not None:
        raise ValueError("give delay= or not_before=, not both")
    if not_before is not None:
        if not_before.tzinfo is None or not_before.utcoffset() is None:
            raise ValueError(
                f"not_before={not_before.isoformat()} is a naive datetime: give its time zone, "
                "e.g. datetime.now(timezone.utc) + timedelta(minutes=5)"
            )
        due = not_before.timestamp()
    else:
        assert delay is not None
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        due = now + delay
    if due - now > MAX_DELAY:
        raise ValueError(f"due in {due - now:.0f} s: over the longest delay, {MAX_DELAY:.0f} s")
    return due if due > now else 0.0


@final
class DelayedCount:
    """How many of the tasks submitted (or sent again) here are delayed and not due within
    :data:`DEMAND_LEAD`; calls ``on_change`` when that count drops (a timer per soonest due time).

    Tasks of an earlier run of a resumed job that are not sent again are not known here: they
    count as demand (an idle slot at most meanwhile, never a task without one).
    """

    def __init__(self, on_change: Callable[[], None], *, clock: Callable[[], float] = time.time) -> None:
        self._on_change = on_change
        self._clock = clock
        self._dues: list[tuple[float, str]] = []
        """(due, task id), soonest first."""
        self._tasks: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, task_id: str, due: float) -> None:
        """Delayed task ``task_id``, due at ``due``, was sent (again: counted once)."""
        if task_id in self._tasks or due <= self._clock() + DEMAND_LEAD:
            return
        self._tasks.add(task_id)
        heapq.heappush(self._dues, (due, task_id))
        if self._dues[0][1] == task_id:
            self._arm()

    def pending(self) -> int:
        """Tasks not due within :data:`DEMAND_LEAD` seconds."""
        horizon = self._clock() + DEMAND_LEAD
        while self._dues and self._dues[0][0] <= horizon:
            self._tasks.discard(heapq.heappop(self._dues)[1])
        return len(self._dues)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        wait = max(0.0, self._dues[0][0] - DEMAND_LEAD - self._clock())
        self._timer = loop.call_later(wait, self._fall_due)

    def _fall_due(self) -> None:
        self._timer = None
        self.pending()  # drops what fell due
        self._on_change()
        if self._dues:
            self._arm()

    def stop(self) -> None:
        """No more timers (the job ended here)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
