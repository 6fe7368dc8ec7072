"""The assignment a plan is building, indexed both ways, with per-job and per-daemon totals.

The planner starts the new map from the current one (slots stay with their job) and changes it
one step at a time: a slot handed out, a slot taken back, a slot moved. Every step updates the
four views together, so each phase reads whichever view is cheap for it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import final

Assignment = dict[str, dict[str, int]]
"""daemon id -> job id -> slots. Jobs with no slots on a daemon are absent."""


@final
class DraftAssignment:
    """daemon -> job -> slots (``by_daemon``) and job -> daemon -> slots (``by_job``), in step.

    Args:
        daemons: every daemon of the plan, in the order the result lists them.
        current: what daemons hold now; entries of other daemons are dropped.
        keep: the jobs whose entries of ``current`` may stay on a daemon (runnable jobs the
            daemon allows); other entries are freed at once.
    """

    def __init__(
        self,
        daemons: Iterable[str],
        current: Mapping[str, Mapping[str, int]],
        keep: Callable[[str], Container[str]],
    ) -> None:
        self.by_daemon: Assignment = {}
        self.by_job: dict[str, dict[str, int]] = {}
        self.totals: dict[str, int] = {}
        self.used: dict[str, int] = {}
        for daemon in daemons:
            kept = keep(daemon)
            row = {j: n for j, n in current.get(daemon, {}).items() if n > 0 and j in kept}
            self.by_daemon[daemon] = row
            self.used[daemon] = sum(row.values())
            for job, n in row.items():
                self.by_job.setdefault(job, {})[daemon] = n
                self.totals[job] = self.totals.get(job, 0) + n

    def held(self, daemon: str, job: str) -> int:
        """Slots ``job`` holds on ``daemon``."""
        return self.by_daemon[daemon].get(job, 0)

    def add(self, daemon: str, job: str, n: int = 1) -> None:
        """Gives ``job`` ``n`` more slots on ``daemon`` (capacity is the caller's concern)."""
        if n <= 0:
            return
        row = self.by_daemon[daemon]
        row[job] = row.get(job, 0) + n
        where = self.by_job.setdefault(job, {})
        where[daemon] = where.get(daemon, 0) + n
        self.totals[job] = self.totals.get(job, 0) + n
        self.used[daemon] += n

    def remove(self, daemon: str, job: str, n: int = 1) -> None:
        """Takes ``n`` of ``job``'s slots on ``daemon`` back (it must hold them)."""
        if n <= 0:
            return
        row = self.by_daemon[daemon]
        left = row[job] - n
        if left < 0:
            raise ValueError(f"job {job!r} holds {row[job]} slots on {daemon!r}, not {n}")
        where = self.by_job[job]
        if left:
            row[job] = left
            where[daemon] = left
        else:
            del row[job]
            del where[daemon]
        self.totals[job] -= n
        self.used[daemon] -= n

    def move(self, daemon: str, donor: str, receiver: str) -> None:
        """One slot on ``daemon`` changes hands."""
        self.remove(daemon, donor)
        self.add(daemon, receiver)
