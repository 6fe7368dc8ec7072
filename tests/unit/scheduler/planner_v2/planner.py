"""The planner: a pure function from (daemons, jobs, current assignment) to the next plan.

Each job gets its weighted max-min fair share of slots ("water-filling" by importance), capped
by what it can use now (its demand: a job that needs fewer slots gives the rest away) and by
its max_slots, raised to its min_slots, over the daemons whose ``--allow`` patterns match its
handler (:mod:`~truba.scheduler.fairshare`). The new map is built from the current one, so
slots stay with their job unless something below says otherwise, in this order:

1. **Freed at once** (not moves, no hold): slots on daemons that are gone, of jobs that are not
   runnable or not allowed there any more, beyond a job's demand or max_slots
   (:func:`~truba.scheduler.placement.shed`), beyond a daemon's (shrunk) capacity
   (:func:`~truba.scheduler.placement.trim`).
2. **Free slots handed out** (not moves either, and not limited by ``max_moves``: giving an idle
   slot interrupts nobody and cannot flap): pool by pool, most contended first, each slot to the
   job furthest below its share there, older job on ties (largest remainder), and on, past the
   shares, while some job could use it: no slot idles while an allowed job has demand left.
   Spread over daemons (:func:`~truba.scheduler.placement.spread`).
3. **Moves** from jobs above their share to jobs below it, under Kueue's rule, a deadband and a
   minimum hold, at most ``max_moves`` (:mod:`~truba.scheduler.moves`); through a short chain
   of jobs when allow-lists keep the two apart (:mod:`~truba.scheduler.chains`).

Given each running task's expected end (``ends``, graceful preemption: a slot serves its new
job only once its task ends), steps 1 and 3 take the slots that free soonest: idle ones, then
those whose tasks end first (:mod:`~truba.scheduler.drains`); the shares and how many slots
each job gives do not depend on it.

Planning again with unchanged inputs changes nothing: step 1 has nothing left to free, step 2
no free slot an allowed job can use, step 3 no allowed move.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from tests.unit.scheduler.planner_v2.draft import Assignment, DraftAssignment
from tests.unit.scheduler.planner_v2.drains import Drains, Ends
from tests.unit.scheduler.planner_v2.fairshare import Shares, fair_shares
from tests.unit.scheduler.planner_v2.handler_pools import HandlerPools
from tests.unit.scheduler.planner_v2.moves import rebalance
from tests.unit.scheduler.planner_v2.placement import shed, spread, trim
from tests.unit.scheduler.planner_v2.waterfill import KEY_DIGITS, distribute

__all__ = [
    "SCHEDULER_POLICY",
    "Assignment",
    "Capacity",
    "JobSpec",
    "Plan",
    "Policy",
    "gains",
    "job_totals",
    "plan",
]


@dataclass(frozen=True)
class Capacity:
    """What one connected daemon offers: its slots and the handlers it allows."""

    daemon_id: str
    slots: int
    allow: tuple[str, ...]


@dataclass(frozen=True)
class JobSpec:
    """A runnable job as the planner sees it.

    Attributes:
        importance: its weight in the fair share (> 0).
        created_at: breaks ties, older first, then ``id``.
        min_slots: slots it keeps whatever its importance, if the cluster and its demand allow.
        max_slots: the most it gets; 0 is no cap.
        demand: slots it can use now (running + backlog); None (unknown) is unbounded.

    Raises:
        ValueError: importance is not positive, or a count is negative.
    """

    id: str
    handler: str
    importance: float
    created_at: float
    min_slots: int = 0
    max_slots: int = 0
    demand: int | None = None

    def __post_init__(self) -> None:
        if not self.importance > 0 or math.isinf(self.importance):
            raise ValueError(f"job {self.id}: importance must be > 0 and finite, not {self.importance}")
        if self.min_slots < 0 or self.max_slots < 0 or (self.demand is not None and self.demand < 0):
            raise ValueError(f"job {self.id}: min_slots, max_slots and demand must be >= 0")


@dataclass(frozen=True)
class Policy:
    """How eagerly the planner moves slots between jobs (free slots are always handed out).

    Attributes:
        deadband: slots; two jobs that are both less than this off their fair shares do not
            trade a slot, even if Kueue's rule would let them. 1.0: integer slots leave a job up
            to one slot off a fractional share, and trading inside that is rounding noise (a
            wobble of the shares, e.g. of a demand estimate, would move slots back and forth),
            while a job a full slot short (3 + 1 for two equal jobs on 4 slots) is still fixed.
            Up to 1.0 every job still ends within one slot of its share (at 0.5 or less Kueue's
            rule alone decides).
        max_moves: slots moved from one job to another per plan, at least; each may interrupt a
            running task. 512 lets a cluster of up to 512 slots converge in one plan. 0 forbids
            moves. A plan stopped short says so (:attr:`Plan.settled`).
        max_moves_share: on a larger cluster the cap is this share of its slots instead (when
            that is more than ``max_moves``); 0 (the default here) keeps ``max_moves`` alone,
            the scheduler's assigner uses 0.5 (:data:`SCHEDULER_POLICY`). 0.5 lets a new job
            take up to half of a 60,000-slot cluster in one plan, where a fixed 512 took thirty
            plans, each a replan delay apart (seconds before the job reached every daemon it was
            due). The churn of one event is the same either way (the moves are owed); the cap
            spreads it over at most two plans, and still stops a runaway plan.
        min_hold: seconds a job keeps a slot it got on a daemon before that daemon's slots of it
            may be moved to another job: a new job's share arrives within a second even when
            another new job just got slots, yet a slot never changes hands faster than this.
    """

    deadband: float = 1.0
    max_moves: int = 512
    min_hold: float = 0.5
    max_moves_share: float = 0.0

    def __post_init__(self) -> None:
        if self.deadband < 0 or self.max_moves < 0 or self.min_hold < 0:
            raise ValueError("deadband, max_moves and min_hold must be >= 0")
        if not 0 <= self.max_moves_share <= 1:
            raise ValueError("max_moves_share must be within [0, 1]")

    def move_cap(self, slots: int) -> int:
        """The most slots one plan moves on a cluster of ``slots`` slots."""
        if self.max_moves == 0:
            return 0
        return max(self.max_moves, int(self.max_moves_share * slots))


DEFAULT_POLICY: Final = Policy()
SCHEDULER_POLICY: Final = Policy(max_moves_share=0.5)
"""The scheduler's: a large cluster moves up to half its slots per plan (see ``max_moves_share``)."""


@dataclass(frozen=True)
class Plan:
    """The next assignment and how it came about."""

    assignment: Assignment
    """daemon -> job -> slots; every daemon present, jobs without slots on it absent."""
    targets: dict[str, float]
    """Job id -> fair share in (fractional) slots: what the job should hold once settled."""
    moves: int
    """Slots taken from one job for another this plan (freed and idle slots not counted)."""
    settled: bool
    """False if ``max_moves`` or ``min_hold`` stopped a move: plan again soon (within min_hold)."""


def plan(
    daemons: Iterable[Capacity],
    jobs: Iterable[JobSpec],
    current: Mapping[str, Mapping[str, int]],
    *,
    now: float = 0.0,
    given_at: Mapping[tuple[str, str], float] | None = None,
    policy: Policy = DEFAULT_POLICY,
    ends: Ends | None = None,
) -> Plan:
    """Plans the next assignment; see the module docstring.

    Args:
        daemons: connected daemons (ids unique; a later duplicate replaces an earlier one).
        jobs: runnable jobs (ids unique).
        current: what each daemon holds now (daemon id -> job id -> slots); missing is nothing.
        now: the time, on the clock of ``given_at``.
        given_at: (daemon id, job id) -> when the job last gained a slot on that daemon (see
            :func:`gains`); missing means long ago.
        policy: deadband, move cap and hold.
        ends: (daemon id, job id) -> when the job's tasks running there are expected to end,
            soonest first, on the clock of ``now`` (:mod:`~truba.scheduler.drains`). Moves and
            sheds then take the slots that free soonest (graceful preemption: a slot serves its
            new job once its task ends). None: unknown, chosen by spread alone.
    """
    drains = Drains(ends, now)
    caps = {c.daemon_id: c for c in daemons}
    order = sorted(caps)
    slots = {d: max(caps[d].slots, 0) for d in order}
    specs = {job.id: job for job in jobs}
    ids = sorted(specs, key=lambda j: (specs[j].created_at, j))
    ranks = {job_id: i for i, job_id in enumerate(ids)}
    pools = HandlerPools([(d, slots[d], caps[d].allow) for d in order], (s.handler for s in specs.values()))
    shares, ceiling = _shares(pools, [specs[j] for j in ids])
    targets = dict(zip(ids, shares.targets, strict=True))
    handler = {job_id: spec.handler for job_id, spec in specs.items()}
    jobs_of: list[list[tuple[int, str]]] = [[] for _ in pools.members]
    for rank, job_id in enumerate(ids):
        for pool in pools.of_handler[specs[job_id].handler]:
            jobs_of[pool].append((rank, job_id))

    # 1. Free what must go, at once.
    allowed_on = [{job_id for _, job_id in members} for members in jobs_of]
    nobody: frozenset[str] = frozenset()

    def keep(daemon: str) -> set[str] | frozenset[str]:
        pool = pools.of_daemon[daemon]
        return nobody if pool is None else allowed_on[pool]

    draft = DraftAssignment(order, current, keep)
    _free_excess(draft, slots, ceiling, targets, ranks, drains)

    # 2 and 3. Hand out free slots; move; a move may leave its donor wanting a slot that is free
    # elsewhere, so hand out again until nothing changes (each round uses up a free slot).
    floors = {j: min(specs[j].min_slots, ceiling[j], math.floor(targets[j] + 1e-9)) for j in ids}
    given = given_at or {}

    def on_hold(daemon: str, job_id: str) -> bool:
        at = given.get((daemon, job_id))
        return at is not None and now - at < policy.min_hold

    moves = 0
    settled = True
    cap = policy.move_cap(sum(slots.values()))
    _hand_out(draft, pools, shares, jobs_of, ceiling, slots)
    while True:
        outcome = rebalance(
            draft,
            targets,
            floors,
            ranks,
            pools=pools,
            slots=slots,
            handler=handler,
            on_hold=on_hold,
            deadband=policy.deadband,
            max_moves=cap - moves,
            drains=drains,
        )
        moves += outcome.moves
        settled = settled and outcome.settled
        if not outcome.moves or not _hand_out(draft, pools, shares, jobs_of, ceiling, slots):
            break
    targets_out = {j: float(round(t, KEY_DIGITS)) for j, t in targets.items()}
    return Plan(draft.by_daemon, targets_out, moves, settled)


def _free_excess(
    draft: DraftAssignment,
    slots: Mapping[str, int],
    ceiling: Mapping[str, int],
    targets: Mapping[str, float],
    ranks: Mapping[str, int],
    drains: Drains,
) -> None:
    """Takes back what no job may keep: beyond its ceiling, then beyond a daemon's capacity."""
    for job_id, held in list(draft.totals.items()):
        if held > ceiling[job_id]:
            shed(draft, job_id, held - ceiling[job_id], drains)
    excess = {j: draft.totals.get(j, 0) - t for j, t in targets.items()}
    for daemon, capacity in slots.items():
        if draft.used[daemon] > capacity:
            trim(draft, daemon, draft.used[daemon] - capacity, excess, ranks)


def _shares(pools: HandlerPools, jobs: list[JobSpec]) -> tuple[Shares, dict[str, int]]:
    """Fair shares of ``jobs`` (oldest first), and each job's ceiling: demand, max, reach."""
    eligible = [pools.of_handler[j.handler] for j in jobs]
    hi = [_ceiling(j, sum(pools.capacity[p] for p in e)) for j, e in zip(jobs, eligible, strict=True)]
    lo = [min(j.min_slots, h) for j, h in zip(jobs, hi, strict=True)]
    shares = fair_shares([j.importance for j in jobs], lo, hi, eligible, [float(c) for c in pools.capacity])
    return shares, {j.id: h for j, h in zip(jobs, hi, strict=True)}


def _ceiling(spec: JobSpec, reachable: int) -> int:
    cap = reachable
    if spec.demand is not None:
        cap = min(cap, spec.demand)
    if spec.max_slots > 0:
        cap = min(cap, spec.max_slots)
    return cap


def _hand_out(
    draft: DraftAssignment,
    pools: HandlerPools,
    shares: Shares,
    jobs_of: list[list[tuple[int, str]]],
    ceiling: Mapping[str, int],
    slots: Mapping[str, int],
) -> int:
    """Gives free slots to jobs, most contended pools first; returns how many it gave.

    In a pool, each slot goes to the job furthest below its share there (older first on ties:
    largest remainder), and on past the shares while a job has room: no slot idles while a job
    that may use it has demand left. ``jobs_of[pool]`` lists (rank, job id) of the jobs it may
    run.
    """
    given = 0
    for pool in shares.fill_order:
        members = pools.members[pool]
        free = sum(slots[d] - draft.used[d] for d in members)
        candidates = [(r, j) for r, j in jobs_of[pool] if draft.totals.get(j, 0) < ceiling[j]]
        if free <= 0 or not candidates:
            continue
        keys = [_in_pool(draft, j, pools, pool) - shares.by_pool[r].get(pool, 0.0) for r, j in candidates]
        rooms = [ceiling[j] - draft.totals.get(j, 0) for _, j in candidates]
        counts = distribute(keys, rooms, free, [r for r, _ in candidates])
        additions = [(j, n) for (_, j), n in zip(candidates, counts, strict=True) if n > 0]
        spread(draft, additions, members, slots)
        given += sum(counts)
    return given


def _in_pool(draft: DraftAssignment, job_id: str, pools: HandlerPools, pool: int) -> int:
    where = draft.by_job.get(job_id, {})
    if len(pools.members) == 1:
        return sum(where.values())
    return sum(n for d, n in where.items() if pools.of_daemon[d] == pool)


def job_totals(assignment: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Slots per job over all daemons."""
    totals: dict[str, int] = {}
    for jobs in assignment.values():
        for job_id, slots in jobs.items():
            totals[job_id] = totals.get(job_id, 0) + slots
    return totals


def gains(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> list[tuple[str, str]]:
    """(daemon, job) pairs that hold more slots ``after`` than ``before``.

    The caller records ``given_at[pair] = now`` for each, the input :func:`plan` needs for
    ``min_hold``.
    """
    return [
        (daemon, job_id)
        for daemon, row in after.items()
        for job_id, n in row.items()
        if n > before.get(daemon, {}).get(job_id, 0)
    ]
