"""The firing loop: every schedule due and not held is claimed in the store, and its run sent.

:meth:`FiringLoop.tick` is one pass over the schedules it tracks: a schedule that may fire
(:func:`~truba.scheduler.schedule_model.may_fire`) is claimed with the store's conditional
UPDATE (:meth:`~truba.scheduler.schedule_store.ScheduleStore.claim`, the lease), and only a
successful claim sends the run's task, in the background; a send that fails ends the run as an
error and frees the schedule at once. A run whose lease expired without an outcome (its daemon
died and nobody gave it up, the scheduler was down) is counted lost and the schedule fires again.
:meth:`FiringLoop.run` ticks at each schedule's due time and at least every :data:`TICK` seconds.

Per tracked schedule, a reader takes the job's results (:meth:`RunPipe.outcome`): each is
recorded as its run's outcome (ok, error, timeout, lost: a give-up after the daemon died), which
frees the lease, then acked. A result whose recording fails stays unacked and comes again.

State lives in the store; the loop's copy of each schedule is a cache for the decision, and a
claim that loses (the store says otherwise) reloads it. A scheduler killed at any point
restarts with the schedules and leases of the store: a held lease is honoured until it expires
or the run's outcome (left in the result queue) frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final, Protocol, final

from truba.pipes.errors import PipeError
from truba.queues import JobQueues, job_queues
from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.schedule_model import (
    LEASE_GRACE,
    START_WITHIN,
    RunOutcome,
    Schedule,
    ScheduleRun,
    lease_until,
    may_fire,
    next_due,
)
from truba.scheduler.schedule_pipes import RunPipe, SchedulePipes
from truba.scheduler.schedule_store import LOST_BY_LEASE, ScheduleStore
from truba.wire import ResultMessage

log = logging.getLogger(__name__)

TICK: Final = 0.1
"""Seconds between two passes at most (a pass also runs at each schedule's due time)."""
MIN_SLEEP: Final = 0.005
OUTCOME_WAIT: Final = 0.5
"""Seconds one wait of a reader for a result lasts (then it checks it is still wanted)."""
STORE_RETRY: Final = 1.0
"""Seconds a reader waits before taking a result again whose recording the store refused."""


def outcome_of(message: ResultMessage) -> tuple[RunOutcome, str]:
    """A run's outcome and error text from its task's result."""
    if message.ok:
        return RunOutcome.OK, ""
    error = message.error
    text = f"{error.type}: {error.message}" if error is not None else "UnknownError"
    if error is not None and error.type == "TaskTimeout":
        return RunOutcome.TIMEOUT, text
    if message.gave_up:  # its attempt ended without an outcome (its daemon died), or it expired unrun
        return RunOutcome.LOST, text
    return RunOutcome.ERROR, text


class RunObserver(Protocol):
    """Told of every run sent and ended (the scheduler's metrics)."""

    def schedule_fired(self, schedule_id: str, late: float) -> None: ...

    def schedule_ended(self, schedule_id: str, outcome: str) -> None: ...

    def schedule_gone(self, schedule_id: str) -> None: ...


class _Unobserved:
    def schedule_fired(self, schedule_id: str, late: float) -> None:
        pass

    def schedule_ended(self, schedule_id: str, outcome: str) -> None:
        pass

    def schedule_gone(self, schedule_id: str) -> None:
        pass


@dataclass
class _Tracked:
    schedule: Schedule
    pipe: RunPipe
    reader: asyncio.Task[None] | None = None


@final
class FiringLoop:
    """Fires the schedules it tracks; see the module. ``clock`` is Unix time (injected in tests)."""

    def __init__(
        self,
        store: ScheduleStore,
        pipes: SchedulePipes,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        queues: Callable[[str], JobQueues] = job_queues,
        observer: RunObserver | None = None,
        progress: Callable[[Schedule], None] | None = None,
    ) -> None:
        self._store = store
        self._observer: RunObserver = observer or _Unobserved()
        self._progress = progress
        """Told each schedule after a run is sent or ends: the scheduler reports its job's counts
        (runs sent as submitted, ended ones as received), as a client reports its own job's."""
        self._pipes = pipes
        self._clock = clock
        self._sleep = sleep
        self._queues = queues
        self._tracked: dict[str, _Tracked] = {}
        self._sends: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()

    def track(self, schedule: Schedule, *, read: bool = True) -> None:
        """Fires ``schedule`` from now on (again: its cached copy is replaced). With ``read``, a
        reader records its job's results (tests drive :meth:`record` themselves)."""
        tracked = self._tracked.get(schedule.id)
        if tracked is None:
            schedule = self._with_time_to_read(schedule)
            tracked = _Tracked(schedule, self._pipes.open(self._queues(schedule.job_id)))
            self._tracked[schedule.id] = tracked
            if read:
                tracked.reader = asyncio.create_task(self._read(tracked), name=f"schedule-{schedule.id}")
        tracked.schedule = schedule
        self._wake.set()

    def _with_time_to_read(self, schedule: Schedule) -> Schedule:
        """A schedule first tracked here (the scheduler restarted, or took over) with a run whose
        lease ran out, or nearly, while no loop read its job's results: the run's outcome may be
        waiting in the results queue, so the lease is held (here, not in the store) for
        :data:`LEASE_GRACE` more, time for the reader to record it rather than count it lost."""
        if not schedule.run_task:
            return schedule
        until = self._clock() + LEASE_GRACE
        if schedule.lease_until >= until:
            return schedule
        log.info(
            "sched.schedule.lease_held_to_read",
            extra={"schedule_id": schedule.id, "task_id": schedule.run_task, "until": round(until, 3)},
        )
        return replace(schedule, lease_until=until)

    def owner_of(self, job_id: str) -> str | None:
        """The id of the tracked schedule whose runs go to ``job_id``, if any."""
        for schedule_id, tracked in self._tracked.items():
            if tracked.schedule.job_id == job_id:
                return schedule_id
        return None

    def cached(self, schedule_id: str) -> Schedule | None:
        tracked = self._tracked.get(schedule_id)
        return tracked.schedule if tracked is not None else None

    async def untrack(self, schedule_id: str) -> None:
        """Stops firing and reading a schedule (deleted)."""
        tracked = self._tracked.pop(schedule_id, None)
        if tracked is not None:
            self._observer.schedule_gone(schedule_id)
            await _stop(tracked)

    async def run(self) -> None:
        """Ticks until cancelled."""
        while True:
            try:
                await self.tick()
            except StoreUnavailable as exc:  # the lease is in the store: nothing fires without it
                log.warning("sched.schedule.store_failed", extra={"error": str(exc)})
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._pause())

    def _pause(self) -> float:
        now = self._clock()
        soonest = now + TICK
        for tracked in self._tracked.values():
            s = tracked.schedule
            if s.active:
                soonest = min(soonest, max(s.next_due, s.lease_until))
        return max(MIN_SLEEP, soonest - now)

    async def tick(self) -> list[str]:
        """One pass: expires held runs past their lease, claims and fires what is due; returns
        the task ids fired.

        Raises:
            StoreUnavailable: the store failed (what was fired before stays fired).
        """
        fired: list[str] = []
        for tracked in list(self._tracked.values()):
            now = self._clock()
            schedule = tracked.schedule
            if schedule.run_task and schedule.lease_until <= now:
                self._expire(tracked, now)
                schedule = tracked.schedule
            if not may_fire(schedule, now):
                continue
            task_id = f"run-{schedule.runs + 1}"
            due, until, following = (
                schedule.next_due,
                lease_until(schedule, now),
                next_due(schedule, schedule.next_due, now),
            )
            if not self._store.claim(
                schedule, now=now, lease_until=until, next_due=following, task_id=task_id
            ):
                self._reload(tracked)
                continue
            tracked.schedule = replace(
                schedule, lease_until=until, next_due=following, run_task=task_id, runs=schedule.runs + 1
            )
            self._observer.schedule_fired(schedule.id, now - due)
            self._report(tracked.schedule)
            log.debug(
                "sched.schedule.fired",
                extra={"schedule_id": schedule.id, "task_id": task_id, "late": round(now - due, 4)},
            )
            send = asyncio.create_task(self._send(tracked, task_id, due, now))
            self._sends.add(send)
            send.add_done_callback(self._sends.discard)
            fired.append(task_id)
        return fired

    async def _send(self, tracked: _Tracked, task_id: str, due: float, fired: float) -> None:
        schedule = tracked.schedule
        try:
            await tracked.pipe.fire(task_id, schedule.payload, fired + START_WITHIN)
        except (PipeError, TimeoutError) as exc:
            log.warning(
                "sched.schedule.send_failed",
                extra={"schedule_id": schedule.id, "task_id": task_id, "error": str(exc) or repr(exc)},
            )
            error = f"SendFailed: {type(exc).__name__}: {exc}"
            run = ScheduleRun(schedule.id, task_id, due, fired, self._clock(), RunOutcome.ERROR, error)
            with contextlib.suppress(StoreUnavailable):  # else the lease expires by itself
                self.record(run)

    def _expire(self, tracked: _Tracked, now: float) -> None:
        schedule = tracked.schedule
        run = ScheduleRun(schedule.id, schedule.run_task, 0.0, 0.0, now, RunOutcome.LOST, LOST_BY_LEASE)
        log.warning(
            "sched.schedule.lease_expired", extra={"schedule_id": schedule.id, "task_id": run.task_id}
        )
        self.record(run)

    def _report(self, schedule: Schedule) -> None:
        if self._progress is None:
            return
        try:
            self._progress(schedule)
        except Exception:  # counters are a view: a failed report never stops a schedule
            log.exception("sched.schedule.progress_failed", extra={"schedule_id": schedule.id})

    def _reload(self, tracked: _Tracked) -> None:
        fresh = self._store.get(tracked.schedule.id)
        if fresh is not None:
            tracked.schedule = fresh

    def record(self, run: ScheduleRun) -> bool:
        """Records a run's outcome in the store (freeing the schedule if that run held it);
        True if the run was still running.

        Raises:
            StoreUnavailable: the store failed; nothing was recorded.
        """
        changed = self._store.finish(run)
        tracked = self._tracked.get(run.schedule_id)
        if tracked is not None and tracked.schedule.run_task == run.task_id:
            tracked.schedule = replace(tracked.schedule, lease_until=0.0, run_task="")
            self._wake.set()
        if changed:
            self._observer.schedule_ended(run.schedule_id, run.outcome.value)
            if tracked is not None:
                self._report(tracked.schedule)
            log.info(
                "sched.schedule.run_ended",
                extra={
                    "schedule_id": run.schedule_id,
                    "task_id": run.task_id,
                    "outcome": run.outcome.value,
                    "seconds": round(run.duration, 4),
                    "error": run.error,
                },
            )
        return changed

    async def _read(self, tracked: _Tracked) -> None:
        schedule_id = tracked.schedule.id
        while True:
            try:
                delivery = await tracked.pipe.outcome(OUTCOME_WAIT)
            except PipeError as exc:
                log.warning(
                    "sched.schedule.results_failed", extra={"schedule_id": schedule_id, "error": str(exc)}
                )
                await self._sleep(STORE_RETRY)
                continue
            if delivery is None:
                continue
            message = delivery.message
            outcome, error = outcome_of(message)
            run = ScheduleRun(
                schedule_id,
                message.task_id,
                0.0,
                0.0,
                self._clock(),
                outcome,
                error,
                message.seconds,
                message.daemon_id,
            )
            try:
                self.record(run)
            except StoreUnavailable as exc:
                log.warning(
                    "sched.schedule.store_failed", extra={"schedule_id": schedule_id, "error": str(exc)}
                )
                with contextlib.suppress(PipeError):
                    await delivery.reject(requeue=True)
                await self._sleep(STORE_RETRY)
                continue
            with contextlib.suppress(PipeError):  # not acked: it comes again, and is recorded once
                await delivery.ack()

    async def close(self) -> None:
        """Stops every reader and send, closes every pipe; idempotent."""
        for send in list(self._sends):
            send.cancel()
        tracked, self._tracked = list(self._tracked.values()), {}
        await asyncio.gather(*(_stop(t) for t in tracked), *self._sends, return_exceptions=True)
        await self._pipes.close()


async def _stop(tracked: _Tracked) -> None:
    if tracked.reader is not None:
        tracked.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tracked.reader
    await tracked.pipe.close()
