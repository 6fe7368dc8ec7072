"""The planner: a pure function from (daemons, jobs, current assignment) to the next assignment.

This is the walking-skeleton policy: every daemon splits its slots equally among the runnable
jobs it allows (see :mod:`truba.scheduler.allow`). When the slots do not divide evenly, the
remainder goes first to jobs that already hold one slot above the equal share on that daemon, so
they keep it, then to the oldest jobs. The result depends only on the inputs; planning again with
unchanged inputs returns the current assignment, so nothing moves.

Weighted fair share by importance, demand caps, hysteresis and preemption replace the split in a
later version; the signature stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from truba.scheduler.allow import allowed
from truba.scheduler.model import Job

Assignment = dict[str, dict[str, int]]
"""daemon id -> job id -> slots. Jobs with no slots on a daemon are absent."""


@dataclass(frozen=True)
class Capacity:
    """What one connected daemon offers: its slots and the handlers it allows."""

    daemon_id: str
    slots: int
    allow: tuple[str, ...]


def plan(
    daemons: Iterable[Capacity],
    jobs: Iterable[Job],
    current: Mapping[str, Mapping[str, int]],
) -> Assignment:
    """The next assignment: every daemon appears, jobs with no slots on a daemon are left out.

    Args:
        daemons: connected daemons.
        jobs: known jobs; those not runnable (finished, cancelled) are ignored.
        current: what each daemon holds now (daemon id -> job id -> slots); missing means nothing.
    """
    runnable = sorted((job for job in jobs if job.runnable), key=lambda job: (job.created_at, job.id))
    # Daemons of one deployment mostly share an allow-list: match each (handler, list) once.
    matches: dict[tuple[str, tuple[str, ...]], bool] = {}

    def allows(daemon: Capacity, handler: str) -> bool:
        key = (handler, daemon.allow)
        if key not in matches:
            matches[key] = allowed(handler, daemon.allow)
        return matches[key]

    assignment: Assignment = {}
    for daemon in daemons:
        eligible = [job.id for job in runnable if allows(daemon, job.handler)]
        assignment[daemon.daemon_id] = _split(daemon.slots, eligible, current.get(daemon.daemon_id, {}))
    return assignment


def _split(slots: int, job_ids: Sequence[str], held: Mapping[str, int]) -> dict[str, int]:
    """Splits ``slots`` equally over ``job_ids`` (oldest first); see the module docstring."""
    if not job_ids or slots <= 0:
        return {}
    base, extra = divmod(slots, len(job_ids))
    # Jobs already above the base share come first, then age; stable, so ties keep age order.
    order = sorted(range(len(job_ids)), key=lambda i: held.get(job_ids[i], 0) <= base)
    favoured = set(order[:extra])
    split = {job_id: base + (i in favoured) for i, job_id in enumerate(job_ids)}
    return {job_id: n for job_id, n in split.items() if n > 0}


def job_totals(assignment: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Slots per job over all daemons."""
    totals: dict[str, int] = {}
    for jobs in assignment.values():
        for job_id, slots in jobs.items():
            totals[job_id] = totals.get(job_id, 0) + slots
    return totals
