"""The assigner's work per event stays small on a large cluster: one message per distinct share,
no plan for reports that change no job's demand, plans asked for soon spaced by their cost."""

from __future__ import annotations

import asyncio
import time

from tests.unit.scheduler.fakes import ManualClock
from tests.unit.scheduler.test_assigner import Jobs, drain, session, slots
from truba.proto.v1 import daemons_pb2
from truba.scheduler import assigner as assigner_module
from truba.scheduler.assigner import Assigner
from truba.scheduler.counters import JobCounters
from truba.scheduler.registry import DaemonRegistry


class Plans:
    """Counts plans (the assigner's observer)."""

    def __init__(self) -> None:
        self.count = 0

    def planned(self, seconds: float, live_jobs: object) -> None:
        self.count += 1

    def revoked(self, job_id: str, slots: int, *, preempted: bool) -> None:
        pass

    def pushed(self) -> None:
        pass


def make(clock: ManualClock, counters: JobCounters | None = None) -> tuple[Assigner, Jobs, Plans]:
    jobs, plans = Jobs(), Plans()
    assigner = Assigner(
        DaemonRegistry(),
        jobs,
        heartbeat_interval=1.0,
        clock=clock,
        first_version=100,
        event_delay=0,
        counters=counters,
        observer=plans,
    )
    return assigner, jobs, plans


async def test_daemons_with_the_same_share_get_one_message_under_one_version(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    daemons = [session(clock, f"d{i}") for i in range(5)]
    for daemon in daemons:
        assigner.connect(daemon)
    for daemon in daemons:
        await drain(daemon)
    # When a job comes: every daemon's share changes alike
    jobs.add("a")
    assigner.replan()
    messages = [m for daemon in daemons for m in await drain(daemon)]
    # Then each gets it, all with the plan's one version, all the same message object
    assert len(messages) == 5 and all(slots(m) == {"a": 4} for m in messages)
    assert {m.assignment.version for m in messages} == {106}
    assert all(m is messages[0] for m in messages)
    # And the next plan's version is above it
    clock.advance(1.0)  # past the hold
    jobs.add("b")
    assigner.replan()
    again = [m for daemon in daemons for m in await drain(daemon)]
    assert {m.assignment.version for m in again} == {107}


async def test_a_resent_assignment_keeps_its_version(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    [first] = await drain(d1)
    clock.advance(2.0)
    assigner.heartbeat(d1, daemons_pb2.Heartbeat(applied_version=0))
    [again] = await drain(d1)
    assert again.assignment == first.assignment


def stats(job_id: str, done: int) -> daemons_pb2.Heartbeat:
    return daemons_pb2.Heartbeat(stats=[daemons_pb2.JobStats(job_id=job_id, done=done, busy_slots=4)])


async def test_reports_that_change_no_demand_cost_no_plan(clock: ManualClock) -> None:
    counters = JobCounters()
    assigner, jobs, plans = make(clock, counters)
    jobs.add("a")  # no client report: its demand is unknown, so unbounded
    d1 = session(clock)
    assigner.connect(d1)
    before = plans.count
    # When heartbeats report tasks done, again and again
    for done in range(1, 4):
        assigner.heartbeat(d1, stats("a", done))
        await asyncio.sleep(assigner_module.DEMAND_REPLAN_DELAY + 0.05)
    # Then the counters moved, but no plan was made: the demand is unknown still
    assert counters.counts("a").done == 3
    assert plans.count == before and assigner.checks_skipped >= 1


async def test_a_report_that_changes_demand_replans(clock: ManualClock) -> None:
    counters = JobCounters()
    assigner, jobs, plans = make(clock, counters)
    jobs.add("a")
    counters.client_report("a", submitted=10, received=0, now=clock())
    d1 = session(clock)
    assigner.connect(d1)
    await drain(d1)
    assert assigner.slots_of("a") == 4
    before = plans.count
    # When 8 of its 10 tasks are done: it can use 2 slots, not 4
    assigner.heartbeat(d1, stats("a", 8))
    await asyncio.sleep(assigner_module.DEMAND_REPLAN_DELAY + 0.05)
    # Then it was planned again, and the daemon told
    assert plans.count == before + 1
    [message] = await drain(d1)
    assert slots(message) == {"a": 2}


async def test_the_same_stats_again_change_no_counter(clock: ManualClock) -> None:
    counters = JobCounters()
    assigner, jobs, _ = make(clock, counters)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    assigner.heartbeat(d1, stats("a", 5))
    counters.stored(counters.dirty())
    assigner.heartbeat(d1, stats("a", 5))
    assert counters.dirty() == {} and counters.counts("a").done == 5
    assert [s.done for s in d1.stats] == [5]


async def test_plans_asked_for_soon_wait_twice_the_last_plan(clock: ManualClock) -> None:
    assigner, _, plans = make(clock)
    assigner._plan_seconds = 0.3  # as if the last plan had taken 0.3 s
    loop = asyncio.get_running_loop()
    asked = loop.time()
    assigner.replan_soon(0.01)
    assert assigner._soon is not None
    assert assigner._soon.when() - asked >= 2 * 0.3 - 0.01


async def test_an_expiry_check_woken_late_by_a_stalled_loop_is_put_off_once(clock: ManualClock) -> None:
    assigner = Assigner(DaemonRegistry(), Jobs(), heartbeat_interval=0.2, clock=clock, event_delay=0)
    d1 = session(clock)
    assigner.connect(d1)
    clock.advance(10.0)  # silent for long (by the assigner's clock)
    watching = asyncio.create_task(assigner.watch())
    try:
        await asyncio.sleep(0)  # the watchdog starts its first wait (0.1 s)
        time.sleep(0.2)  # the loop is stalled past it: heartbeats could be waiting unread
        await asyncio.sleep(0.02)
        assert d1.end is None  # put off, not judged
        await asyncio.sleep(0.15)
        assert d1.end is not None  # the next check drops it
    finally:
        watching.cancel()


def test_the_interval_grows_in_steps_to_keep_heartbeats_within_the_budget(clock: ManualClock) -> None:
    assigner = Assigner(
        DaemonRegistry(), Jobs(), heartbeat_interval=1.0, heartbeat_budget=2000.0, clock=clock
    )
    assert [assigner.interval_for(n) for n in (1, 2000, 2001, 4000, 5000, 10_000)] == [1, 1, 2, 2, 3, 5]
    unlimited = Assigner(DaemonRegistry(), Jobs(), heartbeat_interval=1.0, clock=clock)
    assert unlimited.interval_for(10_000) == 1.0


async def test_daemons_are_told_a_longer_interval_as_the_cluster_grows_and_judged_by_it(
    clock: ManualClock,
) -> None:
    assigner = Assigner(
        DaemonRegistry(), Jobs(), heartbeat_interval=1.0, heartbeat_budget=2.0, clock=clock, event_delay=0
    )
    first, second = session(clock, "d1"), session(clock, "d2")
    # The first two fit the budget (2 heartbeats/s): Welcome says 1 s
    for daemon in (first, second):
        assert assigner.welcome(daemon) == 1.0
        assigner.connect(daemon)
        await drain(daemon)
    # When a third connects: its Welcome says 2 s, and the others hear it in an assignment
    third = session(clock, "d3")
    assert assigner.welcome(third) == 2.0
    assigner.connect(third)
    for daemon in (first, second):
        [message] = await drain(daemon)
        assert message.assignment.heartbeat_interval == 2.0
        assert daemon.heartbeat_interval == 2.0
    [message] = await drain(third)
    assert message.assignment.heartbeat_interval == 0.0  # its Welcome said so already
    # And silence is judged by the new interval: 3 s is not 3 missed heartbeats any more
    clock.advance(3.5)
    assigner.expire()
    assert first.end is None and assigner.daemon_count == 3
    clock.advance(3.0)
    assigner.expire()
    assert first.end is not None and assigner.daemon_count == 0


async def test_a_daemon_told_a_shorter_interval_is_judged_by_the_longer_until_it_beats(
    clock: ManualClock,
) -> None:
    assigner = Assigner(
        DaemonRegistry(), Jobs(), heartbeat_interval=1.0, heartbeat_budget=1.0, clock=clock, event_delay=0
    )
    first, second = session(clock, "d1"), session(clock, "d2")
    for daemon in (first, second):
        assigner.welcome(daemon)
        assigner.connect(daemon)
    assert first.heartbeat_interval == 2.0 and second.heartbeat_interval == 2.0
    # When the second leaves, the first is told 1 s, but may still wait its 2 s once
    assigner.disconnect(second, "gone")
    assert first.heartbeat_interval == 1.0 and first.silence_interval == 2.0
    clock.advance(4.0)
    assigner.expire()
    assert first.end is None
    # And after its next heartbeat, 1 s it is
    assigner.heartbeat(first, daemons_pb2.Heartbeat(applied_version=first.version))
    assert first.silence_interval == 1.0
    clock.advance(3.5)
    assigner.expire()
    assert first.end is not None


async def test_heartbeats_and_assignments_are_counted_for_load_measurements(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    d1, d2 = session(clock, "d1"), session(clock, "d2")
    for daemon in (d1, d2):
        assigner.connect(daemon)
    assigner.replan()
    assert assigner.assignments == 2 and assigner.heartbeats == 0  # each daemon's first
    jobs.add("a")
    assigner.replan()
    assert assigner.assignments == 4
    for _ in range(3):
        assigner.heartbeat(d1, daemons_pb2.Heartbeat(applied_version=d1.version))
    assert assigner.heartbeats == 3 and assigner.assignments == 4


async def test_the_watchdog_checks_twice_per_told_interval_on_a_cluster_past_the_budget(
    clock: ManualClock,
) -> None:
    # 3 daemons at 0.05 s would send 60 heartbeats/s; the budget is 10: they are told 0.3 s
    assigner = Assigner(
        DaemonRegistry(),
        Jobs(),
        heartbeat_interval=0.05,
        heartbeat_budget=10.0,
        clock=clock,
        event_delay=0,
    )
    daemons = [session(clock, f"d{i}") for i in range(3)]
    for daemon in daemons:
        assigner.welcome(daemon)
        assigner.connect(daemon)
    assert abs(assigner.interval_for(3) - 0.3) < 1e-9
    clock.advance(10.0)  # all silent for long (by the assigner's clock)
    watching = asyncio.create_task(assigner.watch())
    try:
        await asyncio.sleep(0.06)  # past half the configured interval, before half the told one
        assert all(d.end is None for d in daemons)
        deadline = time.monotonic() + 5.0
        while assigner.daemon_count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert assigner.daemon_count == 0  # the check at half the told interval dropped them
    finally:
        watching.cancel()
