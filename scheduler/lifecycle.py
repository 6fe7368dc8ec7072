"""A job's lifecycle: create, close, finish, cancel; the rules between states.

::

    create ──▶ OPEN ──close──▶ CLOSED ──finish──▶ FINISHED
                 │  └──────────finish─────────────▲
                 └──────cancel──────▶ CANCELLED ◀──cancel── CLOSED

- **Create** is all or nothing. The id enters the store's stale ledger first, then the queues
  are declared on every broker, then the job is stored (which takes the id off the ledger). If
  a broker fails, the request fails with UNAVAILABLE naming it, no job is stored, and the
  janitor deletes whatever was declared; a crash in between leaves the id in the ledger, so the
  next start deletes it too.
- **Close** records the client's task count; closing a closed job again with the same count is
  a no-op. **Finish** and **cancel** end the job, put its id on the stale ledger in the same
  transaction and have the janitor delete its queues (waiting a little, so in the common case
  they are gone when the call returns). Repeating the same end is a no-op; any other change to
  an ended job is FAILED_PRECONDITION. Finishing an open job is allowed: the client says it
  has every outcome it will wait for. The job's dead-letter queue is kept ``keep_dead`` seconds
  after the end (its deadline stored in the same transaction; see :mod:`truba.scheduler.janitor`).

Every change replans at once, so daemons learn of it without waiting for a heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final, final

from truba.proto.v1 import common_pb2
from truba.scheduler.assigner import Assigner
from truba.scheduler.brokers import Brokers
from truba.scheduler.counters import JobCounters
from truba.scheduler.errors import FailedPrecondition, NotFound
from truba.scheduler.events import EventKind, JobEvents
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.model import Job, JobIds, JobState
from truba.scheduler.store import JobStore, settings_json
from truba.scheduler.validate import (
    check_handler,
    check_importance,
    check_job_id,
    check_name,
    check_settings,
    check_submitted,
)

log = logging.getLogger(__name__)

DEFAULT_CONSUMER_TIMEOUT: Final = 1800.0
"""RabbitMQ's default delivery-ack timeout (30 minutes), seconds."""
DEFAULT_KEEP_DEAD: Final = 7 * 24 * 3600.0
"""Seconds an ended job's dead-letter queue (its given-up and poison tasks) is kept: 7 days."""


@final
class JobLifecycle:
    """Creates jobs and moves them between states; the store, brokers and plan follow.

    Args:
        delete_wait: how long finish/cancel wait for the queues to be deleted before answering
            (the deletion goes on in the background after that).
        keep_dead: seconds an ended job's dead-letter queue is kept (0: deleted with the others).
    """

    def __init__(
        self,
        store: JobStore,
        brokers: Brokers,
        janitor: QueueJanitor,
        assigner: Assigner,
        *,
        events: JobEvents | None = None,
        counters: JobCounters | None = None,
        ids: JobIds | None = None,
        clock: Callable[[], float] = time.time,
        delete_wait: float = 5.0,
        consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT,
        keep_dead: float = DEFAULT_KEEP_DEAD,
    ) -> None:
        if keep_dead < 0:
            raise ValueError(f"keep_dead: must be >= 0, got {keep_dead}")
        self._keep_dead = keep_dead
        self._store = store
        self.events = events or JobEvents()
        self.counters = counters or JobCounters()
        self._consumer_timeout = consumer_timeout
        self._brokers = brokers
        self._janitor = janitor
        self._assigner = assigner
        self._ids = ids or JobIds(clock)
        self._clock = clock
        self._delete_wait = delete_wait
        self.owner: Callable[[str], str | None] = lambda job_id: None
        """The schedule a job runs for, if any (set by the scheduler): such a job ends only with
        its schedule."""

    async def create(
        self,
        handler: str,
        importance: float,
        name: str = "",
        settings: common_pb2.JobSettings | None = None,
    ) -> Job:
        """Creates an open job with its queues on every broker.

        Raises:
            InvalidArgument: a malformed handler, importance, name or setting.
            FailedPrecondition: daemons are connected and none allows ``handler``.
            Unavailable: a broker failed; nothing was created.
        """
        handler = check_handler(handler)
        importance = check_importance(importance)
        name = check_name(name)
        job_settings = check_settings(
            settings or common_pb2.JobSettings(), consumer_timeout=self._consumer_timeout
        )
        self._assigner.check_allowed(handler)
        job = Job(
            id=self._ids.new(),
            name=name,
            handler=handler,
            importance=importance,
            state=JobState.OPEN,
            created_at=self._clock(),
            settings=job_settings,
        )
        self._store.reserve(job.id)
        began = time.perf_counter()
        try:
            await self._brokers.declare(job.queues)
        except BaseException as exc:  # also a cancelled request: never leave queues behind
            log.warning("sched.job.create_failed", extra={"job_id": job.id, "error": str(exc) or repr(exc)})
            self._janitor.reap(job.id)
            raise
        declared = time.perf_counter()
        declared_cpu = time.thread_time()
        self._store.insert(job)
        self._assigner.replan()
        log.info(
            "sched.job.created",
            extra={
                "job_id": job.id,
                "handler": handler,
                "importance": importance,
                "job_name": name,
                "settings": settings_json(job_settings),
                # Where CreateJob's time goes: the brokers' declarations, then the store and the
                # plan with its pushes into the daemons' outboxes.
                "declare_ms": round((declared - began) * 1000, 1),
                "plan_ms": round((time.perf_counter() - declared) * 1000, 1),
                # The same on the loop's thread's CPU clock: plan_ms less the time the machine
                # gave other threads and processes (on a loaded machine they differ a lot).
                "plan_cpu_ms": round((time.thread_time() - declared_cpu) * 1000, 1),
            },
        )
        return job

    def get(self, job_id: str) -> Job:
        """The job.

        Raises:
            InvalidArgument: an empty or malformed id.
            NotFound: no such job.
        """
        job = self._store.get(check_job_id(job_id))
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    def find(self, job_id: str) -> Job | None:
        """The job, or None (no checks: for ids the scheduler made)."""
        return self._store.get(job_id)

    def list(self, *, include_done: bool = False) -> Sequence[Job]:
        """Runnable jobs (or all), oldest first."""
        return self._store.list(include_done=include_done)

    def close(self, job_id: str, submitted: int) -> Job:
        """No more tasks: records the client's task count.

        Raises:
            InvalidArgument, NotFound: as :meth:`get`, or a count too large to store.
            FailedPrecondition: the job ended, or was closed with another count.
        """
        submitted = check_submitted(submitted)
        job = self.get(job_id)
        if job.state is JobState.CLOSED:
            if job.submitted != submitted:
                raise FailedPrecondition(
                    f"job {job.id!r} is already closed with submitted={job.submitted}, got {submitted}"
                )
            return job
        if job.state is not JobState.OPEN:
            raise FailedPrecondition(f"job {job.id!r} is {job.state.value.lower()}: it cannot be closed")
        job = replace(job, state=JobState.CLOSED, submitted=submitted, closed_at=self._clock())
        self._store.update(job)
        log.info("sched.job.closed", extra={"job_id": job.id, "submitted": submitted})
        self.events.publish(job.id, EventKind.STATE)
        self._assigner.replan()
        return job

    def set_importance(self, job_id: str, importance: float) -> Job:
        """Changes a runnable job's weight in the fair share; the plan follows at once.

        Raises:
            InvalidArgument, NotFound: as :meth:`get`, or a bad importance.
            FailedPrecondition: the job ended.
        """
        importance = check_importance(importance)
        job = self.get(job_id)
        if not job.runnable:
            raise FailedPrecondition(f"job {job.id!r} is {job.state.value.lower()}: its importance is final")
        if job.importance == importance:
            return job
        log.info(
            "sched.job.importance",
            extra={"job_id": job.id, "importance": importance, "was": job.importance},
        )
        job = replace(job, importance=importance)
        self._store.update(job)
        self.events.publish(job.id, EventKind.IMPORTANCE)
        self._assigner.replan()
        return job

    def report_progress(
        self,
        job_id: str,
        submitted: int,
        received: int,
        delayed: int = 0,
        latency: tuple[Sequence[int], float] | None = None,
    ) -> None:
        """A client's task counters for a runnable job (they feed its demand; ``delayed`` tasks,
        not due yet, do not), and the outcomes it took by latency: ``(counts per bucket, sum)``,
        cumulative (:mod:`truba.scheduler.outcome_latency`).

        Raises:
            InvalidArgument, NotFound: as :meth:`get`, or a count too large to store.
            FailedPrecondition: the job ended.
        """
        submitted = check_submitted(submitted)
        received = check_submitted(received, field="received")
        delayed = check_submitted(delayed, field="delayed")
        job = self.get(job_id)
        if not job.runnable:
            raise FailedPrecondition(f"job {job.id!r} is {job.state.value.lower()}: no progress to report")
        if latency is not None:
            self.counters.latencies.report(job.id, *latency)
        if self.counters.client_report(job.id, submitted, received, self._clock(), delayed=delayed):
            log.debug(
                "sched.job.progress",
                extra={"job_id": job.id, "submitted": submitted, "received": received, "delayed": delayed},
            )
            self.events.publish(job.id, EventKind.PROGRESS)
            if job.state is JobState.OPEN and received >= submitted > 0:
                # seed 004's FINQ: nothing queued or running; a client reports (n, n) once per n
                self.events.publish(job.id, EventKind.DRAINED)
            self._assigner.demand_changed()

    async def finish(self, job_id: str) -> Job:
        """The client has every outcome: deletes the job's queues; the job is FINISHED.

        Raises:
            InvalidArgument, NotFound: as :meth:`get`.
            FailedPrecondition: the job was cancelled.
        """
        return await self._end(job_id, JobState.FINISHED)

    async def cancel(self, job_id: str) -> Job:
        """Stops the job at once and deletes its queues; the job is CANCELLED.

        Raises:
            InvalidArgument, NotFound: as :meth:`get`.
            FailedPrecondition: the job finished.
        """
        return await self._end(job_id, JobState.CANCELLED)

    async def _end(self, job_id: str, state: JobState) -> Job:
        job = self.get(job_id)
        if job.state is state:
            return job  # a repeated call; a deletion still under way goes on in the background
        if not job.runnable:
            verb = "finished" if state is JobState.FINISHED else "cancelled"
            raise FailedPrecondition(f"job {job.id!r} is {job.state.value.lower()}: it cannot be {verb}")
        schedule = self.owner(job.id)
        if schedule is not None:
            raise FailedPrecondition(
                f"job {job.id!r} carries the runs of schedule {schedule!r}: delete the schedule instead"
                f" (truba schedule delete {schedule})"
            )
        now = self._clock()
        job = replace(job, state=state, finished_at=now)
        keep_until = now + self._keep_dead if self._keep_dead > 0 else None
        self._store.update(job, delete_queues=True, keep_dead_until=keep_until)
        self.counters.latencies.forget(job.id)
        event = "sched.job.finished" if state is JobState.FINISHED else "sched.job.cancelled"
        log.info(event, extra={"job_id": job.id, "submitted": job.submitted})
        self.events.publish(job.id, EventKind.STATE)
        self._assigner.replan()
        if not await self._janitor.reap_within(job.id, self._delete_wait):
            log.warning("sched.job.queues_pending", extra={"job_id": job.id, "waited": self._delete_wait})
        return job
