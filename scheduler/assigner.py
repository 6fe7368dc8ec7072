"""Keeps every connected daemon's assignment equal to the plan, and pushes changes at once.

:meth:`Assigner.replan` runs the planner over the connected daemons and the runnable jobs and
sends a new Assignment to each daemon whose share changed. It is called whenever an input
changes: a daemon connected or was lost, a job was created, closed, finished or cancelled.

Versions come from one counter per scheduler, seeded with the wall clock in milliseconds at
startup, so they keep increasing across scheduler restarts. A daemon that reports an older
applied version than it was sent for two heartbeat intervals gets the assignment again; one
that is silent for :data:`MISSED_HEARTBEATS` intervals is dropped and the plan recomputed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final, final

import grpc

from truba.proto.v1 import daemons_pb2
from truba.scheduler.allow import allowed
from truba.scheduler.convert import assignment_pb
from truba.scheduler.counters import DaemonJobStats, JobCounters
from truba.scheduler.drain_estimates import ReportedEnds
from truba.scheduler.errors import FailedPrecondition, NotFound
from truba.scheduler.events import EventKind, JobEvents
from truba.scheduler.gc_pause import GcPause
from truba.scheduler.heartbeat_budget import interval_for
from truba.scheduler.model import Job, JobState, Preemption
from truba.scheduler.plan_observer import PlanObserver, effective_demand, observe_revocations
from truba.scheduler.planner import (
    SCHEDULER_POLICY,
    Assignment,
    Capacity,
    JobSpec,
    Policy,
    gains,
    job_totals,
    plan,
)
from truba.scheduler.registry import DaemonRegistry, DaemonSession

log = logging.getLogger(__name__)

MISSED_HEARTBEATS: Final = 3
REPLAN_DELAY: Final = 0.1
"""Seconds daemons connecting or leaving (and plans cut short) wait for the next plan."""
DEMAND_REPLAN_DELAY: Final = 0.5
"""Seconds a change of demand may wait for the next plan (coalescing reports)."""
PLAN_DUTY: Final = 2.0
"""A plan asked for soon waits at least this many times the last plan's duration: planning
takes at most a third of the event loop, whatever the cluster's size, so heartbeats and sends
are never starved by a storm of events (a new job's own plan is made at once)."""


@final
class Assigner:
    """Plans slots over the connected daemons and pushes each daemon its share.

    Args:
        registry: the connected daemons.
        jobs: returns the runnable jobs (the store is the source of truth).
        heartbeat_interval: seconds between the heartbeats daemons are asked for.
        heartbeat_budget: heartbeats per second all daemons together send at most (0: no
            limit); a larger cluster's daemons are asked for a longer interval.
        clock: monotonic time, injectable for tests.
        first_version: the version counter's start; defaults to the wall clock in ms.
        observer: told about each plan (its time, the slots it took from jobs, pushes).
        gc_pause: wraps each plan and its pushes (no collection inside, what it keeps frozen
            after: :mod:`~truba.scheduler.gc_pause`); None: the collector as it is.
    """

    def __init__(
        self,
        registry: DaemonRegistry,
        jobs: Callable[[], Sequence[Job]],
        *,
        heartbeat_interval: float,
        heartbeat_budget: float = 0.0,
        counters: JobCounters | None = None,
        events: JobEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
        first_version: int | None = None,
        policy: Policy | None = None,
        event_delay: float = REPLAN_DELAY,
        observer: PlanObserver | None = None,
        gc_pause: GcPause | None = None,
    ) -> None:
        self.event_delay = event_delay
        self._gc_pause = gc_pause
        self._observer = observer
        self._policy = policy or SCHEDULER_POLICY
        self._registry = registry
        self._jobs = jobs
        self._counters = counters or JobCounters()
        self._events = events or JobEvents()
        self._given_at: dict[tuple[str, str], float] = {}
        """(daemon id, job id) -> when the job last gained a slot there (for the planner's hold)."""
        self._targets: dict[str, float] = {}
        self._soon: asyncio.TimerHandle | None = None
        self._check: asyncio.TimerHandle | None = None
        self._planned_demand: dict[str, int] = {}
        """Each runnable job's demand as the last plan saw it (``effective_demand``)."""
        self._planned_slots = 0
        self._plan_seconds = 0.0
        """How long the last plan took, with its pushes (wall time)."""
        self.checks_skipped = 0
        """Demand checks that found no job's demand changed (no plan made)."""
        self.heartbeats = 0
        """Heartbeats noted since start (``GetClusterInfo``: load benchmarks divide CPU by it)."""
        self.assignments = 0
        """Assignments queued to daemons since start (each push and resend)."""
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_budget = heartbeat_budget
        self._clock = clock
        self._version = int(time.time() * 1000) if first_version is None else first_version
        self._plan: Assignment = {}
        self._totals: dict[str, int] = {}

    # -- daemons -------------------------------------------------------------------------------

    def interval_for(self, daemons: int) -> float:
        """The heartbeat interval ``daemons`` daemons are asked for: :attr:`heartbeat_interval`,
        or on a cluster whose heartbeats would exceed :attr:`heartbeat_budget` the smallest
        multiple of it that keeps them within (10,000 daemons, 1 s, 2,000/s: 5 s)."""
        return interval_for(daemons, self.heartbeat_interval, self.heartbeat_budget)

    def welcome(self, session: DaemonSession) -> float:
        """The interval a connecting daemon is told in Welcome (noted on its session)."""
        interval = self.interval_for(len(self._registry) + 1)
        session.heartbeat_interval = session.silence_interval = interval
        return interval

    def connect(self, session: DaemonSession) -> None:
        """Registers a daemon's new session (replacing an older one) and replans."""
        replaced = self._registry.add(session)
        info = session.info
        log.info(
            "sched.daemon.connected",
            extra={
                "daemon_id": info.daemon_id,
                "hostname": info.hostname,
                "slots": info.slots,
                "allow": list(info.allow),
                "running": session.held,
                "replaced": replaced is not None,
            },
        )
        self._replan_for_event()

    def disconnect(self, session: DaemonSession, reason: str) -> None:
        """Forgets ``session`` unless a newer one replaced it, and replans."""
        if self._registry.remove(session):
            log.info("sched.daemon.lost", extra={"daemon_id": session.daemon_id, "reason": reason})
            self._lost(session)
            self._replan_for_event()

    def _lost(self, session: DaemonSession) -> None:
        for job_id in self._counters.daemon_lost(session.daemon_id):
            self._events.publish(job_id, EventKind.PROGRESS)

    def sessions(self) -> list[DaemonSession]:
        """The connected daemons' sessions."""
        return list(self._registry)

    def drain(self, daemon_id: str) -> DaemonSession:
        """Tells a daemon to finish what it runs and take nothing new; its slots go elsewhere.

        Raises:
            NotFound: no daemon with that id is connected.
        """
        session = self._registry.get(daemon_id)
        if session is None:
            raise NotFound(f"daemon {daemon_id!r} is not connected")
        if not session.draining:
            session.draining = True
            session.send(daemons_pb2.SchedulerMessage(drain=daemons_pb2.Drain()))
            log.info("sched.daemon.drain", extra={"daemon_id": daemon_id, "running": session.held})
            self.replan()
        return session

    def heartbeat(self, session: DaemonSession, heartbeat: daemons_pb2.Heartbeat) -> None:
        """Notes a heartbeat and its counters; sends the assignment again if the daemon has not
        applied it."""
        now = self._clock()
        self.heartbeats += 1
        session.last_seen = now
        session.silence_interval = session.heartbeat_interval
        session.applied_version = heartbeat.applied_version
        stats = heartbeat.stats
        changed: set[str] = set()
        if stats != session.stats:  # the same numbers as last time change no counter: skip them
            session.stats = list(stats)
            changed = self._counters.daemon_report(
                session.daemon_id,
                (
                    DaemonJobStats(
                        job_id=s.job_id,
                        done=s.done,
                        failed=s.failed,
                        busy=s.busy_slots,
                        waiting=s.waiting,
                        service_time=s.service_time,
                    )
                    for s in stats
                ),
            )
        for job_id in changed:
            self._events.publish(job_id, EventKind.PROGRESS)
        if heartbeat.draining and not session.draining:
            session.draining = True
            log.info("sched.daemon.draining", extra={"daemon_id": session.daemon_id})
            self.replan()
        elif changed:
            self.demand_changed()
        stale = session.version and heartbeat.applied_version != session.version
        if stale and now - session.sent_at >= 2 * (session.heartbeat_interval or self.heartbeat_interval):
            log.info(
                "sched.assign.resent",
                extra={
                    "daemon_id": session.daemon_id,
                    "version": session.version,
                    "applied_version": heartbeat.applied_version,
                },
            )
            self._push(session, session.held, session.version)

    def expire(self) -> None:
        """Drops daemons silent for :data:`MISSED_HEARTBEATS` heartbeat intervals, then replans."""
        lost = self._registry.silent(self._clock(), MISSED_HEARTBEATS, self.heartbeat_interval)
        for session in lost:
            limit = MISSED_HEARTBEATS * (session.silence_interval or self.heartbeat_interval)
            session.close(grpc.StatusCode.UNAVAILABLE, f"no heartbeat for {limit:g}s")
            self._registry.remove(session)
            log.warning(
                "sched.daemon.lost", extra={"daemon_id": session.daemon_id, "reason": "missed heartbeats"}
            )
            self._lost(session)
        if lost:
            self._replan_for_event()

    async def watch(self) -> None:
        """Calls :meth:`expire` twice per heartbeat interval (the one the daemons are told: on a
        cluster past the heartbeat budget, longer than the configured one, and so are the
        silences it looks for), until cancelled.

        A check that wakes up late (by over a quarter interval: the loop was busy, e.g. with a
        long plan) is put off once, to the next: heartbeats that arrived meanwhile wait to be
        read behind it, and the scheduler's own stall must not drop the daemons that sent them.
        """
        loop = asyncio.get_running_loop()
        put_off = False
        while True:
            interval = self.interval_for(len(self._registry))
            due = loop.time() + interval / 2
            await asyncio.sleep(interval / 2)
            if not put_off and loop.time() - due > interval / 4:
                put_off = True
                log.info("sched.expire.put_off", extra={"late": round(loop.time() - due, 3)})
                continue
            put_off = False
            self.expire()

    # -- planning ------------------------------------------------------------------------------

    def replan_soon(self, delay: float = REPLAN_DELAY) -> None:
        """Replans within ``delay`` seconds; calls in between are coalesced into one plan (a
        sooner deadline moves the pending plan forward)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test): the next event replans
            return
        delay = max(delay, PLAN_DUTY * self._plan_seconds)
        due = loop.time() + delay
        if self._soon is not None:
            if self._soon.when() <= due:
                return
            self._soon.cancel()
        self._soon = loop.call_later(delay, self.replan)

    def demand_changed(self) -> None:
        """Counters moved: within :data:`DEMAND_REPLAN_DELAY` seconds, replan if some runnable
        job's demand, as far as a plan can tell it apart, is not the one the last plan used
        (demand drifts with every report; following each would cost a plan per heartbeat, and on
        a busy cluster most reports change no job's plan: an unknown demand, or one beyond the
        cluster's slots, stays so)."""
        if self._soon is not None or self._check is not None:
            return  # a plan or a check is due anyway
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test): the next event replans
            return
        self._check = loop.call_later(DEMAND_REPLAN_DELAY, self._check_demand)

    def _check_demand(self) -> None:
        self._check = None
        if self._soon is not None:
            return
        total = self._planned_slots
        demands = {job.id: effective_demand(self._demand(job), total) for job in self._jobs() if job.runnable}
        if demands != self._planned_demand:
            self.replan()
        else:
            self.checks_skipped += 1

    def _replan_for_event(self) -> None:
        """Daemons connecting or leaving replan after :attr:`event_delay` seconds, so that a
        thousand of them reconnecting at once cost one plan, not a thousand (each plan covers
        every daemon: planning per event is quadratic in a storm)."""
        if self.event_delay <= 0:
            self.replan()
        else:
            self.replan_soon()

    def replan(self) -> None:
        """Plans again and pushes a new assignment to every daemon whose share changed."""
        if self._gc_pause is None:
            self._replan()
            return
        with self._gc_pause:
            self._replan()

    def _replan(self) -> None:
        began = time.perf_counter()
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        jobs = {job.id: job for job in self._jobs() if job.runnable}
        sessions = list(self._registry)
        current = {s.daemon_id: s.held for s in sessions}
        now = self._clock()
        capacities = [
            s.info.capacity if not s.draining else Capacity(s.daemon_id, 0, s.info.allow) for s in sessions
        ]
        specs = [self._spec(job) for job in jobs.values()]
        total = sum(c.slots for c in capacities)
        self._planned_demand = {spec.id: effective_demand(spec.demand, total) for spec in specs}
        self._planned_slots = total
        started = time.perf_counter()
        graceful = {job.id for job in jobs.values() if job.settings.preemption is Preemption.GRACEFUL}
        graces = {
            job.id: job.settings.preemption_grace for job in jobs.values() if job.settings.preemption_grace
        }
        ends = ReportedEnds(sessions, now, time.time(), graceful, graces)
        result = plan(
            capacities, specs, current, now=now, given_at=self._given_at, policy=self._policy, ends=ends
        )
        if self._observer is not None:
            self._observer.planned(time.perf_counter() - started, list(jobs))
            observe_revocations(self._observer, current, result.assignment, specs)
        for pair in gains(current, result.assignment):
            self._given_at[pair] = now
        self._plan = result.assignment
        self._targets = result.targets
        totals = job_totals(self._plan)
        for job_id in set(totals) | set(self._totals):
            if totals.get(job_id, 0) != self._totals.get(job_id, 0):
                self._events.publish(job_id, EventKind.SLOTS)
        self._totals = totals
        self._push_plan(sessions, jobs)
        live = {s.daemon_id for s in sessions}
        self._given_at = {k: t for k, t in self._given_at.items() if k[0] in live and k[1] in jobs}
        self._plan_seconds = time.perf_counter() - began
        if not result.settled:
            self.replan_soon()

    def _push_plan(self, sessions: Sequence[DaemonSession], jobs: dict[str, Job]) -> None:
        """Sends each daemon whose share changed its new one: all under one new version, and one
        message per distinct share (daemons given the same slots of the same jobs get the same
        message object; most of a large cluster's daemons get one of a few).

        Daemons that gain slots of some job are queued first (:func:`gainers_first`): their
        streams wake first, so a new job's share (the moves' receivers, the free slots it gets)
        reaches them before the donors learn what they lost."""
        version = self._version + 1
        interval = self.interval_for(len(sessions))
        messages: dict[tuple[tuple[tuple[str, int], ...], float], daemons_pb2.SchedulerMessage] = {}
        pushed = 0
        detail = log.isEnabledFor(logging.DEBUG)
        for session in gainers_first(sessions, self._plan):
            share = self._plan[session.daemon_id]
            retell = bool(session.heartbeat_interval) and session.heartbeat_interval != interval
            if session.version != 0 and share == session.held and not retell:
                continue
            if retell:  # the cluster grew or shrank past a step of the heartbeat budget
                session.silence_interval = max(session.heartbeat_interval, interval)
                session.heartbeat_interval = interval
            key = (tuple(share.items()), interval if retell else 0.0)
            message = messages.get(key)
            if message is None:
                message = messages[key] = assignment_pb(version, share, jobs, key[1])
            if detail:
                log.debug(
                    "sched.assign", extra={"daemon_id": session.daemon_id, "version": version, "jobs": share}
                )
            self._send(session, message, share, version)
            pushed += 1
        if pushed:
            self._version = version
            log.info(
                "sched.assigned",
                extra={
                    "version": version,
                    "daemons": pushed,
                    "distinct": len(messages),
                    "heartbeat_interval": interval,
                },
            )

    def _demand(self, job: Job) -> int | None:
        closed = job.submitted if job.state is JobState.CLOSED else None
        return self._counters.demand(job.id, closed_submitted=closed, now=self._clock())

    def _spec(self, job: Job) -> JobSpec:
        settings = job.settings
        return JobSpec(
            id=job.id,
            handler=job.handler,
            importance=job.importance,
            created_at=job.created_at,
            min_slots=settings.min_slots,
            max_slots=settings.max_slots,
            demand=self._demand(job),
        )

    def _push(
        self, session: DaemonSession, share: dict[str, int], version: int, jobs: dict[str, Job] | None = None
    ) -> None:
        if jobs is None:
            jobs = {job.id: job for job in self._jobs() if job.id in share}
        told = session.heartbeat_interval
        again = told if told and told != self.heartbeat_interval else 0.0
        self._send(session, assignment_pb(version, share, jobs, again), share, version)

    def _send(
        self,
        session: DaemonSession,
        message: daemons_pb2.SchedulerMessage,
        share: dict[str, int],
        version: int,
    ) -> None:
        session.send(message)
        self.assignments += 1
        if self._observer is not None:
            self._observer.pushed()
        session.held = share
        session.version = version
        session.sent_at = self._clock()

    # -- views ---------------------------------------------------------------------------------

    def slots_of(self, job_id: str) -> int:
        """Slots the job holds now, over all daemons."""
        return self._totals.get(job_id, 0)

    def fair_share_of(self, job_id: str) -> float:
        """Slots the job should hold by weighted fair share (fractional; 0 if not runnable)."""
        return self._targets.get(job_id, 0.0)

    @property
    def daemon_count(self) -> int:
        return len(self._registry)

    @property
    def total_slots(self) -> int:
        return self._registry.total_slots

    def check_allowed(self, handler: str) -> None:
        """Refuses a handler that no connected daemon allows (no daemon connected: no opinion).

        Raises:
            FailedPrecondition: daemons are connected and none of them allows ``handler``.
        """
        sessions = list(self._registry)
        if sessions and not any(allowed(handler, s.info.allow) for s in sessions):
            raise FailedPrecondition(
                f"handler {handler!r} is not allowed by any connected daemon{self._patterns()}"
            )

    def problem_of(self, job: Job) -> str:
        """Why a runnable job has no slots, as far as the scheduler can tell ("" if it has some),
        or why it cannot have its ``min_slots`` (more than the daemons that allow it have: a
        job may ask for more than the cluster has now, since daemons may join later)."""
        if not job.runnable:
            return ""
        sessions = list(self._registry)
        wanted = job.settings.min_slots
        if wanted and sessions:
            there = sum(s.info.slots for s in sessions if allowed(job.handler, s.info.allow))
            if wanted > there:
                return (
                    f"min_slots={wanted} but the daemons that allow handler {job.handler!r} have"
                    f" {there} slot(s) in all: it runs on fewer until more daemons connect"
                )
        if self.slots_of(job.id):
            return ""
        if not sessions:
            return "no daemon is connected"
        allowing = sum(allowed(job.handler, s.info.allow) for s in sessions)
        if not allowing:
            return f"handler {job.handler!r} is not allowed by any connected daemon{self._patterns()}"
        if self._demand(job) == 0:
            return ""  # nothing to run now (its client may submit more): no slot is as it should be
        return f"no free slot on the {allowing} daemon(s) that allow handler {job.handler!r}"

    def _patterns(self) -> str:
        patterns = sorted({p for s in self._registry for p in s.info.allow})
        return f" (their --allow patterns: {', '.join(patterns) if patterns else 'none'})"


def gainers_first(sessions: Sequence[DaemonSession], plan: Assignment) -> list[DaemonSession]:
    """``sessions`` with those whose share in ``plan`` gains slots of some job over what they
    hold first, each group in its given order."""
    gaining: list[DaemonSession] = []
    others: list[DaemonSession] = []
    for session in sessions:
        held = session.held
        share = plan[session.daemon_id]
        if share != held and any(n > held.get(job_id, 0) for job_id, n in share.items()):
            gaining.append(session)
        else:
            others.append(session)
    return gaining + others
