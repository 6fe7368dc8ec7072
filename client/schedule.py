"""Periodic schedules: a handler the scheduler runs every N seconds or on a cron expression.

::

    schedule = await client.create_schedule("app.health:check", every=1.0, deadline=0.8)
    for run in await schedule.runs():
        print(run.outcome, run.duration, run.error)
    await schedule.pause(); await schedule.resume(); await schedule.delete()

The scheduler keeps schedules in its store and fires them itself (``truba.v1.ScheduleService``):
at most one run at a time, a run past its deadline killed and counted (``timeout``), a run whose
daemon died counted ``lost`` and the schedule fired again; nothing here needs to stay running.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, final

import grpc.aio

from truba import codec
from truba.client.errors import InvalidArgument
from truba.client.handler_name import handler_name
from truba.client.reach import Reach
from truba.proto.v1 import schedules_pb2, schedules_pb2_grpc

RunKind = Literal["running", "ok", "error", "timeout", "lost"]
_KINDS: Final[dict[int, RunKind]] = {
    schedules_pb2.RUN_OUTCOME_RUNNING: "running",
    schedules_pb2.RUN_OUTCOME_OK: "ok",
    schedules_pb2.RUN_OUTCOME_ERROR: "error",
    schedules_pb2.RUN_OUTCOME_TIMEOUT: "timeout",
    schedules_pb2.RUN_OUTCOME_LOST: "lost",
}


@dataclass(frozen=True)
class ScheduleRun:
    """One run of a schedule. Times are Unix seconds (``ended`` 0 while running); ``duration`` is
    the handler's time as its daemon measured it; ``error`` is ``"Type: message"`` for an error,
    a timeout or a lost run."""

    task_id: str
    outcome: RunKind
    due: float
    started: float
    ended: float
    duration: float
    error: str
    daemon_id: str

    @classmethod
    def from_pb(cls, run: schedules_pb2.ScheduleRun) -> ScheduleRun:
        return cls(
            run.task_id,
            _KINDS.get(run.outcome, "running"),
            run.due,
            run.started,
            run.ended,
            run.duration,
            run.error,
            run.daemon_id,
        )


@final
class Schedule:
    """A schedule known by id: its info, its last runs, pause, resume, delete.

    Every call raises NotFound once the schedule is deleted, Unavailable when the scheduler does
    not answer within the client's ``unavailable_after``.
    """

    def __init__(
        self, stub: schedules_pb2_grpc.ScheduleServiceAsyncStub, info: schedules_pb2.Schedule, reach: Reach
    ) -> None:
        self._stub = stub
        self._reach = reach
        self.info = info
        """The scheduler's view as of the last call (refreshed by :meth:`refresh`, pause, resume)."""

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def job_id(self) -> str:
        """The job the schedule's runs go to."""
        return self.info.job_id

    async def refresh(self) -> schedules_pb2.Schedule:
        """The scheduler's current view (state, next due time, runs fired, last run)."""
        request = schedules_pb2.GetScheduleRequest(schedule_id=self.id)
        self.info = await self._reach.call(
            "GetSchedule", lambda t: self._stub.GetSchedule(request, timeout=t)
        )
        return self.info

    async def runs(self, limit: int = 0) -> list[ScheduleRun]:
        """The last runs, newest first (``limit`` 0: all the scheduler keeps, 100)."""
        request = schedules_pb2.ListRunsRequest(schedule_id=self.id, limit=limit)
        response = await self._reach.call("ListRuns", lambda t: self._stub.ListRuns(request, timeout=t))
        return [ScheduleRun.from_pb(run) for run in response.runs]

    async def pause(self) -> None:
        """No more runs until :meth:`resume` (a run under way goes on)."""
        request = schedules_pb2.ScheduleRef(schedule_id=self.id)
        self.info = await self._reach.call(
            "PauseSchedule", lambda t: self._stub.PauseSchedule(request, timeout=t)
        )

    async def resume(self) -> None:
        """Runs again from its next due time (times missed while paused are skipped)."""
        request = schedules_pb2.ScheduleRef(schedule_id=self.id)
        self.info = await self._reach.call(
            "ResumeSchedule", lambda t: self._stub.ResumeSchedule(request, timeout=t)
        )

    async def delete(self) -> None:
        """Deletes the schedule, its runs and its job (a run under way is cancelled)."""
        request = schedules_pb2.ScheduleRef(schedule_id=self.id)
        await self._reach.call("DeleteSchedule", lambda t: self._stub.DeleteSchedule(request, timeout=t))


class ScheduleCalls:
    """The schedule verbs of :class:`~truba.client.Client` (which provides the channel and reach)."""

    _channel: grpc.aio.Channel | None
    _reach: Reach

    async def create_schedule(
        self,
        handler: str | Callable[[Any], Any],
        *,
        every: float | None = None,
        cron: str | None = None,
        payload: object = None,
        deadline: float | None = None,
        importance: float = 1.0,
        name: str = "",
    ) -> Schedule:
        """Has the scheduler run ``handler(payload)`` every ``every`` seconds (at least 0.1), or
        at the times of a five-field ``cron`` expression (UTC); at most one run at a time, each
        killed past ``deadline`` seconds (default: the period). See :mod:`truba.client.schedule`.

        Raises:
            InvalidArgument: a bad argument (the message names it). FailedPrecondition: no
                connected daemon allows ``handler``. Unavailable: the scheduler or a broker.
        """
        request = create_request(
            handler,
            every=every,
            cron=cron,
            payload=payload,
            deadline=deadline,
            importance=importance,
            name=name,
        )
        stub = self._schedule_stub()
        info = await self._reach.call(
            "CreateSchedule", lambda t: stub.CreateSchedule(request, timeout=t), repeatable=False
        )
        return Schedule(stub, info, self._reach)

    async def schedules(self) -> list[Schedule]:
        """Every schedule the scheduler keeps, oldest first."""
        stub = self._schedule_stub()
        request = schedules_pb2.ListSchedulesRequest()
        response = await self._reach.call("ListSchedules", lambda t: stub.ListSchedules(request, timeout=t))
        return [Schedule(stub, info, self._reach) for info in response.schedules]

    async def schedule(self, schedule_id: str) -> Schedule:
        """A schedule by id. Raises NotFound for an unknown one."""
        stub = self._schedule_stub()
        request = schedules_pb2.GetScheduleRequest(schedule_id=schedule_id)
        info = await self._reach.call("GetSchedule", lambda t: stub.GetSchedule(request, timeout=t))
        return Schedule(stub, info, self._reach)

    def _schedule_stub(self) -> schedules_pb2_grpc.ScheduleServiceAsyncStub:
        if self._channel is None:
            raise RuntimeError("schedules need a connected client with a channel to the scheduler")
        return schedules_pb2_grpc.ScheduleServiceStub(self._channel)


def create_request(
    handler: str | Callable[[Any], Any],
    *,
    every: float | None,
    cron: str | None,
    payload: object,
    deadline: float | None,
    importance: float,
    name: str,
) -> schedules_pb2.CreateScheduleRequest:
    """The CreateSchedule request, checked as far as the client can (the scheduler checks again).

    Raises:
        InvalidArgument: not exactly one of ``every`` and ``cron``, a number that is not > 0, a
            handler daemons cannot import, or a payload msgpack cannot encode.
    """
    if (every is None) == (cron is None):
        raise _invalid("every", "give exactly one of every=SECONDS and cron='EXPRESSION'")
    for field, value in (("every", every), ("deadline", deadline), ("importance", importance)):
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise _invalid(field, f"must be a number > 0, got {value!r}")
    try:
        encoded = codec.packb(payload)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _invalid("payload", f"cannot be encoded: {exc}") from None
    return schedules_pb2.CreateScheduleRequest(
        handler=handler_name(handler),
        every=float(every or 0.0),
        cron=cron or "",
        payload=encoded,
        deadline=float(deadline or 0.0),
        importance=float(importance),
        name=name,
    )


def _invalid(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument("INVALID_ARGUMENT", f"{field}: {problem}")
