"""Graceful moves take the slots that free soonest: the planner's ``ends`` and where they come from."""

from __future__ import annotations

from dataclasses import dataclass, field

from truba.proto.v1 import daemons_pb2
from truba.scheduler.drain_estimates import ReportedEnds
from truba.scheduler.drains import IDLE, Drains, expected_ends
from truba.scheduler.planner import Capacity, JobSpec, Policy, job_totals, plan
from truba.scheduler.running import DaemonRunning

ANY = ("*",)
EAGER = Policy(min_hold=0.0, max_moves=10**9)
NOW = 100.0


def job(job_id: str, age: float, demand: int | None = None) -> JobSpec:
    return JobSpec(job_id, "m:f", 1.0, 1000.0 + age, demand=demand)


def after(*seconds: float) -> list[float]:
    return [NOW + s for s in seconds]


# -- the planner -------------------------------------------------------------------------------


def test_moves_take_the_slots_whose_tasks_end_soonest() -> None:
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 4, ANY)]
    current = {"d1": {"a": 4}, "d2": {"a": 4}}
    ends = {("d1", "a"): after(1, 2, 3, 60), ("d2", "a"): after(40, 50, 70, 80)}
    jobs = [job("a", 1), job("b", 2)]
    result = plan(daemons, jobs, current, now=NOW, policy=EAGER, ends=ends)
    assert result.moves == 4
    assert result.assignment == {"d1": {"a": 1, "b": 3}, "d2": {"a": 3, "b": 1}}
    # Without ends the receiver's slots are spread.
    spread = plan(daemons, jobs, current, now=NOW, policy=EAGER)
    assert spread.assignment == {"d1": {"a": 2, "b": 2}, "d2": {"a": 2, "b": 2}}


def test_slots_already_draining_free_first() -> None:
    # a runs four tasks on d1 but holds three there: the one ending first (at +1) already serves
    # b. The next slot taken on d1 frees at +2, the one after at +30; d2's at +10 and +20.
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 4, ANY)]
    current = {"d1": {"a": 3, "b": 1}, "d2": {"a": 4}}
    ends = {("d1", "a"): after(1, 2, 30, 40), ("d2", "a"): after(10, 20, 50, 60)}
    result = plan(daemons, [job("a", 1), job("b", 2)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 2, "b": 2}, "d2": {"a": 2, "b": 2}}


def test_idle_slots_go_first() -> None:
    # a holds 3 on d1 but runs only one task there: two slots are idle, free at once.
    daemons = [Capacity("d1", 4, ANY), Capacity("d2", 4, ANY)]
    current = {"d1": {"a": 3, "c": 1}, "d2": {"a": 4}}
    ends = {("d1", "a"): after(30), ("d2", "a"): after(1, 2, 3, 4)}
    result = plan(daemons, [job("a", 1), job("c", 0), job("b", 2)], current, now=NOW, policy=EAGER, ends=ends)
    # The two idle slots on d1 go first (to b and c, both below their share), then d2's.
    assert result.assignment == {"d1": {"a": 1, "b": 1, "c": 2}, "d2": {"a": 2, "b": 1, "c": 1}}


def test_a_job_beyond_its_demand_gives_back_its_idle_slots() -> None:
    daemons = [Capacity("d1", 2, ANY), Capacity("d2", 2, ANY)]
    current = {"d1": {"a": 2}, "d2": {"a": 2}}
    ends = {("d1", "a"): after(5, 6), ("d2", "a"): after(5)}
    result = plan(daemons, [job("a", 1, demand=3)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 2}, "d2": {"a": 1}}
    # With nothing idle, the slot whose task ends first.
    ends = {("d1", "a"): after(5, 6), ("d2", "a"): after(1, 9)}
    result = plan(daemons, [job("a", 1, demand=3)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 2}, "d2": {"a": 1}}
    ends = {("d1", "a"): after(1, 6), ("d2", "a"): after(5, 9)}
    result = plan(daemons, [job("a", 1, demand=2)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 1}, "d2": {"a": 1}}


def test_planning_again_with_the_same_ends_changes_nothing() -> None:
    daemons = [Capacity(f"d{i}", 4, ANY) for i in range(4)]
    current = {f"d{i}": {"a": 4} for i in range(4)}
    ends = {(f"d{i}", "a"): after(i, 10 - i, 20 + i, 30 + 2 * i) for i in range(4)}
    jobs = [job("a", 1), job("b", 2), job("c", 3)]
    first = plan(daemons, jobs, current, now=NOW, policy=EAGER, ends=ends)
    assert job_totals(first.assignment) == {"a": 6, "b": 5, "c": 5}
    again = plan(daemons, jobs, first.assignment, now=NOW, policy=EAGER, ends=ends)
    assert (again.assignment, again.moves) == (first.assignment, 0)


def test_the_fair_share_does_not_depend_on_ends() -> None:
    daemons = [Capacity(f"d{i}", 3, ANY) for i in range(3)]
    current = {f"d{i}": {"a": 3} for i in range(3)}
    jobs = [job("a", 1), job("b", 2)]
    ends = {(f"d{i}", "a"): after(3 - i, 9, 9) for i in range(3)}
    with_ends = plan(daemons, jobs, current, now=NOW, policy=EAGER, ends=ends)
    without = plan(daemons, jobs, current, now=NOW, policy=EAGER)
    assert job_totals(with_ends.assignment) == job_totals(without.assignment)
    assert (with_ends.moves, with_ends.targets) == (without.moves, without.targets)


def test_drains_count_in_resolution_steps() -> None:
    drains = Drains({("d", "a"): after(0.5, 2.0)}, NOW)
    assert drains.next_free("d", "a", held=3) == IDLE  # one slot runs nothing
    assert drains.next_free("d", "a", held=2) == 10
    assert drains.next_free("d", "a", held=1) == 40
    assert drains.next_free("e", "a", held=1) == IDLE
    assert Drains({("d", "a"): after(-3.0)}, NOW).next_free("d", "a", held=1) == -60  # overdue
    assert Drains(None, NOW).next_free("d", "a", held=1) == 0


def test_the_ends_a_drain_is_counted_from_are_read_once_per_pair() -> None:
    read: list[tuple[str, str]] = []

    class Counting(dict[tuple[str, str], list[float]]):
        def get(self, key: tuple[str, str], default: object = None) -> object:  # type: ignore[override]
            read.append(key)
            return super().get(key, default)

    drains = Drains(Counting({("d", "a"): after(0.5, 2.0)}), NOW)
    assert drains.ends("d", "a") == after(0.5, 2.0) and drains.ends("e", "a") == ()
    assert [drains.next_free("d", "a", held=h) for h in (3, 2, 1)] == [IDLE, 10, 40]
    assert drains.ends("d", "a") == after(0.5, 2.0) and drains.now == NOW
    assert read == [("d", "a"), ("e", "a")]
    assert Drains(None, NOW).ends("d", "a") == ()


def test_an_overdue_task_is_taken_before_one_still_running() -> None:
    daemons = [Capacity("d1", 2, ANY), Capacity("d2", 2, ANY)]
    current = {"d1": {"a": 2}, "d2": {"a": 2}}
    ends = {("d1", "a"): after(0.5, 3), ("d2", "a"): after(-2, 4)}
    result = plan(daemons, [job("a", 1), job("b", 2)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 1, "b": 1}, "d2": {"a": 1, "b": 1}}
    result = plan(daemons, [job("a", 1), job("b", 2, demand=1)], current, now=NOW, policy=EAGER, ends=ends)
    assert result.assignment == {"d1": {"a": 2}, "d2": {"a": 1, "b": 1}}


# -- the estimate ------------------------------------------------------------------------------


def test_expected_ends_are_the_mean_after_each_start() -> None:
    assert expected_ends([NOW - 1, NOW - 3], 4.0, NOW) == [NOW + 1, NOW + 3]


def test_tasks_past_the_mean_are_due_the_oldest_first() -> None:
    assert expected_ends([NOW - 10, NOW - 50, NOW - 3.5], 4.0, NOW) == [NOW - 46, NOW - 6, NOW + 0.5]


def test_with_no_mean_a_task_has_what_it_ran_left() -> None:
    assert expected_ends([NOW - 1, NOW - 5, NOW + 1], 0.0, NOW) == [NOW, NOW + 1, NOW + 5]


@dataclass
class Session:
    daemon_id: str
    running: DaemonRunning = field(default_factory=DaemonRunning)
    stats: list[daemons_pb2.JobStats] = field(default_factory=list)
    last_seen: float = NOW


def test_reported_ends_read_the_last_heartbeat() -> None:
    wall = 5000.0
    attempts = [
        daemons_pb2.RunningAttempt(job_id="a", task_id="t1", slot=0, start=wall - 1.0),
        daemons_pb2.RunningAttempt(job_id="a", task_id="t2", slot=1, start=wall - 2.0),
        daemons_pb2.RunningAttempt(job_id="b", task_id="t3", slot=2, start=wall - 1.0),
        daemons_pb2.RunningAttempt(job_id="now", task_id="t4", slot=3, start=wall - 1.0),
    ]
    session = Session(
        "d1",
        DaemonRunning(attempts, {"a": 1}),
        [daemons_pb2.JobStats(job_id="a", service_time=3.0)],
        last_seen=NOW - 0.5,
    )
    ends = ReportedEnds([session], NOW, wall, graceful={"a", "b"})
    assert ends[("d1", "a")] == [NOW + 1.0, NOW + 2.0, NOW + 2.5]
    assert ends[("d1", "b")] == [NOW + 1.0]  # no mean known yet: what it ran is left
    assert ends.get(("d1", "now")) is None  # immediate preemption: free at once
    assert ends.get(("d1", "c")) is None
    assert ends.get(("d2", "a")) is None
    assert ends.get(("d2", "a"), ()) == () and ends.get(("d1", "c"), ()) == ()
    assert ends.get(("d1", "a"), ()) == ends[("d1", "a")]
    assert set(ends) == {("d1", "a"), ("d1", "b")}
    assert len(ends) == 2


def test_a_daemon_that_reports_nothing_running_has_no_ends() -> None:
    """Such a daemon (idle, or one that does not report its tasks) is answered without an
    estimate, as the estimate would: no ends, whatever its counters."""
    idle = Session("d1", stats=[daemons_pb2.JobStats(job_id="a", service_time=3.0)])
    empty = Session("d2", DaemonRunning((), {}))
    ends = ReportedEnds([idle, empty], NOW, 5000.0, graceful={"a"})
    assert ends.get(("d1", "a")) is None and ends.get(("d2", "a"), ()) == ()
    assert ends._estimate(idle) == {} and ends._estimate(empty) == {}
    assert len(ends) == 0 and not list(ends)


def test_a_bounded_grace_caps_the_expected_ends_of_its_job() -> None:
    wall = 5000.0
    attempts = [
        daemons_pb2.RunningAttempt(job_id="a", task_id="t1", slot=0, start=wall - 1.0),
        daemons_pb2.RunningAttempt(job_id="b", task_id="t2", slot=1, start=wall - 1.0),
    ]
    stats = [daemons_pb2.JobStats(job_id=job, service_time=600.0) for job in ("a", "b")]
    session = Session("d1", DaemonRunning(attempts, {}), stats)
    ends = ReportedEnds([session], NOW, wall, graceful={"a", "b"}, graces={"a": 30.0})
    assert ends[("d1", "a")] == [NOW + 30.0]  # interrupted 30 s after it is taken, at the latest
    assert ends[("d1", "b")] == [NOW + 599.0]  # no grace: its task's expected end
