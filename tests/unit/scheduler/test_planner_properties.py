"""Properties every plan has, over arbitrary daemons, jobs and current assignments (hypothesis)."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from truba.scheduler.allow import allowed
from truba.scheduler.fairshare import fair_shares
from truba.scheduler.planner import Capacity, JobSpec, Plan, Policy, job_totals, plan
from truba.scheduler.waterfill import distribute

ANY = ("*",)
HANDLERS = ["examples.a:f", "examples.b:g", "other.c:h"]
PATTERNS = [(), ANY, ("examples.*",), ("other.*",), ("examples.a:f", "other.*")]
UNCAPPED = 10**9
EAGER = Policy(min_hold=0.0, max_moves=UNCAPPED)
TOLERANCE = 1e-6
T = TypeVar("T")


@dataclass(frozen=True)
class Case:
    daemons: list[Capacity]
    jobs: list[JobSpec]
    current: dict[str, dict[str, int]]
    now: float = 0.0
    given_at: dict[tuple[str, str], float] | None = None
    policy: Policy = EAGER

    def plan(self, current: dict[str, dict[str, int]] | None = None, policy: Policy | None = None) -> Plan:
        return plan(
            self.daemons,
            self.jobs,
            self.current if current is None else current,
            now=self.now,
            given_at=self.given_at,
            policy=self.policy if policy is None else policy,
        )

    @property
    def slots(self) -> int:
        return sum(d.slots for d in self.daemons)


def ceiling(job: JobSpec, reachable: int) -> int:
    cap = reachable
    if job.demand is not None:
        cap = min(cap, job.demand)
    if job.max_slots:
        cap = min(cap, job.max_slots)
    return cap


@st.composite
def currents(draw: st.DrawFn, daemons: list[Capacity], job_ids: list[str]) -> dict[str, dict[str, int]]:
    """Anything a daemon might report: over capacity, gone jobs, a gone daemon, disallowed jobs."""
    ids = [*job_ids, "gone-job"]
    current: dict[str, dict[str, int]] = {}
    for daemon_id, slots in [(d.daemon_id, d.slots) for d in daemons] + [("gone-daemon", 3)]:
        row: dict[str, int] = {}
        for _ in range(draw(st.integers(0, 3))):
            row[draw(st.sampled_from(ids))] = draw(st.integers(0, slots + 2))
        current[daemon_id] = row
    return current


@st.composite
def saturated(draw: st.DrawFn, hold: bool = False) -> Case:
    """Every daemon allows every job and no demand is known (unbounded)."""
    daemons = [Capacity(f"d{i}", draw(st.integers(1, 12)), ANY) for i in range(draw(st.integers(1, 5)))]
    jobs = [
        JobSpec(
            f"j{i}",
            HANDLERS[0],
            draw(st.sampled_from([0.1, 0.25, 0.5, 1.0, 1.0, 2.0, 3.0, 10.0]) | st.floats(0.05, 20.0)),
            float(draw(st.integers(0, 3))),
            min_slots=draw(st.sampled_from([0, 0, 0, 1, 3])),
            max_slots=draw(st.sampled_from([0, 0, 0, 2, 6])),
        )
        for i in range(draw(st.integers(1, 7)))
    ]
    return Case(daemons, jobs, draw(currents(daemons, [j.id for j in jobs])))


@st.composite
def anything(draw: st.DrawFn) -> Case:
    """Allow-lists, demand, zero-slot daemons, holds and move caps."""
    daemons = [
        Capacity(f"d{i}", draw(st.integers(0, 10)), draw(st.sampled_from(PATTERNS)))
        for i in range(draw(st.integers(0, 5)))
    ]
    jobs = [
        JobSpec(
            f"j{i}",
            draw(st.sampled_from(HANDLERS)),
            draw(st.sampled_from([0.2, 1.0, 1.0, 3.0])),
            float(draw(st.integers(0, 3))),
            min_slots=draw(st.sampled_from([0, 0, 2])),
            max_slots=draw(st.sampled_from([0, 0, 3])),
            demand=draw(st.sampled_from([None, None, 0, 1, 4, 30])),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    current = draw(currents(daemons, [j.id for j in jobs]))
    now = 100.0
    given_at = {(d, j): draw(st.sampled_from([99.9, 50.0])) for d, row in current.items() for j in row}
    policy = Policy(
        deadband=draw(st.sampled_from([0.0, 0.5, 1.0])),
        max_moves=draw(st.sampled_from([0, 1, 3, UNCAPPED])),
        min_hold=draw(st.sampled_from([0.0, 0.5])),
    )
    return Case(daemons, jobs, current, now, draw(st.none() | st.just(given_at)), policy)


def reference_shares(case: Case) -> list[float] | None:
    """Weighted max-min fair shares on one pool, by bisection; None if the minimums do not fit."""
    capacity = case.slots
    hi = [ceiling(j, capacity) for j in case.jobs]
    lo = [min(j.min_slots, h) for j, h in zip(case.jobs, hi, strict=True)]
    if sum(lo) > capacity:
        return None
    if sum(hi) <= capacity:
        return [float(h) for h in hi]

    def at(lam: float) -> list[float]:
        return [min(h, max(low, j.importance * lam)) for j, low, h in zip(case.jobs, lo, hi, strict=True)]

    low_lam, high_lam = 0.0, capacity / min(j.importance for j in case.jobs) + 1.0
    for _ in range(200):
        mid = (low_lam + high_lam) / 2
        low_lam, high_lam = (mid, high_lam) if sum(at(mid)) < capacity else (low_lam, mid)
    return at(high_lam)


# -- fairness --------------------------------------------------------------------------------------


@given(saturated())
def test_under_saturation_every_job_is_within_one_slot_of_its_weighted_share(case: Case) -> None:
    result = case.plan()
    totals = job_totals(result.assignment)
    expected = reference_shares(case)
    if expected is None:
        return
    for job, share in zip(case.jobs, expected, strict=True):
        assert math.isclose(result.targets[job.id], share, abs_tol=TOLERANCE)
        assert abs(totals.get(job.id, 0) - share) <= 1 + TOLERANCE, (job.id, totals, expected)
        # Minimums hold whenever they fit (reference_shares returned shares).
        assert totals.get(job.id, 0) >= min(job.min_slots, ceiling(job, case.slots))


@given(saturated(), st.integers(1, 4))
def test_a_move_cap_only_spreads_the_same_moves_over_more_plans(case: Case, cap: int) -> None:
    once = case.plan()
    policy = Policy(min_hold=0.0, max_moves=cap)
    current = case.current
    rounds = 0
    while True:
        result = case.plan(current, policy)
        rounds += 1
        assert result.moves <= cap
        current = result.assignment
        if result.settled:
            break
        assert rounds <= once.moves
    assert rounds <= max(1, math.ceil(once.moves / cap))
    assert current == once.assignment


# -- limits --------------------------------------------------------------------------------------


@given(anything())
def test_caps_capacity_and_allow_lists_hold_and_gone_things_are_freed(case: Case) -> None:
    result = case.plan()
    specs = {j.id: j for j in case.jobs}
    assert set(result.assignment) == {d.daemon_id for d in case.daemons}
    totals = job_totals(result.assignment)
    assert result.moves <= case.policy.max_moves
    for daemon in case.daemons:
        row = result.assignment[daemon.daemon_id]
        assert sum(row.values()) <= daemon.slots
        assert all(n > 0 for n in row.values())
        assert all(job_id in specs and allowed(specs[job_id].handler, daemon.allow) for job_id in row)
    for job_id, total in totals.items():
        assert total <= ceiling(specs[job_id], UNCAPPED)


@given(anything())
def test_no_slot_idles_while_a_job_that_may_use_it_wants_more(case: Case) -> None:
    result = case.plan()
    totals = job_totals(result.assignment)
    for daemon in case.daemons:
        if sum(result.assignment[daemon.daemon_id].values()) < daemon.slots:
            for job in case.jobs:
                if allowed(job.handler, daemon.allow):
                    assert totals.get(job.id, 0) >= ceiling(job, UNCAPPED), (daemon, job)


@given(saturated(), st.lists(st.sampled_from([None, 0, 1, 2, 5]), min_size=7, max_size=7))
def test_minimums_hold_with_demand_when_they_fit(case: Case, demands: list[int | None]) -> None:
    jobs = [
        JobSpec(j.id, j.handler, j.importance, j.created_at, j.min_slots, j.max_slots, d)
        for j, d in zip(case.jobs, demands, strict=False)
    ]
    case = Case(case.daemons, jobs, case.current)
    floors = {j.id: min(j.min_slots, ceiling(j, case.slots)) for j in jobs}
    if sum(floors.values()) > case.slots:
        return
    totals = job_totals(case.plan().assignment)
    assert all(totals.get(job_id, 0) >= floor for job_id, floor in floors.items())


# -- stability -----------------------------------------------------------------------------------


@given(anything())
def test_a_settled_plan_planned_again_moves_nothing(case: Case) -> None:
    first = case.plan()
    if not first.settled:
        return
    again = case.plan(first.assignment)
    assert again.assignment == first.assignment
    assert (again.moves, again.settled) == (0, True)


@given(saturated())
def test_without_hold_or_cap_the_first_plan_settles_and_the_second_is_identical(case: Case) -> None:
    first = case.plan()
    assert first.settled
    assert case.plan(first.assignment).assignment == first.assignment


@given(anything(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_the_order_of_its_inputs(case: Case, rnd: random.Random) -> None:
    def shuffled(items: list[T]) -> list[T]:
        return rnd.sample(items, len(items))

    current = {d: dict(shuffled(list(row.items()))) for d, row in shuffled(list(case.current.items()))}
    again = Case(shuffled(case.daemons), shuffled(case.jobs), current, case.now, case.given_at, case.policy)
    assert again.plan() == case.plan()


# -- the integer water-filling primitive -----------------------------------------------------------


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, -1.25, 2.0]) | st.floats(-5, 5), st.integers(0, 6)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 40),
)
def test_distribute_equals_handing_out_one_unit_at_a_time(items: list[tuple[float, int]], total: int) -> None:
    keys = [k for k, _ in items]
    room = [r for _, r in items]
    expected = [0] * len(items)
    heap = [(round(k, 9), i) for i, (k, r) in enumerate(items) if r > 0]
    heapq.heapify(heap)
    for _ in range(total):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        expected[i] += 1
        if expected[i] < room[i]:
            heapq.heappush(heap, (round(keys[i] + expected[i], 9), i))
    assert distribute(keys, room, total) == expected


# -- fair shares under allow-lists -----------------------------------------------------------------


@st.composite
def pooled(
    draw: st.DrawFn,
) -> tuple[list[float], list[float], list[float], list[frozenset[int]], list[float]]:
    pools = draw(st.integers(1, 4))
    capacity = [float(draw(st.integers(0, 12))) for _ in range(pools)]
    n = draw(st.integers(1, 7))
    weights = [draw(st.sampled_from([0.2, 1.0, 1.0, 3.0, 7.0])) for _ in range(n)]
    hi = [float(draw(st.sampled_from([1, 3, 8, 100]))) for _ in range(n)]
    lo = [min(h, float(draw(st.sampled_from([0, 0, 0, 2])))) for h in hi]
    eligible = [frozenset(draw(st.sets(st.integers(0, pools - 1), min_size=1))) for _ in range(n)]
    return weights, lo, hi, eligible, capacity


@given(pooled())
def test_shares_over_pools_are_feasible_and_max_min_fair(
    case: tuple[list[float], list[float], list[float], list[frozenset[int]], list[float]],
) -> None:
    weights, lo, hi, eligible, capacity = case
    reach = [min(h, sum(capacity[p] for p in e)) for h, e in zip(hi, eligible, strict=True)]
    shares = fair_shares(
        weights, [min(a, r) for a, r in zip(lo, reach, strict=True)], reach, eligible, capacity
    )
    n = len(weights)
    load = [0.0] * len(capacity)
    for j in range(n):
        split = shares.by_pool[j]
        assert set(split) <= eligible[j]
        assert math.isclose(sum(split.values()), shares.targets[j], abs_tol=TOLERANCE)
        assert -TOLERANCE <= shares.targets[j] <= reach[j] + TOLERANCE
        for p, x in split.items():
            load[p] += x
    assert all(used <= cap + TOLERANCE for used, cap in zip(load, capacity, strict=True))
    # Max-min: a job below its ceiling cannot grow, even by shifting others along alternating
    # paths (the residual graph), without taking from a job with no more per unit of importance.
    # (A job at or below its min_slots is protected by it, whatever its importance.)
    floors = [min(a, r) for a, r in zip(lo, reach, strict=True)]
    for j in range(n):
        if shares.targets[j] >= reach[j] - TOLERANCE:
            continue
        level = shares.targets[j] / weights[j]
        seen_jobs, todo = {j}, [j]
        seen_pools: set[int] = set()
        while todo:
            k = todo.pop()
            for p in eligible[k] - seen_pools:
                seen_pools.add(p)
                assert load[p] >= capacity[p] - TOLERANCE, f"job {j} could grow into pool {p}"
                for m in range(n):
                    if m not in seen_jobs and shares.by_pool[m].get(p, 0.0) > TOLERANCE:
                        seen_jobs.add(m)
                        todo.append(m)
        for m in seen_jobs - {j}:
            at_floor = shares.targets[m] <= floors[m] + TOLERANCE
            assert at_floor or shares.targets[m] / weights[m] <= level + TOLERANCE, (j, m, shares)
