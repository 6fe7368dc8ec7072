"""Packing: a receiver far below its share takes its donors' slots where it already has the most,
and the moves that follow one another on one daemon are made at once (``moves._packed_run``).

The batched plan must be exactly the plan of single moves: both run on the equivalence test's
seeded random clusters (allow-lists, floors, holds, expected task ends, small move caps) with the
packing threshold lowered so that most receivers pack, and on a large busy cluster.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.unit.scheduler.test_planner_equivalence import Case
from tests.unit.scheduler.test_planner_properties import Case as PropertyCase
from tests.unit.scheduler.test_planner_properties import anything, saturated
from truba.scheduler import moves
from truba.scheduler.donor_daemons import DonorDaemons
from truba.scheduler.planner import Capacity, JobSpec, Plan, Policy, plan


def _one_by_one(*_args: object) -> bool:
    return False  # no run longer than one move: every move goes through the heaps


def _both(make: object, threshold: float) -> tuple[Plan, Plan]:
    assert callable(make)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moves, "PACK_DEFICIT", threshold)
        batched = make()
        patch.setattr(DonorDaemons, "frees_at_once_packed", _one_by_one)
        single = make()
    return batched, single


@pytest.mark.parametrize("threshold", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("block", range(4))
def test_batched_runs_plan_as_single_moves_on_random_clusters(threshold: float, block: int) -> None:
    for seed in range(block * 150, (block + 1) * 150):
        case = Case(seed)
        batched, single = _both(lambda case=case: case.run_now(case.current, case.given_at), threshold)
        assert batched == single, seed


@settings(max_examples=200)
@given(anything())
def test_batched_runs_plan_as_single_moves(case: PropertyCase) -> None:
    batched, single = _both(case.plan, 0.0)
    assert batched == single


@settings(max_examples=200)
@given(saturated())
def test_batched_runs_plan_as_single_moves_when_saturated(case: PropertyCase) -> None:
    batched, single = _both(case.plan, 0.0)
    assert batched == single


def test_a_new_job_on_a_large_busy_cluster_takes_whole_daemons_in_runs() -> None:
    daemons = [Capacity(f"d{i:04d}", 4 if i % 2 == 0 else 8, ("*",)) for i in range(600)]
    background = [JobSpec("a", "h", 1.0, 1.0), JobSpec("b", "h", 2.0, 2.0)]
    busy = plan(daemons, background, {}, now=10.0).assignment
    jobs = [*background, JobSpec("c", "h", 1.0, 3.0)]
    for policy in (Policy(max_moves_share=0.5), Policy(max_moves=100)):
        batched, single = _both(
            lambda p=policy: plan(daemons, jobs, busy, now=20.0, policy=p), moves.PACK_DEFICIT
        )
        assert batched == single
        assert batched.moves == (900 if policy.max_moves_share else 100)
        holding = [row["c"] for row in batched.assignment.values() if "c" in row]
        assert sum(holding) == batched.moves
        assert len(holding) <= batched.moves // 4 + 1  # whole daemons of 4 or 8 (one partly)


def test_a_run_stops_where_the_next_donor_takes_over() -> None:
    """Two donors equally far above their shares: single moves alternate between them, so a run
    from one of them is one move long (a cap of three shows the order)."""
    daemons = [Capacity("x", 8, ("*",)), Capacity("y", 8, ("*",))]
    jobs = [JobSpec("a", "h", 1.0, 1.0), JobSpec("b", "h", 1.0, 2.0), JobSpec("c", "h", 1.0, 3.0)]
    current = {"x": {"a": 8}, "y": {"b": 8}}
    batched, single = _both(lambda: plan(daemons, jobs, current, policy=Policy(max_moves=3)), 1.0)
    assert batched == single
    assert batched.assignment == {"x": {"a": 7, "c": 1}, "y": {"b": 6, "c": 2}}
