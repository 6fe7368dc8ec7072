from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from truba.scheduler.allow import allowed
from truba.scheduler.model import Job, JobState
from truba.scheduler.planner import Capacity, job_totals, plan

ANY = ("*",)


def job(
    job_id: str, handler: str = "examples.math:square", *, age: float = 0.0, state: JobState = JobState.OPEN
) -> Job:
    # Smaller `age` = created earlier = older.
    return Job(id=job_id, handler=handler, importance=1.0, state=state, created_at=1000.0 + age)


def test_slots_are_split_equally_among_the_jobs_a_daemon_allows() -> None:
    daemons = [Capacity("d1", 4, ANY)]
    jobs = [job("a", age=1), job("b", age=2)]
    assert plan(daemons, jobs, {}) == {"d1": {"a": 2, "b": 2}}


def test_the_remainder_goes_to_the_oldest_jobs() -> None:
    daemons = [Capacity("d1", 5, ANY)]
    jobs = [job("new", age=3), job("old", age=1), job("mid", age=2)]
    assert plan(daemons, jobs, {}) == {"d1": {"old": 2, "mid": 2, "new": 1}}


def test_with_fewer_slots_than_jobs_the_oldest_get_one_each() -> None:
    daemons = [Capacity("d1", 2, ANY)]
    jobs = [job("c", age=3), job("a", age=1), job("b", age=2)]
    assert plan(daemons, jobs, {}) == {"d1": {"a": 1, "b": 1}}


def test_a_job_gets_slots_only_on_daemons_whose_allow_list_matches_its_handler() -> None:
    daemons = [Capacity("ex", 4, ("examples.*",)), Capacity("other", 3, ("other.mod:f", "other.x:*"))]
    jobs = [job("e", "examples.math:square", age=1), job("o", "other.mod:f", age=2), job("z", "zzz:f", age=3)]
    assignment = plan(daemons, jobs, {})
    assert assignment == {"ex": {"e": 4}, "other": {"o": 3}}
    assert job_totals(assignment) == {"e": 4, "o": 3}


def test_every_daemon_appears_even_without_jobs() -> None:
    assert plan([Capacity("d1", 4, ANY), Capacity("d2", 1, ())], [job("a")], {}) == {"d1": {"a": 4}, "d2": {}}


def test_finished_and_cancelled_jobs_get_no_slots_closed_ones_do() -> None:
    jobs = [
        job("open", age=1),
        job("closed", age=2, state=JobState.CLOSED),
        job("finished", age=3, state=JobState.FINISHED),
        job("cancelled", age=4, state=JobState.CANCELLED),
    ]
    assert plan([Capacity("d1", 4, ANY)], jobs, {}) == {"d1": {"open": 2, "closed": 2}}


def test_planning_again_with_unchanged_inputs_moves_nothing() -> None:
    daemons = [Capacity("d1", 7, ANY), Capacity("d2", 3, ("examples.*",))]
    jobs = [job("a", age=1), job("b", "examples.x:f", age=2), job("c", age=3)]
    first = plan(daemons, jobs, {})
    assert plan(daemons, jobs, first) == first


def test_a_job_holding_an_extra_slot_keeps_it_instead_of_moving_it_to_an_older_job() -> None:
    # Given a daemon that reports (e.g. after a scheduler restart) the extra slot on the newer job
    daemons = [Capacity("d1", 3, ANY)]
    jobs = [job("old", age=1), job("new", age=2)]
    current = {"d1": {"old": 1, "new": 2}}
    # Then planning keeps it there: the split is still equal within one slot
    assert plan(daemons, jobs, current) == {"d1": {"old": 1, "new": 2}}


def test_a_new_job_takes_slots_and_a_finished_one_gives_them_back() -> None:
    daemons = [Capacity("d1", 4, ANY)]
    one = plan(daemons, [job("a", age=1)], {})
    assert one == {"d1": {"a": 4}}
    two = plan(daemons, [job("a", age=1), job("b", age=2)], one)
    assert two == {"d1": {"a": 2, "b": 2}}
    back = plan(daemons, [job("a", age=1), job("b", age=2, state=JobState.FINISHED)], two)
    assert back == {"d1": {"a": 4}}


def test_current_entries_of_unknown_daemons_and_jobs_are_ignored() -> None:
    current = {"gone": {"a": 3}, "d1": {"vanished": 4}}
    assert plan([Capacity("d1", 2, ANY)], [job("a")], current) == {"d1": {"a": 2}}


HANDLERS = ["examples.a:f", "examples.b:g", "other.c:h"]
PATTERNS = [(), ("*",), ("examples.*",), ("other.*",), ("examples.a:f", "other.*")]


@st.composite
def inputs(draw: st.DrawFn) -> tuple[list[Capacity], list[Job]]:
    daemons = [
        Capacity(f"d{i}", draw(st.integers(1, 16)), draw(st.sampled_from(PATTERNS)))
        for i in range(draw(st.integers(0, 4)))
    ]
    jobs = [
        job(
            f"j{i}",
            draw(st.sampled_from(HANDLERS)),
            age=draw(st.floats(0, 10)),
            state=draw(st.sampled_from(JobState)),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    return daemons, jobs


@given(inputs())
def test_properties_of_every_plan(case: tuple[list[Capacity], list[Job]]) -> None:
    daemons, jobs = case
    assignment = plan(daemons, jobs, {})
    assert plan(daemons, jobs, assignment) == assignment  # stable
    by_id = {j.id: j for j in jobs}
    for daemon in daemons:
        share = assignment[daemon.daemon_id]
        eligible = [j for j in jobs if j.runnable and allowed(j.handler, daemon.allow)]
        # Every slot is used when some job can use it, and only allowed, runnable jobs get any.
        assert sum(share.values()) == (daemon.slots if eligible else 0)
        assert all(by_id[j].runnable and allowed(by_id[j].handler, daemon.allow) for j in share)
        # Equal within one slot.
        counts = [share.get(j.id, 0) for j in eligible]
        assert not counts or max(counts) - min(counts) <= 1
