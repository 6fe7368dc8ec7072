"""Today's planner makes exactly the plans of the frozen reference (``planner_v2``, see its README).

Changes that only make planning cheaper (the move search, indexes, laziness) must not change a
single slot: both planners run on many seeded random clusters (allow-lists, min/max slots,
demands, holds, expected task ends, small move caps) and their plans must be equal, including the
plans of a second round started from the first one's result.

This file checks the plans packing leaves spread: a receiver at least ``moves.PACK_DEFICIT``
slots below its share takes its donors' slots packed, so a cluster with fewer slots than that is
compared as it is, and a larger one with packing switched off in both planners (the threshold
patched out). Packing's own plans are compared with the reference's, packing on, in
``test_planner_equivalence_v2.py``; here the large-cluster test also checks that packing keeps
the spread plan's totals, and ``test_donor_daemons.py`` checks its daemon choice against a scan.
(The reference used to be ``planner_v1``, the planner before packing; ``planner_v2`` made the same
plans with packing off, which this file checked until it was retired.)
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator

import pytest

from tests.unit.scheduler.planner_v2 import moves as old_moves
from tests.unit.scheduler.planner_v2 import planner as old
from truba.scheduler import moves
from truba.scheduler import planner as now

HANDLERS = ["examples.a:f", "examples.b:g", "other.c:h"]
PATTERNS: list[tuple[str, ...]] = [
    (),
    ("*",),
    ("*",),
    ("*",),
    ("examples.*",),
    ("other.*",),
    ("examples.a:f",),
]

Current = dict[str, dict[str, int]]
Given = dict[tuple[str, str], float]
Ends = dict[tuple[str, str], list[float]]


class Case:
    """One random cluster: daemons, jobs, a current assignment, holds, task ends and a policy."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        scale = rng.choice([3, 8, 30, 120])
        self.restricted = rng.random() < 0.5
        self.daemons = [
            (f"d{i:03d}", rng.choice([0, 1, 2, 4, 8]), rng.choice(PATTERNS) if self.restricted else ("*",))
            for i in range(rng.randint(1, scale))
        ]
        self.jobs = [
            (
                f"j{k}",
                rng.choice(HANDLERS),
                rng.choice([1.0, 1.0, 2.0, 0.5, 3.0]),
                float(rng.randint(0, 5)),
                rng.choice([0, 0, 0, 1, 3, 10]),
                rng.choice([0, 0, 0, 2, 5, 40]),
                rng.choice([None, None, 0, 1, 4, 20, 500]),
            )
            for k in range(rng.randint(0, 7))
        ]
        ids = [j[0] for j in self.jobs] + ["gone"]
        self.current: Current = {}
        for daemon, slots, _ in self.daemons:
            if rng.random() < 0.8:
                row: dict[str, int] = {}
                for _ in range(rng.randint(0, 3)):
                    job = rng.choice(ids)
                    row[job] = row.get(job, 0) + rng.randint(1, max(1, slots))
                self.current[daemon] = row
        if rng.random() < 0.2:
            self.current["lost-daemon"] = {ids[0]: 2}
        self.now = 100.0
        self.given_at: Given = {}
        if rng.random() < 0.6:
            for daemon, row in self.current.items():
                for job in row:
                    if rng.random() < 0.3:
                        self.given_at[(daemon, job)] = self.now - rng.choice([0.1, 0.4, 0.6, 5.0])
        self.ends: Ends | None = None
        if rng.random() < 0.5:
            self.ends = {
                (daemon, job): sorted(self.now + rng.choice([-1.0, 0.0, 0.5, 2.0, 30.0]) for _ in range(n))
                for daemon, row in self.current.items()
                for job, n in row.items()
                if rng.random() < 0.7
            }
        self.policy = (
            rng.choice([0.0, 0.5, 1.0, 2.0]),
            rng.choice([0, 1, 3, 512]),
            rng.choice([0.0, 0.5]),
            rng.choice([0.0, 0.5]),
        )

    def run_old(self, current: Current, given_at: Given) -> old.Plan:
        deadband, max_moves, min_hold, share = self.policy
        return old.plan(
            [old.Capacity(d, s, a) for d, s, a in self.daemons],
            [old.JobSpec(j, h, i, c, lo, hi, dem) for j, h, i, c, lo, hi, dem in self.jobs],
            current,
            now=self.now,
            given_at=given_at,
            policy=old.Policy(deadband, max_moves, min_hold, share),
            ends=self.ends,
        )

    def run_now(self, current: Current, given_at: Given) -> now.Plan:
        deadband, max_moves, min_hold, share = self.policy
        return now.plan(
            [now.Capacity(d, s, a) for d, s, a in self.daemons],
            [now.JobSpec(j, h, i, c, lo, hi, dem) for j, h, i, c, lo, hi, dem in self.jobs],
            current,
            now=self.now,
            given_at=given_at,
            policy=now.Policy(deadband, max_moves, min_hold, share),
            ends=self.ends,
        )


@contextlib.contextmanager
def _spread_only(slots: int) -> Iterator[None]:
    """Packing switched off where it could apply (a cluster of ``moves.PACK_DEFICIT`` slots or more)."""
    with pytest.MonkeyPatch.context() as patch:
        if slots >= moves.PACK_DEFICIT:
            patch.setattr(moves, "PACK_DEFICIT", math.inf)
            patch.setattr(old_moves, "PACK_DEFICIT", math.inf)
        yield


def _same(a: old.Plan, b: now.Plan) -> None:
    assert b.assignment == a.assignment
    assert b.targets == a.targets
    assert (b.moves, b.settled) == (a.moves, a.settled)


@pytest.mark.parametrize("block", range(10))
def test_plans_equal_the_reference_on_random_clusters(block: int) -> None:
    for seed in range(block * 150, (block + 1) * 150):
        case = Case(seed)
        given = dict(case.given_at)
        current: Current = case.current
        for _ in range(2):  # the plan, then the next one from its result (as the assigner does)
            with _spread_only(sum(slots for _, slots, _ in case.daemons)):
                ref = case.run_old(current, given)
                _same(ref, case.run_now(current, given))
            for pair in old.gains(current, ref.assignment):
                given[pair] = case.now
            current = {d: dict(row) for d, row in ref.assignment.items()}
            case.now += 0.3


def test_plans_equal_the_reference_on_a_large_cluster() -> None:
    """A cluster of the assigner_scale bench's kind, small enough for a unit test: two busy jobs
    and a new one that takes its share by moves (900 slots short: it packs, so it is compared
    with packing off here, and by its totals with packing on)."""
    daemons = [(f"sim-{i:05d}", 4 if i % 2 == 0 else 8, ("*",)) for i in range(600)]
    base = [("bg1", "h", 1.0, 0.0, 0, 0, None), ("bg2", "h", 2.0, 1.0, 0, 0, None)]
    with _spread_only(3600):  # the reference spread, as planners did before packing
        first = old.plan([old.Capacity(*d) for d in daemons], [old.JobSpec(*j) for j in base], {})
    jobs = [*base, ("new", "h", 1.0, 2.0, 0, 0, None)]
    for policy in [(1.0, 512, 0.5, 0.5), (1.0, 512, 0.5, 0.0)]:
        with _spread_only(3600):
            ref = old.plan(
                [old.Capacity(*d) for d in daemons],
                [old.JobSpec(*j) for j in jobs],
                first.assignment,
                now=10.0,
                policy=old.Policy(*policy),
            )

        def plan_now(policy: tuple[float, int, float, float] = policy) -> now.Plan:
            return now.plan(
                [now.Capacity(*d) for d in daemons],
                [now.JobSpec(*j) for j in jobs],
                first.assignment,
                now=10.0,
                policy=now.Policy(*policy),
            )

        with _spread_only(3600):
            got = plan_now()
        assert ref.moves > 0
        _same(ref, got)
        packed = plan_now()
        assert (packed.targets, packed.moves, packed.settled) == (ref.targets, ref.moves, ref.settled)
        assert now.job_totals(packed.assignment) == old.job_totals(ref.assignment)
        assert _holding(packed.assignment, "new") < _holding(ref.assignment, "new") / 2


def _holding(assignment: dict[str, dict[str, int]], job: str) -> int:
    return sum(1 for row in assignment.values() if job in row)
