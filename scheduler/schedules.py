"""Schedules' lifecycle: create, pause, resume, delete, list; each schedule owns one job.

A schedule's runs are tasks of a long-lived job the scheduler creates for it through the normal
job machinery (:meth:`~truba.scheduler.lifecycle.JobLifecycle.create`): the schedule's handler
and importance, ``task_timeout`` = the deadline (the daemon kills a run past it),
``max_attempts`` 1 (a run whose daemon died is given up, not run again: the next tick fires),
no frames, and one slot (``min_slots`` = ``max_slots`` = 1: a runner always listens, so a run
starts within milliseconds of its due time; each schedule holds one slot of a daemon that
allows its handler, paused or not). Deleting the schedule cancels its job; ending that job any
other way (``truba cancel``) is refused while the schedule exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import final

from truba.proto.v1 import common_pb2
from truba.scheduler.errors import FailedPrecondition, InvalidArgument, NotFound
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.model import JobIds
from truba.scheduler.schedule_loop import FiringLoop
from truba.scheduler.schedule_model import (
    MAX_PAYLOAD,
    Schedule,
    ScheduleRun,
    ScheduleState,
    check_timing,
    first_due,
    resumed_due,
)
from truba.scheduler.schedule_store import ScheduleStore
from truba.scheduler.validate import check_handler, check_importance, check_job_id, check_name

log = logging.getLogger(__name__)


def job_settings(deadline: float) -> common_pb2.JobSettings:
    """The settings of a schedule's job (see the module)."""
    return common_pb2.JobSettings(
        min_slots=1, max_slots=1, task_timeout=deadline, max_attempts=1, no_frames=True
    )


@final
class ScheduleBook:
    """Creates and changes schedules; the store and the firing loop follow.

    Args:
        consumer_timeout: the brokers' delivery-ack timeout: the longest deadline.
    """

    def __init__(
        self,
        store: ScheduleStore,
        jobs: JobLifecycle,
        loop: FiringLoop,
        *,
        consumer_timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._jobs = jobs
        self._loop = loop
        self._consumer_timeout = consumer_timeout
        self._clock = clock
        self._ids = JobIds(clock)
        jobs.owner = loop.owner_of

    def restore(self) -> int:
        """Tracks every stored schedule whose job runs (at start); how many it tracks. A schedule
        whose job ended (a crash during its deletion) is left for a delete to finish."""
        tracked = 0
        for schedule in self._store.list():
            job = self._jobs.find(schedule.job_id)
            if job is None or not job.runnable:
                log.error(
                    "sched.schedule.job_ended", extra={"schedule_id": schedule.id, "job_id": schedule.job_id}
                )
                continue
            self._loop.track(schedule)
            tracked += 1
        return tracked

    async def create(
        self,
        handler: str,
        *,
        every: float = 0.0,
        cron: str = "",
        payload: bytes = b"",
        deadline: float = 0.0,
        importance: float = 0.0,
        name: str = "",
    ) -> Schedule:
        """A new active schedule and its job; it fires from its first due time.

        Raises:
            InvalidArgument: a bad handler, timing, deadline, importance, name or payload.
            FailedPrecondition: daemons are connected and none allows ``handler``.
            Unavailable: a broker or the store failed; nothing was created.
        """
        handler = check_handler(handler)
        every, cron, deadline = check_timing(every, cron, deadline, max_deadline=self._consumer_timeout)
        importance = check_importance(importance or 1.0)
        name = check_name(name)
        if len(payload) > MAX_PAYLOAD:
            raise InvalidArgument(
                "payload", f"must be at most {MAX_PAYLOAD} bytes encoded, got {len(payload)}"
            )
        schedule_id = self._ids.new()
        job = await self._jobs.create(
            handler, importance, f"schedule {name or schedule_id}", job_settings(deadline)
        )
        now = self._clock()
        schedule = Schedule(
            id=schedule_id,
            name=name,
            handler=handler,
            job_id=job.id,
            every=every,
            cron=cron,
            payload=payload,
            deadline=deadline,
            importance=importance,
            created_at=now,
            next_due=first_due(every, cron, now),
        )
        try:
            self._store.add(schedule)
        except BaseException:
            await self._jobs.cancel(job.id)
            raise
        log.info(
            "sched.schedule.created",
            extra={
                "schedule_id": schedule_id,
                "job_id": job.id,
                "handler": handler,
                "every": every,
                "cron": cron,
                "deadline": deadline,
            },
        )
        self._loop.track(schedule)
        return schedule

    def get(self, schedule_id: str) -> Schedule:
        """The schedule as stored.

        Raises:
            InvalidArgument: an empty or malformed id.
            NotFound: no such schedule.
        """
        try:
            check_job_id(schedule_id)
        except InvalidArgument as exc:
            raise InvalidArgument("schedule_id", str(exc).partition(": ")[2]) from None
        schedule = self._store.get(schedule_id)
        if schedule is None:
            raise NotFound(f"schedule {schedule_id!r} not found")
        return schedule

    def list(self) -> Sequence[Schedule]:
        """Every schedule, oldest first."""
        return self._store.list()

    def runs(self, schedule_id: str, limit: int = 0) -> Sequence[ScheduleRun]:
        """The schedule's last runs, newest first."""
        return self._store.runs(self.get(schedule_id).id, limit)

    def pause(self, schedule_id: str) -> Schedule:
        """No more runs until resumed; a run under way goes on. Pausing again changes nothing."""
        schedule = self.get(schedule_id)
        if schedule.state is ScheduleState.PAUSED:
            return schedule
        return self._set(schedule, ScheduleState.PAUSED, schedule.next_due)

    def resume(self, schedule_id: str) -> Schedule:
        """Runs again from its first due time at or after now (missed ones are skipped)."""
        schedule = self.get(schedule_id)
        if schedule.state is ScheduleState.ACTIVE:
            return schedule
        return self._set(schedule, ScheduleState.ACTIVE, resumed_due(schedule, self._clock()))

    def _set(self, schedule: Schedule, state: ScheduleState, due: float) -> Schedule:
        if not self._store.set_state(schedule.id, state, due):
            raise NotFound(f"schedule {schedule.id!r} not found")
        log.info("sched.schedule.state", extra={"schedule_id": schedule.id, "state": state.value})
        fresh = self._store.get(schedule.id) or replace(schedule, state=state, next_due=due)
        self._loop.track(fresh)
        return fresh

    async def delete(self, schedule_id: str) -> None:
        """Deletes the schedule and its runs, and cancels its job (a run under way with it).

        The job is cancelled first: a crash in between leaves a schedule whose job ended (kept,
        not fired, deleted again by the next call), never a job holding a slot for nothing.
        """
        schedule = self.get(schedule_id)
        await self._loop.untrack(schedule.id)
        try:
            await self._jobs.cancel(schedule.job_id)
        except (FailedPrecondition, NotFound) as exc:  # the job ended some other way
            log.info("sched.schedule.job_gone", extra={"schedule_id": schedule.id, "error": str(exc)})
        except BaseException:
            self._loop.track(schedule)  # (the store failed) it goes on as it was
            raise
        self._store.remove(schedule.id)
        log.info("sched.schedule.deleted", extra={"schedule_id": schedule.id, "job_id": schedule.job_id})


def schedule_progress(lifecycle: JobLifecycle) -> Callable[[Schedule], None]:
    """What the firing loop tells of a schedule, as its job's progress report: runs sent are the
    job's submitted tasks, the ones ended (or lost) its outcomes. Without it a schedule's job
    would show no task done (outcomes are capped at the tasks submitted) and its demand would
    stay unknown (the planner gives an unknown demand slots)."""

    def report(schedule: Schedule) -> None:
        ended = schedule.runs - (1 if schedule.run_task else 0)
        try:
            lifecycle.report_progress(schedule.job_id, schedule.runs, ended)
        except (FailedPrecondition, NotFound) as exc:  # the job ended (schedule deleted): no count
            log.debug("sched.schedule.progress_refused", extra={"job_id": schedule.job_id, "error": str(exc)})

    return report
