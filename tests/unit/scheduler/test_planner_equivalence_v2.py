"""Today's planner makes exactly the plans of the frozen ``planner_v2`` (3800df1), packing on.

``planner_v2`` is the planner as it was before its move loop was made cheaper (the donor-daemon
index's per-pair cache, drains read once per pair and daemon, the loop's helpers inlined): those
changes must not change a single slot. Unlike ``test_planner_equivalence.py`` (whose reference
predates packing, so its larger clusters are compared with packing off), the plans here are
compared as they are, packing included: small random clusters (the same seeded cases), and busy
clusters of up to 5,600 slots that new jobs join far below their share (the bench's case:
``moves.PACK_DEFICIT`` applies), with allow-lists, holds, expected task ends, min/max slots,
demands and move caps; each plan and the next one from its result.
"""

from __future__ import annotations

import random

import pytest

from tests.unit.scheduler.planner_v2 import planner as v2
from tests.unit.scheduler.test_planner_equivalence import HANDLERS, PATTERNS, Case, Current, Ends, Given
from truba.scheduler import planner as now

Daemon = tuple[str, int, tuple[str, ...]]
Spec = tuple[str, str, float, float, int, int, int | None]
PolicyArgs = tuple[float, int, float, float]


def run_v2(
    daemons: list[Daemon],
    jobs: list[Spec],
    current: Current,
    given: Given,
    t: float,
    policy: PolicyArgs,
    ends: Ends | None,
) -> v2.Plan:
    return v2.plan(
        [v2.Capacity(*d) for d in daemons],
        [v2.JobSpec(*j) for j in jobs],
        current,
        now=t,
        given_at=given,
        policy=v2.Policy(*policy),
        ends=ends,
    )


def run_now(
    daemons: list[Daemon],
    jobs: list[Spec],
    current: Current,
    given: Given,
    t: float,
    policy: PolicyArgs,
    ends: Ends | None,
) -> now.Plan:
    return now.plan(
        [now.Capacity(*d) for d in daemons],
        [now.JobSpec(*j) for j in jobs],
        current,
        now=t,
        given_at=given,
        policy=now.Policy(*policy),
        ends=ends,
    )


def _same(a: v2.Plan, b: now.Plan) -> None:
    assert b.assignment == a.assignment
    assert b.targets == a.targets
    assert (b.moves, b.settled) == (a.moves, a.settled)


def _rounds(
    daemons: list[Daemon],
    jobs: list[Spec],
    current: Current,
    given: Given,
    t: float,
    policy: PolicyArgs,
    ends: Ends | None,
    rounds: int,
) -> int:
    """Plans ``rounds`` times from ``current`` with both planners (each next plan from the last
    one's result, holds noted as the assigner notes them); returns the moves made in all."""
    moves = 0
    for _ in range(rounds):
        ref = run_v2(daemons, jobs, current, given, t, policy, ends)
        _same(ref, run_now(daemons, jobs, current, given, t, policy, ends))
        moves += ref.moves
        for pair in v2.gains(current, ref.assignment):
            given[pair] = t
        current = {d: dict(row) for d, row in ref.assignment.items()}
        t += 0.3
    return moves


@pytest.mark.parametrize("block", range(5))
def test_plans_equal_v2_on_small_random_clusters(block: int) -> None:
    for seed in range(block * 300, (block + 1) * 300):
        case = Case(seed)
        _rounds(
            case.daemons,
            list(case.jobs),
            case.current,
            dict(case.given_at),
            case.now,
            case.policy,
            case.ends,
            rounds=2,
        )


def busy_case(seed: int) -> tuple[list[Daemon], list[Spec], Current, Given, PolicyArgs, Ends | None]:
    """A busy cluster of 100-700 daemons held by older jobs, and one to three new jobs joining it
    (most of them far below their share: packing), with random holds, ends, limits and caps."""
    rng = random.Random(seed)
    restricted = rng.random() < 0.4
    daemons: list[Daemon] = [
        (
            f"d{i:04d}",
            rng.choice([0, 2, 4, 8, 8]),
            rng.choice(PATTERNS[1:]) if restricted else ("*",),
        )
        for i in range(rng.randint(100, 700))
    ]
    old: list[Spec] = [
        (f"old{k}", rng.choice(HANDLERS), rng.choice([1.0, 2.0, 3.0]), float(k), 0, 0, None)
        for k in range(rng.randint(1, 4))
    ]
    busy = v2.plan([v2.Capacity(*d) for d in daemons], [v2.JobSpec(*j) for j in old], {}).assignment
    new: list[Spec] = [
        (
            f"new{k}",
            rng.choice(HANDLERS),
            rng.choice([1.0, 2.0, 0.5, 4.0, 8.0]),
            10.0 + k,
            rng.choice([0, 0, 5, 600]),
            rng.choice([0, 0, 0, 300, 2000]),
            rng.choice([None, None, None, 100, 1500]),
        )
        for k in range(rng.randint(1, 3))
    ]
    t = 100.0
    given: Given = {}
    if rng.random() < 0.5:
        for daemon, row in busy.items():
            for job in row:
                if rng.random() < 0.1:
                    given[(daemon, job)] = t - rng.choice([0.1, 0.4, 5.0])
    ends: Ends | None = None
    if rng.random() < 0.5:
        share = rng.choice([0.1, 0.5, 1.0])  # some daemons report tasks, or all
        ends = {
            (daemon, job): sorted(
                t + rng.choice([-1.0, 0.0, 0.02, 2.0, 30.0]) for _ in range(rng.randint(0, n))
            )
            for daemon, row in busy.items()
            for job, n in row.items()
            if rng.random() < share
        }
    policy: PolicyArgs = (
        rng.choice([0.5, 1.0, 2.0]),
        rng.choice([0, 3, 512, 512, 512]),
        rng.choice([0.0, 0.5]),
        rng.choice([0.0, 0.5, 0.5]),
    )
    return daemons, [*old, *new], busy, given, policy, ends


@pytest.mark.parametrize("block", range(4))
def test_plans_equal_v2_on_busy_clusters_that_new_jobs_join(block: int) -> None:
    for seed in range(block * 25, (block + 1) * 25):
        daemons, jobs, current, given, policy, ends = busy_case(seed)
        _rounds(daemons, jobs, current, given, 100.0, policy, ends, rounds=3)


def test_plans_equal_v2_on_the_benchs_cluster() -> None:
    """bench/assigner_scale.py's case at 800 daemons: two busy jobs and a new one 1,200 slots
    short, which packs; with no task ends known, and with every task's end known."""
    daemons: list[Daemon] = [(f"sim-{i:05d}", 4 if i % 2 == 0 else 8, ("*",)) for i in range(800)]
    base: list[Spec] = [("bg1", "h", 1.0, 0.0, 0, 0, None), ("bg2", "h", 2.0, 1.0, 0, 0, None)]
    busy = v2.plan([v2.Capacity(*d) for d in daemons], [v2.JobSpec(*j) for j in base], {}).assignment
    jobs: list[Spec] = [*base, ("new", "h", 1.0, 2.0, 0, 0, None)]
    rng = random.Random(7)
    ends: Ends = {
        (d, j): sorted(10.0 + rng.choice([-0.5, 0.0, 0.5, 1.0, 4.0]) for _ in range(n))
        for d, row in busy.items()
        for j, n in row.items()
    }
    for known in (None, ends):
        moves = _rounds(daemons, jobs, busy, {}, 10.0, (1.0, 512, 0.5, 0.5), known, rounds=2)
        assert moves == 1200
