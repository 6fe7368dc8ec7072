from __future__ import annotations

import asyncio
import dataclasses

import grpc

from tests.unit.scheduler.fakes import ManualClock
from truba.proto.v1 import daemons_pb2
from truba.scheduler.assigner import Assigner, gainers_first
from truba.scheduler.model import Job, JobSettings, JobState
from truba.scheduler.registry import DaemonInfo, DaemonRegistry, DaemonSession

HANDLER = "examples.math:square"


class Jobs:
    """A mutable list of jobs standing in for the store."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def add(self, job_id: str, handler: str = HANDLER) -> Job:
        job = Job(id=job_id, handler=handler, importance=1.0, state=JobState.OPEN, created_at=len(self.jobs))
        self.jobs.append(job)
        return job

    def __call__(self) -> list[Job]:
        return [job for job in self.jobs if job.runnable]


def make(clock: ManualClock) -> tuple[Assigner, Jobs, DaemonRegistry]:
    jobs = Jobs()
    registry = DaemonRegistry()
    assigner = Assigner(registry, jobs, heartbeat_interval=1.0, clock=clock, first_version=100, event_delay=0)
    return assigner, jobs, registry


def session(
    clock: ManualClock, daemon_id: str = "d1", slots: int = 4, allow: tuple[str, ...] = ("examples.*",)
) -> DaemonSession:
    return DaemonSession(DaemonInfo(daemon_id, slots, allow), {}, clock())


async def drain(s: DaemonSession) -> list[daemons_pb2.SchedulerMessage]:
    """Every message queued on ``s`` right now."""
    out = []
    messages = s.messages()
    while True:
        try:
            out.append(await asyncio.wait_for(anext(messages), 0.01))
        except (TimeoutError, StopAsyncIteration):
            return out


def slots(message: daemons_pb2.SchedulerMessage) -> dict[str, int]:
    return {js.job_id: js.slots for js in message.assignment.jobs}


async def test_a_connecting_daemon_gets_its_share_at_once(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    [message] = await drain(d1)
    assert message.assignment.version == 101
    [entry] = message.assignment.jobs
    assert (entry.job_id, entry.handler, entry.slots) == ("a", HANDLER, 4)
    assert entry.queues.tasks == "truba.job.a.tasks" and entry.queues.dead == "truba.job.a.dead"
    assert assigner.slots_of("a") == 4 and assigner.total_slots == 4 and assigner.daemon_count == 1


async def test_an_empty_first_assignment_is_still_sent(clock: ManualClock) -> None:
    assigner, _, _ = make(clock)
    d1 = session(clock)
    assigner.connect(d1)
    [message] = await drain(d1)
    assert message.HasField("assignment") and list(message.assignment.jobs) == []


async def test_only_daemons_whose_share_changed_get_a_new_assignment(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    ex, other = session(clock, "ex"), session(clock, "other", allow=("other.*",))
    assigner.connect(ex)
    assigner.connect(other)
    await drain(ex), await drain(other)
    # When a job only "ex" allows is created
    jobs.add("a")
    assigner.replan()
    # Then "ex" gets a new version and "other" hears nothing
    [message] = await drain(ex)
    assert slots(message) == {"a": 4} and message.assignment.version == 103
    assert await drain(other) == []
    # And replanning with nothing changed sends nothing
    assigner.replan()
    assert await drain(ex) == []


async def test_a_second_job_splits_the_slots(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    await drain(d1)
    clock.advance(1.0)  # past the planner's min_hold: a's new slots may move
    jobs.add("b")
    assigner.replan()
    [message] = await drain(d1)
    assert slots(message) == {"a": 2, "b": 2}


def test_daemons_that_gain_slots_are_pushed_before_those_that_only_lose_or_keep(clock: ManualClock) -> None:
    loses, gains, keeps, swaps = (session(clock, d) for d in ("a-loses", "b-gains", "c-keeps", "d-swaps"))
    for s, held in ((loses, {"a": 4}), (gains, {"a": 4}), (keeps, {"a": 4}), (swaps, {"a": 4})):
        s.held = held
    plan = {"a-loses": {"a": 2}, "b-gains": {"a": 2, "new": 2}, "c-keeps": {"a": 4}, "d-swaps": {"new": 4}}
    ordered = gainers_first([loses, gains, keeps, swaps], plan)
    assert [s.daemon_id for s in ordered] == ["b-gains", "d-swaps", "a-loses", "c-keeps"]


async def test_slots_just_given_are_held_briefly_and_moved_once_the_hold_passed(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    await drain(d1)
    jobs.add("b")
    assigner.replan()
    assert await drain(d1) == []  # a got its slots just now: nothing moves yet
    clock.advance(1.0)
    assigner.replan()
    [message] = await drain(d1)
    assert slots(message) == {"a": 2, "b": 2}


async def test_an_unapplied_assignment_is_sent_again_after_two_intervals(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("a")
    d1 = session(clock)
    assigner.connect(d1)
    [first] = await drain(d1)
    # A heartbeat reporting the old version right away is not an answer yet
    assigner.heartbeat(d1, daemons_pb2.Heartbeat(applied_version=0))
    assert await drain(d1) == []
    # Two intervals later it is: the same assignment goes again
    clock.advance(2.0)
    assigner.heartbeat(d1, daemons_pb2.Heartbeat(applied_version=0))
    [again] = await drain(d1)
    assert again == first
    # Once applied, heartbeats cause nothing
    clock.advance(5.0)
    assigner.heartbeat(d1, daemons_pb2.Heartbeat(applied_version=first.assignment.version))
    assert await drain(d1) == []


async def test_a_silent_daemon_is_dropped_and_its_slots_replanned(clock: ManualClock) -> None:
    assigner, jobs, registry = make(clock)
    jobs.add("a")
    d1, d2 = session(clock, "d1"), session(clock, "d2")
    assigner.connect(d1)
    assigner.connect(d2)
    assert assigner.slots_of("a") == 8
    # d2 keeps sending heartbeats, d1 falls silent for more than 3 intervals
    clock.advance(2.0)
    assigner.heartbeat(d2, daemons_pb2.Heartbeat())
    clock.advance(1.5)
    assigner.expire()
    assert d1.end is not None and d1.end[0] is grpc.StatusCode.UNAVAILABLE
    assert list(registry) == [d2]
    assert assigner.slots_of("a") == 4


async def test_a_second_connect_with_the_same_id_replaces_the_first(clock: ManualClock) -> None:
    assigner, jobs, registry = make(clock)
    jobs.add("a")
    old, new = session(clock, "d1", slots=4), session(clock, "d1", slots=6)
    assigner.connect(old)
    assigner.connect(new)
    assert old.end is not None and old.end[0] is grpc.StatusCode.ABORTED
    assert list(registry) == [new] and assigner.slots_of("a") == 6
    # The old stream ending later does not remove the new one
    assigner.disconnect(old, "stream ended")
    assert list(registry) == [new]
    [message] = await drain(new)
    assert slots(message) == {"a": 6}


async def test_a_daemon_that_reported_running_work_keeps_it_when_it_still_fits(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    jobs.add("old")
    jobs.add("new")
    # After a scheduler restart, the daemon reports the extra slot on the newer job
    d1 = DaemonSession(DaemonInfo("d1", 3, ("*",)), {"old": 1, "new": 2}, clock())
    assigner.connect(d1)
    [message] = await drain(d1)
    assert slots(message) == {"old": 1, "new": 2}


async def test_no_slot_is_a_problem_only_for_a_job_with_tasks_to_run(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    assigner.connect(session(clock, "d1", slots=0))
    busy = jobs.add("busy")
    idle = dataclasses.replace(jobs.add("idle"), state=JobState.CLOSED, submitted=0)  # nothing left
    assert assigner.problem_of(busy) == f"no free slot on the 1 daemon(s) that allow handler {HANDLER!r}"
    assert assigner.problem_of(idle) == ""


async def test_handlers_no_connected_daemon_allows_are_explained(clock: ManualClock) -> None:
    assigner, jobs, _ = make(clock)
    job = jobs.add("a", "secret.mod:f")
    assert assigner.problem_of(job) == "no daemon is connected"
    assigner.check_allowed("secret.mod:f")  # no daemon, no opinion
    assigner.connect(session(clock, "d1", allow=("examples.*", "tools.*")))
    expected = (
        "handler 'secret.mod:f' is not allowed by any connected daemon"
        " (their --allow patterns: examples.*, tools.*)"
    )
    assert assigner.problem_of(job) == expected
    try:
        assigner.check_allowed("secret.mod:f")
    except Exception as exc:
        assert str(exc) == expected
    else:
        raise AssertionError("check_allowed passed")


async def test_min_slots_100_on_a_4_slot_cluster_is_accepted_and_its_problem_says_so(
    clock: ManualClock,
) -> None:
    assigner, jobs, _ = make(clock)
    job = dataclasses.replace(jobs.add("big"), settings=JobSettings(min_slots=100))
    assigner.connect(session(clock, "d1", slots=4))
    assert assigner.problem_of(job) == (
        f"min_slots=100 but the daemons that allow handler {HANDLER!r} have 4 slot(s) in all:"
        " it runs on fewer until more daemons connect"
    )
    assigner.connect(session(clock, "d2", slots=96))
    assert "min_slots" not in assigner.problem_of(job)
