"""The donor-daemon index picks exactly what the old scan over the donor's daemons picked."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings

from tests.unit.scheduler.test_planner_properties import Case, anything, saturated
from truba.scheduler import moves
from truba.scheduler.donor_daemons import DonorDaemons
from truba.scheduler.draft import DraftAssignment
from truba.scheduler.handler_pools import HandlerPools
from truba.scheduler.planner import Capacity, JobSpec, Policy, plan


def scan(self: moves._Rebalance, donor: str, receiver: str) -> tuple[str | None, bool]:
    """The pick before the index: every daemon of the donor, each move (O(daemons) a move)."""
    best: tuple[int, int, str] | None = None
    held = False
    mine = self.draft.by_job.get(receiver, {})
    for daemon, n in self.draft.by_job.get(donor, {}).items():
        if not self.pools.may_run(daemon, self.handler[receiver]):
            continue
        if self.on_hold(daemon, donor):
            held = True
            continue
        key = (mine.get(daemon, 0), -n, daemon)
        if best is None or key < best:
            best = key
    return (best[2] if best is not None else None), held


def both(case: Case) -> tuple[object, object]:
    indexed = case.plan()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moves._Rebalance, "_daemon_for", scan)
        scanned = case.plan()
    return indexed, scanned


@settings(max_examples=300)
@given(anything())
def test_plans_are_the_same_as_with_the_scan(case: Case) -> None:
    indexed, scanned = both(case)
    assert indexed == scanned


@settings(max_examples=300)
@given(saturated())
def test_plans_are_the_same_as_with_the_scan_when_saturated(case: Case) -> None:
    indexed, scanned = both(case)
    assert indexed == scanned


def test_a_new_job_takes_its_share_of_a_large_busy_cluster_in_one_fast_plan() -> None:
    # 2,000 daemons of 4 or 8 slots held by two jobs; a third job's share is a quarter of them:
    # 3,000 moves. The scan made this take over a second per 512 moves.
    daemons = [Capacity(f"d{i:05d}", 4 if i % 2 == 0 else 8, ("*",)) for i in range(2000)]
    background = [JobSpec("a", "h", 1.0, 1.0), JobSpec("b", "h", 2.0, 2.0)]
    busy = plan(daemons, background, {}, now=10.0).assignment
    policy = Policy(max_moves_share=0.5)
    started = time.perf_counter()
    result = plan(daemons, [*background, JobSpec("c", "h", 1.0, 3.0)], busy, now=20.0, policy=policy)
    took = time.perf_counter() - started
    assert result.settled and result.moves == 3000
    assert sum(1 for row in result.assignment.values() if "c" in row) == 2000  # spread: one a daemon
    assert took < 2.0, took  # about 0.1 s on a quiet machine


def index(x: dict[str, int], y: dict[str, int]) -> tuple[DraftAssignment, DonorDaemons]:
    jobs = {"d", "r", "o"}
    draft = DraftAssignment(["x", "y"], {"x": x, "y": y}, lambda _: jobs)
    pools = HandlerPools([("x", 4, ("*",)), ("y", 4, ("*",))], ["h"])
    return draft, DonorDaemons(draft, pools, dict.fromkeys(jobs, "h"), lambda _daemon, _job: False)


def test_a_daemon_where_the_receiver_gave_a_slot_away_is_picked_at_once() -> None:
    """The heap only learns of keys that became smaller through ``moved``: here the receiver's."""
    draft, daemons = index({"d": 2, "r": 1}, {"d": 2})
    assert daemons.pick("d", "r") == ("y", False)  # (r's 0, d's 2) on y beats (1, 2) on x
    draft.move("x", "r", "o")
    daemons.moved("x", "r", "o")
    assert daemons.pick("d", "r") == ("x", False)  # (0, 2) on x now, and x < y


def test_a_daemon_where_the_donor_took_a_slot_is_picked_at_once() -> None:
    draft, daemons = index({"d": 1, "o": 1}, {"d": 2})
    assert daemons.pick("d", "r") == ("y", False)  # d's 2 on y beats its 1 on x
    draft.move("x", "o", "d")
    daemons.moved("x", "o", "d")
    assert daemons.pick("d", "r") == ("x", False)
    draft.move("x", "d", "r")
    daemons.moved("x", "d", "r")
    assert daemons.pick("d", "r") == ("y", False)  # x's entry is now too small: put right
