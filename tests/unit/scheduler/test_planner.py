"""The planner by example: fair shares, caps, allow-lists, spread, and what keeps it from flapping."""

from __future__ import annotations

import pytest

from truba.scheduler.planner import Capacity, JobSpec, Plan, Policy, gains, job_totals, plan

ANY = ("*",)
HANDLER = "examples.math:square"
EAGER = Policy(min_hold=0.0, max_moves=10**9)
"""No hold and no move cap: every allowed move happens in one plan."""


def job(
    job_id: str,
    importance: float = 1.0,
    *,
    age: float = 0.0,
    handler: str = HANDLER,
    min_slots: int = 0,
    max_slots: int = 0,
    demand: int | None = None,
) -> JobSpec:
    # Smaller `age` = created earlier = older.
    return JobSpec(job_id, handler, importance, 1000.0 + age, min_slots, max_slots, demand)


def run(
    daemons: list[Capacity], jobs: list[JobSpec], current: dict[str, dict[str, int]] | None = None
) -> Plan:
    """Plans with no hold and no move cap (tests of those call :func:`plan` themselves)."""
    return plan(daemons, jobs, current or {}, policy=EAGER)


# -- fair share ----------------------------------------------------------------------------------


def test_equal_jobs_split_a_daemon_equally() -> None:
    result = run([Capacity("d1", 4, ANY)], [job("a", age=1), job("b", age=2)])
    assert result.assignment == {"d1": {"a": 2, "b": 2}}
    assert result.targets == {"a": 2.0, "b": 2.0}
    assert (result.moves, result.settled) == (0, True)


def test_shares_follow_importance() -> None:
    result = run(
        [Capacity("d1", 8, ANY), Capacity("d2", 8, ANY)], [job("a", 3.0, age=1), job("b", 1.0, age=2)]
    )
    assert result.targets == {"a": 12.0, "b": 4.0}
    assert job_totals(result.assignment) == {"a": 12, "b": 4}


def test_the_remainder_goes_by_largest_fraction_then_to_the_oldest() -> None:
    # 7 slots over importance 3, 3, 2: shares 2.625, 2.625, 1.75.
    jobs = [job("new", 3.0, age=3), job("old", 3.0, age=1), job("small", 2.0, age=2)]
    result = run([Capacity("d1", 7, ANY)], jobs)
    # Floors 2, 2, 1; the two remaining slots go to the largest fractions: .75 (small), then
    # .625 twice: the older of the two.
    assert job_totals(result.assignment) == {"old": 3, "new": 2, "small": 2}


def test_with_fewer_slots_than_jobs_the_oldest_get_one_each() -> None:
    jobs = [job("c", age=3), job("a", age=1), job("b", age=2)]
    assert run([Capacity("d1", 2, ANY)], jobs).assignment == {"d1": {"a": 1, "b": 1}}


def test_a_job_that_can_use_fewer_slots_gives_the_rest_away() -> None:
    jobs = [job("small", 5.0, age=1, demand=2), job("big", age=2)]
    result = run([Capacity("d1", 10, ANY)], jobs)
    assert result.targets == {"small": 2.0, "big": 8.0}
    assert result.assignment == {"d1": {"small": 2, "big": 8}}


def test_when_demand_drops_the_slots_are_freed_at_once_and_not_counted_as_moves() -> None:
    daemons = [Capacity("d1", 10, ANY)]
    current = {"d1": {"a": 8, "b": 2}}
    # Even with every slot freshly given and no moves allowed
    given = {("d1", "a"): 99.9, ("d1", "b"): 99.9}
    policy = Policy(max_moves=0, min_hold=5.0)
    result = plan(
        daemons,
        [job("a", age=1, demand=3), job("b", age=2)],
        current,
        now=100.0,
        given_at=given,
        policy=policy,
    )
    assert result.assignment == {"d1": {"a": 3, "b": 7}}
    assert (result.moves, result.settled) == (0, True)


def test_max_slots_caps_a_job_and_min_slots_holds_against_importance() -> None:
    jobs = [
        job("capped", 10.0, age=1, max_slots=3),
        job("floor", 0.1, age=2, min_slots=4),
        job("rest", age=3),
    ]
    result = run([Capacity("d1", 12, ANY)], jobs)
    assert job_totals(result.assignment) == {"capped": 3, "floor": 4, "rest": 5}


def test_minimums_that_do_not_fit_are_shared_by_importance() -> None:
    jobs = [job("a", 3.0, age=1, min_slots=6), job("b", 1.0, age=2, min_slots=6)]
    result = run([Capacity("d1", 4, ANY)], jobs)
    assert result.targets == {"a": 3.0, "b": 1.0}


# -- allow-lists ---------------------------------------------------------------------------------


def test_a_job_gets_slots_only_on_daemons_whose_allow_list_matches_its_handler() -> None:
    daemons = [Capacity("ex", 4, ("examples.*",)), Capacity("other", 3, ("other.mod:f", "other.x:*"))]
    jobs = [job("e", age=1), job("o", age=2, handler="other.mod:f"), job("z", age=3, handler="zzz:f")]
    result = run(daemons, jobs)
    assert result.assignment == {"ex": {"e": 4}, "other": {"o": 3}}
    assert result.targets["z"] == 0.0


def test_what_a_job_cannot_reach_is_shared_among_the_others() -> None:
    # y may run only on the small daemon; x1 and x2 anywhere. Equal shares would be 8/3 each,
    # but y cannot reach more than 2: the excess is water-filled to x1 and x2.
    daemons = [Capacity("big", 6, ("x.*",)), Capacity("small", 2, ANY)]
    jobs = [
        job("x1", age=1, handler="x.a:f"),
        job("x2", age=2, handler="x.b:f"),
        job("y", age=3, handler="y.c:f"),
    ]
    result = run(daemons, jobs)
    assert result.targets == {"x1": 3.0, "x2": 3.0, "y": 2.0}
    assert result.assignment == {"big": {"x1": 3, "x2": 3}, "small": {"y": 2}}


def test_a_job_that_may_run_anywhere_leaves_the_scarce_daemons_to_those_that_may_not() -> None:
    daemons = [Capacity("any", 4, ANY), Capacity("a-only", 4, ("a.*",))]
    jobs = [job("flexible", age=1, handler="a.x:f"), job("picky", age=2, handler="b.x:f")]
    result = run(daemons, jobs)
    assert result.assignment == {"a-only": {"flexible": 4}, "any": {"picky": 4}}
    assert result.moves == 0


def test_a_job_that_shares_no_daemon_with_a_donor_gets_its_share_through_a_chain() -> None:
    # r may run only on x, which b holds; d, over its share, holds y, where b may also run but r
    # may not. r takes b's slot on x and b takes d's on y: two moves per slot r gains.
    daemons = [Capacity("x", 2, ("r.*", "b.*")), Capacity("y", 4, ("b.*", "d.*"))]
    jobs = [
        job("r", age=1, handler="r.j:f"),
        job("b", age=2, handler="b.j:f"),
        job("d", age=3, handler="d.j:f"),
    ]
    result = run(daemons, jobs, {"x": {"b": 2}, "y": {"d": 4}})
    assert result.targets == {"r": 2.0, "b": 2.0, "d": 2.0}
    assert result.assignment == {"x": {"r": 2}, "y": {"b": 2, "d": 2}}
    assert result.moves == 4


def test_a_job_moves_to_a_free_daemon_to_make_room_for_one_that_may_not_run_there() -> None:
    daemons = [Capacity("x", 2, ("r.*", "b.*")), Capacity("y", 2, ("b.*",))]
    jobs = [job("r", age=1, handler="r.j:f"), job("b", age=2, handler="b.j:f", demand=2)]
    result = run(daemons, jobs, {"x": {"b": 2}})
    assert result.assignment == {"x": {"r": 2}, "y": {"b": 2}}
    assert result.moves == 2  # b's two tasks on x are interrupted


def test_every_daemon_appears_even_without_jobs() -> None:
    result = run([Capacity("d1", 4, ANY), Capacity("d2", 1, ())], [job("a")])
    assert result.assignment == {"d1": {"a": 4}, "d2": {}}


def test_slots_of_gone_jobs_gone_daemons_and_disallowed_handlers_are_freed() -> None:
    daemons = [Capacity("d1", 4, ("examples.*",))]
    current = {"gone": {"a": 3}, "d1": {"vanished": 2, "secret": 1, "a": 1}}
    jobs = [job("a"), job("secret", handler="secret:f")]
    result = plan(daemons, jobs, current, policy=Policy(max_moves=0))
    assert result.assignment == {"d1": {"a": 4}}
    assert result.moves == 0


def test_a_daemon_that_shrank_gives_back_the_slots_of_the_jobs_most_above_their_share() -> None:
    daemons = [Capacity("d1", 2, ANY), Capacity("d2", 4, ANY)]
    current = {"d1": {"a": 3, "b": 1}, "d2": {"b": 4}}
    given = {("d1", "a"): 10.0, ("d1", "b"): 10.0}
    policy = Policy(max_moves=0, min_hold=5.0)
    result = plan(
        daemons, [job("a", age=1), job("b", age=2)], current, now=10.0, given_at=given, policy=policy
    )
    # b is most above its share (5 of 3): it loses d1's slot first, then a; no hold applies.
    assert result.assignment == {"d1": {"a": 2}, "d2": {"b": 4}}
    assert (result.moves, result.settled) == (0, False)  # b's 4th slot would move to a


# -- building on the current assignment --------------------------------------------------------


def test_planning_again_with_unchanged_inputs_moves_nothing() -> None:
    daemons = [Capacity("d1", 7, ANY), Capacity("d2", 3, ("examples.*",))]
    jobs = [job("a", 2.0, age=1), job("b", age=2, handler="examples.x:f"), job("c", age=3, handler="other:f")]
    first = run(daemons, jobs)
    again = run(daemons, jobs, first.assignment)
    assert again.assignment == first.assignment
    assert (again.moves, again.settled) == (0, True)


def test_a_job_holding_an_extra_slot_keeps_it() -> None:
    # A daemon reports (e.g. after a scheduler restart) the odd slot on the newer job: giving it
    # to the older one would leave it as far from its share as the newer one was.
    result = run(
        [Capacity("d1", 3, ANY)], [job("old", age=1), job("new", age=2)], {"d1": {"old": 1, "new": 2}}
    )
    assert result.assignment == {"d1": {"old": 1, "new": 2}}


def test_a_new_job_takes_its_share_by_moves_and_a_finished_one_gives_it_back() -> None:
    daemons = [Capacity("d1", 4, ANY)]
    one = run(daemons, [job("a", age=1)])
    assert one.assignment == {"d1": {"a": 4}}
    two = run(daemons, [job("a", age=1), job("b", age=2)], one.assignment)
    assert two.assignment == {"d1": {"a": 2, "b": 2}} and two.moves == 2
    back = run(daemons, [job("a", age=1)], two.assignment)
    assert back.assignment == {"d1": {"a": 4}} and back.moves == 0


def test_an_important_new_job_gets_its_share_in_one_plan_by_default() -> None:
    daemons = [Capacity(f"d{i}", 8, ANY) for i in range(8)]
    full = run(daemons, [job("batch", age=1)])
    result = plan(daemons, [job("batch", age=1), job("urgent", 3.0, age=2)], full.assignment)
    assert job_totals(result.assignment) == {"batch": 16, "urgent": 48}
    assert (result.moves, result.settled) == (48, True)


# -- anti-flapping ---------------------------------------------------------------------------------


def test_kueue_rule_a_slot_moves_only_if_the_receiver_stays_below_the_donor() -> None:
    daemons = [Capacity("d1", 5, ANY)]
    jobs = [job("a", age=1), job("b", age=2)]
    # Shares 2.5 each. 4 + 1: b is 1.5 short, a 1.5 over: one move, to 3 + 2.
    moved = run(daemons, jobs, {"d1": {"a": 4, "b": 1}})
    assert moved.assignment == {"d1": {"a": 3, "b": 2}} and moved.moves == 1
    # 3 + 2: moving would only mirror it (b 0.5 over, a 0.5 short): nothing moves.
    assert run(daemons, jobs, {"d1": {"a": 3, "b": 2}}).moves == 0
    assert run(daemons, jobs, {"d1": {"a": 2, "b": 3}}).moves == 0


def test_deviation_in_slots_not_in_weighted_share_so_small_jobs_cannot_strand_a_big_one() -> None:
    # Ten small jobs (importance 0.2, share 0.8) hold a slot each; the big one (importance 1,
    # share 4) holds 2. Kueue's rule in slots per importance ("receiver after <= donor after")
    # forbids every move, (2 + 1) / 1 > (1 - 1) / 0.2, and strands the big job 2 slots short. In
    # slots against the share it takes 2, and the small jobs stay within a slot of theirs.
    daemons = [Capacity("d1", 12, ANY)]
    smalls = [job(f"s{i}", 0.2, age=i + 2) for i in range(10)]
    current = {"d1": {"big": 2, **{s.id: 1 for s in smalls}}}
    result = run(daemons, [job("big", 1.0, age=1), *smalls], current)
    assert result.targets["big"] == 4.0
    assert job_totals(result.assignment)["big"] == 4
    assert result.moves == 2


def test_small_changes_of_the_shares_move_nothing() -> None:
    daemons = [Capacity("d1", 10, ANY)]
    current = {"d1": {"a": 4, "b": 3, "c": 3}}
    for b_importance in (1.0, 1.1, 0.9, 1.1, 1.0):
        jobs = [job("a", age=1), job("b", b_importance, age=2), job("c", age=3)]
        result = run(daemons, jobs, current)
        assert result.moves == 0, b_importance
        current = result.assignment


def test_a_slot_given_less_than_min_hold_ago_is_not_taken() -> None:
    daemons = [Capacity("d1", 4, ANY)]
    jobs = [job("a", age=1), job("b", age=2)]
    current = {"d1": {"a": 4}}
    policy = Policy(min_hold=0.5)
    held = plan(daemons, jobs, current, now=10.2, given_at={("d1", "a"): 10.0}, policy=policy)
    assert held.assignment == current and held.moves == 0
    assert not held.settled  # so the caller plans again once the hold is over
    later = plan(daemons, jobs, current, now=10.5, given_at={("d1", "a"): 10.0}, policy=policy)
    assert later.assignment == {"d1": {"a": 2, "b": 2}} and later.settled


def test_the_hold_delays_moves_but_never_leaves_a_slot_idle() -> None:
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 2, ANY)]
    jobs = [job("a", age=1), job("b", age=2)]
    current = {"d1": {"a": 4}}
    result = plan(daemons, jobs, current, now=0.1, given_at={("d1", "a"): 0.0}, policy=Policy(min_hold=0.5))
    assert result.assignment == {"d1": {"a": 4}, "d2": {"b": 2}}


def test_the_move_cap_stops_a_plan_short_and_the_next_plans_finish() -> None:
    daemons = [Capacity("d1", 8, ANY)]
    jobs = [job("a", age=1), job("b", age=2)]
    policy = Policy(max_moves=3, min_hold=0.0)
    first = plan(daemons, jobs, {"d1": {"a": 8}}, policy=policy)
    assert first.moves == 3 and not first.settled
    second = plan(daemons, jobs, first.assignment, policy=policy)
    assert second.moves == 1 and second.settled
    assert second.assignment == {"d1": {"a": 4, "b": 4}}


def test_gains_lists_the_pairs_to_record_for_the_hold() -> None:
    before = {"d1": {"a": 2}, "d2": {"b": 1}}
    after = {"d1": {"a": 1, "b": 1}, "d2": {"b": 2}}
    assert sorted(gains(before, after)) == [("d1", "b"), ("d2", "b")]


# -- spread --------------------------------------------------------------------------------------


def test_a_jobs_slots_spread_over_daemons() -> None:
    daemons = [Capacity(f"d{i}", 4, ANY) for i in range(4)]
    jobs = [job(name, age=i) for i, name in enumerate("abcd")]
    result = run(daemons, jobs)
    assert all(row == {"a": 1, "b": 1, "c": 1, "d": 1} for row in result.assignment.values())


def test_a_job_stacks_on_a_daemon_only_when_it_is_on_all_of_them() -> None:
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 4, ANY)]
    result = run(daemons, [job("a", age=1, demand=5)])
    assert sorted(result.assignment["d1"].values()) + sorted(result.assignment["d2"].values()) in (
        [3, 2],
        [2, 3],
    )


def test_slots_are_not_moved_only_to_spread() -> None:
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 4, ANY)]
    current = {"d1": {"a": 4}, "d2": {"b": 4}}
    result = run(daemons, [job("a", age=1), job("b", age=2)], current)
    assert result.assignment == current and result.moves == 0


def test_a_receiver_takes_a_slot_on_a_daemon_where_it_has_none() -> None:
    daemons = [Capacity("d1", 2, ANY), Capacity("d2", 2, ANY)]
    current = {"d1": {"a": 1, "b": 1}, "d2": {"a": 2}}
    result = run(daemons, [job("a", age=1), job("b", age=2)], current)
    assert result.assignment == {"d1": {"a": 1, "b": 1}, "d2": {"a": 1, "b": 1}}


# -- inputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"importance": 0.0}, {"importance": -1.0}, {"min_slots": -1}, {"max_slots": -1}, {"demand": -1}],
)
def test_bad_job_specs_are_refused(kwargs: dict[str, float]) -> None:
    arguments: dict[str, object] = {
        "id": "a",
        "handler": HANDLER,
        "importance": 1.0,
        "created_at": 0.0,
        **kwargs,
    }
    with pytest.raises(ValueError):
        JobSpec(**arguments)  # type: ignore[arg-type]


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError):
        Policy(max_moves=-1)
