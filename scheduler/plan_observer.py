"""What a plan tells the scheduler's metrics, and the demand a plan can tell apart.

:class:`PlanObserver` is the assigner's observer (the scheduler's metrics):
:func:`observe_revocations` tells it the slots each job lost to a plan. :func:`effective_demand`
is a job's demand as the planner sees it, which the assigner compares to decide whether a report
of new counters needs a plan at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from truba.scheduler.planner import Assignment, JobSpec, job_totals


class PlanObserver(Protocol):
    """What the assigner tells its observer (the scheduler's metrics) about each plan."""

    def planned(self, seconds: float, live_jobs: Sequence[str]) -> None:
        """A plan took ``seconds``; ``live_jobs`` are the runnable jobs it covered."""

    def revoked(self, job_id: str, slots: int, *, preempted: bool) -> None:
        """The plan took ``slots`` from runnable job ``job_id``; ``preempted``: it still had work."""

    def pushed(self) -> None:
        """An assignment went to a daemon."""


def effective_demand(demand: int | None, slots: int) -> int:
    """A job's demand as the planner tells it apart on a cluster of ``slots`` slots: it only
    caps the job's slots (with what its daemons have, at most ``slots``), so unknown demand and
    any demand of ``slots`` or more plan alike."""
    return slots if demand is None else min(demand, slots)


def observe_revocations(
    observer: PlanObserver, before: Assignment, after: Assignment, specs: Sequence[JobSpec]
) -> None:
    """Tells ``observer`` the slots each runnable job lost from ``before`` to ``after``: preempted
    when the job's demand (unknown counts as unbounded) exceeds what it keeps, released otherwise."""
    kept = job_totals(after)
    lost: dict[str, int] = {}
    for daemon_id, held in before.items():
        now = after.get(daemon_id, {})
        for job_id, n in held.items():
            gone = n - now.get(job_id, 0)
            if gone > 0:
                lost[job_id] = lost.get(job_id, 0) + gone
    for spec in specs:
        taken = lost.get(spec.id, 0)
        if taken:
            preempted = spec.demand is None or spec.demand > kept.get(spec.id, 0)
            observer.revoked(spec.id, taken, preempted=preempted)
