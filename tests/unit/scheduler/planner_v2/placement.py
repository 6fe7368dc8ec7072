"""Which daemons a job's slots go on, and which come back when some must.

Three operations on a :class:`~truba.scheduler.draft.DraftAssignment`, none of them a *move* (a slot
taken from one job for another):

- :func:`spread` hands free slots to jobs, one daemon at a time round-robin, preferring daemons
  where the job has nothing yet, then where it has the fewest: a job's slots spread over nodes,
  so losing a node costs each job little. Nothing already placed moves to improve the spread:
  stability beats spread.
- :func:`shed` takes a job's slots beyond its cap (demand or max_slots fell) back from the
  daemons where it holds the most, which also restores its spread.
- :func:`trim` takes slots back from a daemon whose capacity shrank, from the jobs most above
  their share first.

With expected task ends known (:class:`~truba.scheduler.drains.Drains`), :func:`shed` gives back
idle slots first, then those whose tasks end soonest.

They loop per (daemon, job) pair and per job, not per slot, except where a job must stack
several slots on one daemon.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from tests.unit.scheduler.planner_v2.draft import DraftAssignment
from tests.unit.scheduler.planner_v2.drains import Drains
from tests.unit.scheduler.planner_v2.waterfill import distribute


def spread(
    draft: DraftAssignment,
    additions: Sequence[tuple[str, int]],
    daemons: Sequence[str],
    capacity: Mapping[str, int],
) -> None:
    """Places ``additions`` (job, slots), in order, on the free slots of ``daemons``.

    The caller guarantees that the additions fit in the free slots.
    """
    free = {d: capacity[d] - draft.used[d] for d in daemons}
    ring = [d for d in daemons if free[d] > 0]
    at = 0
    full = 0  # daemons in the ring with no free slot left
    for job, count in additions:
        if count <= 0 or not ring:
            continue
        where = draft.by_job.setdefault(job, {})
        # Round-robin over daemons where the job holds nothing yet, from where the last job
        # stopped, so consecutive jobs start on different daemons.
        placed = 0
        steps = 0
        size = len(ring)
        while placed < count and steps < size:
            daemon = ring[(at + steps) % size]
            steps += 1
            if free[daemon] > 0 and daemon not in where:
                row = draft.by_daemon[daemon]
                row[job] = row.get(job, 0) + 1
                where[daemon] = 1
                free[daemon] -= 1
                full += free[daemon] == 0
                draft.used[daemon] += 1
                placed += 1
        at = (at + steps) % size
        draft.totals[job] = draft.totals.get(job, 0) + placed
        if placed < count:
            # Every daemon with room has some of the job: level its count over them.
            open_ = [d for d in ring if free[d] > 0]
            extra = distribute([where.get(d, 0) for d in open_], [free[d] for d in open_], count - placed)
            for daemon, n in zip(open_, extra, strict=True):
                draft.add(daemon, job, n)
                free[daemon] -= n
                full += n > 0 and free[daemon] == 0
        if 2 * full > len(ring):
            ring, at = _compact(ring, at, free)
            full = 0


def _compact(ring: list[str], at: int, free: Mapping[str, int]) -> tuple[list[str], int]:
    """Drops full daemons from the ring, keeping the round-robin position."""
    live = [d for d in ring if free[d] > 0]
    before = sum(1 for d in ring[:at] if free[d] > 0)
    return live, (before % len(live)) if live else 0


def shed(draft: DraftAssignment, job: str, count: int, drains: Drains | None = None) -> None:
    """Takes ``count`` of ``job``'s slots back, from the daemons where it holds the most; with
    ``drains`` known, those that free soonest first (idle ones at once), then the same."""
    where = sorted(draft.by_job.get(job, {}).items())
    if count <= 0 or not where:
        return
    if drains is not None and drains.known:
        _shed_soonest(draft, job, count, drains)
        return
    take = distribute([-n for _, n in where], [n for _, n in where], count)
    for (daemon, _), n in zip(where, take, strict=True):
        draft.remove(daemon, job, n)


def _shed_soonest(draft: DraftAssignment, job: str, count: int, drains: Drains) -> None:
    held = dict(draft.by_job[job])
    heap = [(drains.next_free(d, job, n), -n, d) for d, n in held.items()]
    heapq.heapify(heap)
    while count > 0 and heap:
        _, _, daemon = heapq.heappop(heap)
        draft.remove(daemon, job)
        count -= 1
        held[daemon] -= 1
        if held[daemon]:
            heapq.heappush(heap, (drains.next_free(daemon, job, held[daemon]), -held[daemon], daemon))


def trim(
    draft: DraftAssignment, daemon: str, count: int, excess: dict[str, float], ranks: Mapping[str, int]
) -> None:
    """Takes ``count`` slots back on ``daemon``, from the jobs with the most ``excess`` first.

    ``excess`` is each job's slots minus its share, updated here; ties lose the newest job's
    slot first.
    """
    row = sorted(draft.by_daemon[daemon].items())
    if count <= 0 or not row:
        return
    take = distribute(
        [-excess.get(j, 0.0) for j, _ in row], [n for _, n in row], count, [-ranks.get(j, 0) for j, _ in row]
    )
    for (job, _), n in zip(row, take, strict=True):
        draft.remove(daemon, job, n)
        excess[job] = excess.get(job, 0.0) - n
