"""The donor-daemon index picks exactly what the old scan over the donor's daemons picked."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.scheduler.test_planner_properties import Case, anything, saturated
from truba.scheduler import moves
from truba.scheduler.donor_daemons import DonorDaemons
from truba.scheduler.draft import DraftAssignment
from truba.scheduler.drains import IDLE, Drains
from truba.scheduler.handler_pools import HandlerPools
from truba.scheduler.planner import Capacity, JobSpec, Policy, job_totals, plan


def scan(self: moves._Rebalance, donor: str, receiver: str) -> tuple[str | None, bool]:
    """The pick before the index: every daemon of the donor, each move (O(daemons) a move); the
    order (pack or spread) chosen per pair at its first pick, as the index does."""
    signs: dict[tuple[str, str], int] = self.__dict__.setdefault("scan_signs", {})
    sign = signs.setdefault((donor, receiver), -1 if self._packs(receiver) else 1)
    best: tuple[int, int, str] | None = None
    held = False
    mine = self.draft.by_job.get(receiver, {})
    for daemon, n in self.draft.by_job.get(donor, {}).items():
        if not self.pools.may_run(daemon, self.handler[receiver]):
            continue
        if self.on_hold(daemon, donor):
            held = True
            continue
        key = (sign * mine.get(daemon, 0), -n, daemon)
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
    # 3,000 moves. The scan made this take over a second per 512 moves. The new job is far below
    # its share (moves.PACK_DEFICIT): it takes whole daemons, 500 of them (6 slots on average),
    # not a slot or two on each of the 2,000.
    daemons = [Capacity(f"d{i:05d}", 4 if i % 2 == 0 else 8, ("*",)) for i in range(2000)]
    background = [JobSpec("a", "h", 1.0, 1.0), JobSpec("b", "h", 2.0, 2.0)]
    busy = plan(daemons, background, {}, now=10.0).assignment
    policy = Policy(max_moves_share=0.5)
    started = time.perf_counter()
    result = plan(daemons, [*background, JobSpec("c", "h", 1.0, 3.0)], busy, now=20.0, policy=policy)
    took = time.perf_counter() - started
    assert result.settled and result.moves == 3000
    assert sum(1 for row in result.assignment.values() if "c" in row) == 500
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moves, "PACK_DEFICIT", math.inf)
        spread = plan(daemons, [*background, JobSpec("c", "h", 1.0, 3.0)], busy, now=20.0, policy=policy)
    assert job_totals(spread.assignment) == job_totals(result.assignment)
    assert sum(1 for row in spread.assignment.values() if "c" in row) == 2000  # one a daemon
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


JOBS = ["a", "b", "c"]
HANDLER_OF = {"a": "x.f", "b": "x.f", "c": "y.g"}
ALLOW = [("*",), ("*",), ("*",), ("x.*",), ("y.*",)]


def brute(
    draft: DraftAssignment,
    pools: HandlerPools,
    on_hold: Callable[[str, str], bool],
    drains: Drains,
    pair: tuple[str, str],
    pack: bool,
) -> tuple[str | None, bool]:
    """The pick by definition: the least (drain, ±receiver's slots, -donor's slots, daemon) over
    the donor's daemons the receiver may use and that are not on hold; the receiver's slots
    count negative (most first) where the pair packs and the slot frees at once."""
    donor, receiver = pair
    keys = []
    held = False
    for daemon, n in draft.by_job.get(donor, {}).items():
        if not pools.may_run(daemon, HANDLER_OF[receiver]):
            continue
        if on_hold(daemon, donor):
            held = True
            continue
        mine = draft.by_job.get(receiver, {}).get(daemon, 0)
        drain = drains.next_free(daemon, donor, n)
        packs_here = pack and (not drains.known or drain == IDLE)
        keys.append((drain, -mine if packs_here else mine, -n, daemon))
    if keys:
        return min(keys)[3], False
    return None, held


@st.composite
def index_runs(draw: st.DrawFn) -> tuple[Any, ...]:
    daemons = [f"d{i}" for i in range(draw(st.integers(1, 6)))]
    allow = {d: draw(st.sampled_from(ALLOW)) for d in daemons}
    current = {
        d: {
            j: draw(st.integers(0, 4)) for j in draw(st.lists(st.sampled_from(JOBS), max_size=3, unique=True))
        }
        for d in daemons
    }
    holds = draw(st.sets(st.tuples(st.sampled_from(daemons), st.sampled_from(JOBS)), max_size=4))
    ends = None
    if draw(st.booleans()):
        ends = {
            (d, j): sorted(draw(st.lists(st.sampled_from([-1.0, 0.0, 0.02, 0.5, 3.0]), max_size=5)))
            for d in daemons
            for j in JOBS
        }
    packing = draw(st.sets(st.sampled_from(JOBS)))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(daemons),
                st.one_of(st.none(), st.sampled_from(JOBS)),
                st.sampled_from(JOBS),
                st.tuples(st.sampled_from(JOBS), st.sampled_from(JOBS)).filter(lambda p: p[0] != p[1]),
            ),
            max_size=40,
        )
    )
    return daemons, allow, current, holds, ends, packing, steps


@settings(max_examples=600)
@given(index_runs())
def test_the_index_picks_what_a_scan_picks_in_both_orders(run: tuple[Any, ...]) -> None:
    """Random moves (taken or from a free slot, on any daemon), each followed by a pick for a
    random pair: the index's pick is always the brute-force minimum, for packing and spreading
    receivers alike (the order of a pair is fixed when its heap is built)."""
    daemons, allow, current, holds, ends, packing, steps = run
    draft = DraftAssignment(daemons, current, lambda _: set(JOBS))
    pools = HandlerPools([(d, 8, allow[d]) for d in daemons], set(HANDLER_OF.values()))
    drains = Drains(ends, 0.0)

    def on_hold(daemon: str, job: str) -> bool:
        return (daemon, job) in holds

    index = DonorDaemons(draft, pools, HANDLER_OF, on_hold, drains, packs=lambda r: r in packing)
    for daemon, giver, taker, pair in steps:
        if giver == taker or (giver is not None and not draft.held(daemon, giver)):
            giver = None
        if giver is None:
            draft.add(daemon, taker)
        else:
            draft.move(daemon, giver, taker)
        index.moved(daemon, giver, taker)
        assert index.pick(*pair) == brute(draft, pools, on_hold, drains, pair, pair[1] in packing)


def test_a_packing_receiver_goes_back_to_the_daemon_where_it_has_the_most() -> None:
    """Spread takes the donor's slots where the receiver has none; pack where it has the most."""
    jobs = {"d", "r"}
    draft = DraftAssignment(
        ["x", "y", "z"], {"x": {"d": 4}, "y": {"d": 4, "r": 1}, "z": {"d": 4}}, lambda _: jobs
    )
    pools = HandlerPools([(d, 8, ("*",)) for d in "xyz"], ["h"])
    handler = dict.fromkeys(jobs, "h")
    spread = DonorDaemons(draft, pools, handler, lambda _d, _j: False)
    packed = DonorDaemons(draft, pools, handler, lambda _d, _j: False, packs=lambda _: True)
    assert spread.pick("d", "r") == ("x", False)
    assert packed.pick("d", "r") == ("y", False)
    for _ in range(4):  # all four of the donor's slots on y, then the next daemon
        daemon, _ = packed.pick("d", "r")
        assert daemon == "y"
        draft.move("y", "d", "r")
        packed.moved("y", "d", "r")
    assert packed.pick("d", "r") == ("x", False)


def test_a_packing_receiver_that_gains_elsewhere_is_offered_that_daemon_at_once() -> None:
    """Packing, the receiver's gain makes a daemon's key smaller: ``moved`` must push it."""
    draft, daemons = index({"d": 2}, {"d": 2, "r": 1})
    pack = DonorDaemons(
        draft, daemons._pools, dict.fromkeys("dro", "h"), lambda _d, _j: False, packs=lambda _: True
    )
    assert pack.pick("d", "r") == ("y", False)
    for _ in range(2):  # r takes two free slots on x: it has more there than on y
        draft.add("x", "r")
        pack.moved("x", None, "r")
    assert pack.pick("d", "r") == ("x", False)
