"""When a job's slot on a daemon would be free if taken now: the planner's view of graceful drains.

With graceful preemption a slot taken from a job serves its new job only once the task running
on it ends (the daemon lets whichever of the job's busy slots there finishes first go). So which
slot a move takes decides how long the receiver waits: a slot whose task ends in a second, or
one whose task runs for minutes. The caller estimates when each running task ends (from the
job's task durations: its mean run time minus the time the attempt has run,
:func:`expected_ends`) and the planner takes the slots that free soonest.

On a daemon a job holds ``h`` slots (in the plan being built) and runs ``r`` tasks. If ``r > h``,
``r - h`` of its tasks already drain for other jobs (slots taken earlier, not free yet): they
free with the first ends. Taking one more slot frees it at the ``(r - h)``-th end (0-based), and
at once when ``r < h`` (the job does not use every slot it holds: an idle slot, or one waiting
for a task).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, final

RESOLUTION: Final = 0.05
"""Seconds: drain times closer than this count as equal (then spread decides), so the planner's
choices do not follow every jitter of an estimate."""
IDLE: Final = -(1 << 60)
"""The drain of an idle slot: before any task's end, due ones too."""

Ends = Mapping[tuple[str, str], Sequence[float]]
"""(daemon id, job id) -> when the job's tasks running there are expected to end, soonest first,
on the planner's clock (a time in the past: any moment now)."""


@final
class Drains:
    """Answers "how soon does the next slot taken from this job on this daemon free?".

    Args:
        ends: expected task ends per (daemon, job), soonest first; None: unknown, every slot
            counts as free at once (the planner then chooses by spread alone).
        now: the planner's time.
    """

    def __init__(self, ends: Ends | None, now: float) -> None:
        self._ends = ends
        self._now = now
        self.known = ends is not None
        self._seen: dict[tuple[str, str], Sequence[float]] = {}
        """The ends read so far (a plan asks for the same pair again and again; reading one
        from the daemons' heartbeats is several calls)."""

    def running(self, daemon: str, job: str) -> int:
        """Tasks of ``job`` running on ``daemon`` as far as the ends say (0 when unknown)."""
        if self._ends is None:
            return 0
        return len(self._ends.get((daemon, job), ()))

    def next_free(self, daemon: str, job: str, held: int) -> int:
        """When the next of ``held`` slots of ``job`` on ``daemon`` taken away would be free, in
        :data:`RESOLUTION` steps from now: negative for a task past its expected end (the more
        the longer past), :data:`IDLE` for an idle slot, 0 for all when ends are unknown."""
        if self._ends is None:
            return 0
        key = (daemon, job)
        ends = self._seen.get(key)
        if ends is None:
            ends = self._seen[key] = self._ends.get(key, ())
        draining = len(ends) - held
        if draining < 0:
            return IDLE
        return round((ends[draining] - self._now) / RESOLUTION)


def expected_ends(starts: Iterable[float], mean: float, now: float) -> list[float]:
    """Expected ends of tasks that started at ``starts``, soonest first, for a job whose tasks
    take ``mean`` seconds on average there (0: none ended yet).

    Each ends ``mean`` after its start: a task past the mean is due (its end is in the past) and
    the one that ran longest is taken as the likeliest to end next (task times of one job vary
    around their mean: the older a task, the closer its end). With no mean known (a new job),
    a task has what it ran left: what it ran is the best guess of its length, the oldest ends
    last.
    """
    if mean > 0:
        return sorted(start + mean for start in starts)
    return sorted(now + max(0.0, now - start) for start in starts)
