"""ScheduleService: the gRPC face of :class:`~truba.scheduler.schedules.ScheduleBook`.

Refusals are :class:`~truba.scheduler.errors.SchedulerError`s, turned into a status by
``reports_errors`` (INVALID_ARGUMENT with the field name first, NOT_FOUND, FAILED_PRECONDITION,
UNAVAILABLE).
"""

from __future__ import annotations

from typing import Final, final

import grpc.aio

from truba.proto.v1 import schedules_pb2, schedules_pb2_grpc
from truba.scheduler.jobs import reports_errors
from truba.scheduler.schedule_model import RunOutcome, Schedule, ScheduleRun, ScheduleState
from truba.scheduler.schedules import ScheduleBook

_STATES: Final = {
    ScheduleState.ACTIVE: schedules_pb2.SCHEDULE_STATE_ACTIVE,
    ScheduleState.PAUSED: schedules_pb2.SCHEDULE_STATE_PAUSED,
}
_OUTCOMES: Final = {
    RunOutcome.RUNNING: schedules_pb2.RUN_OUTCOME_RUNNING,
    RunOutcome.OK: schedules_pb2.RUN_OUTCOME_OK,
    RunOutcome.ERROR: schedules_pb2.RUN_OUTCOME_ERROR,
    RunOutcome.TIMEOUT: schedules_pb2.RUN_OUTCOME_TIMEOUT,
    RunOutcome.LOST: schedules_pb2.RUN_OUTCOME_LOST,
}


def run_pb(run: ScheduleRun) -> schedules_pb2.ScheduleRun:
    return schedules_pb2.ScheduleRun(
        task_id=run.task_id,
        due=run.due,
        started=run.started,
        ended=run.ended,
        outcome=_OUTCOMES[run.outcome],
        error=run.error,
        duration=run.duration,
        daemon_id=run.daemon_id,
    )


def schedule_pb(schedule: Schedule, last: ScheduleRun | None = None) -> schedules_pb2.Schedule:
    pb = schedules_pb2.Schedule(
        id=schedule.id,
        name=schedule.name,
        handler=schedule.handler,
        every=schedule.every,
        cron=schedule.cron,
        deadline=schedule.deadline,
        importance=schedule.importance,
        state=_STATES[schedule.state],
        job_id=schedule.job_id,
        created_at=schedule.created_at,
        next_due=schedule.next_due,
        lease_until=schedule.lease_until,
        runs=schedule.runs,
    )
    if last is not None:
        pb.last_run.CopyFrom(run_pb(last))
    return pb


@final
class ScheduleServicer(schedules_pb2_grpc.ScheduleServiceServicer):
    """Serves ``truba.v1.ScheduleService``."""

    def __init__(self, book: ScheduleBook) -> None:
        self._book = book

    def _pb(self, schedule: Schedule) -> schedules_pb2.Schedule:
        last = self._book.runs(schedule.id, 1)
        return schedule_pb(schedule, last[0] if last else None)

    @reports_errors
    async def CreateSchedule(
        self,
        request: schedules_pb2.CreateScheduleRequest,
        context: grpc.aio.ServicerContext[schedules_pb2.CreateScheduleRequest, schedules_pb2.Schedule],
    ) -> schedules_pb2.Schedule:
        schedule = await self._book.create(
            request.handler,
            every=request.every,
            cron=request.cron,
            payload=request.payload,
            deadline=request.deadline,
            importance=request.importance,
            name=request.name,
        )
        return schedule_pb(schedule)

    @reports_errors
    async def GetSchedule(
        self,
        request: schedules_pb2.GetScheduleRequest,
        context: grpc.aio.ServicerContext[schedules_pb2.GetScheduleRequest, schedules_pb2.Schedule],
    ) -> schedules_pb2.Schedule:
        return self._pb(self._book.get(request.schedule_id))

    @reports_errors
    async def ListSchedules(
        self,
        request: schedules_pb2.ListSchedulesRequest,
        context: grpc.aio.ServicerContext[
            schedules_pb2.ListSchedulesRequest, schedules_pb2.ListSchedulesResponse
        ],
    ) -> schedules_pb2.ListSchedulesResponse:
        return schedules_pb2.ListSchedulesResponse(schedules=[self._pb(s) for s in self._book.list()])

    @reports_errors
    async def PauseSchedule(
        self,
        request: schedules_pb2.ScheduleRef,
        context: grpc.aio.ServicerContext[schedules_pb2.ScheduleRef, schedules_pb2.Schedule],
    ) -> schedules_pb2.Schedule:
        return self._pb(self._book.pause(request.schedule_id))

    @reports_errors
    async def ResumeSchedule(
        self,
        request: schedules_pb2.ScheduleRef,
        context: grpc.aio.ServicerContext[schedules_pb2.ScheduleRef, schedules_pb2.Schedule],
    ) -> schedules_pb2.Schedule:
        return self._pb(self._book.resume(request.schedule_id))

    @reports_errors
    async def DeleteSchedule(
        self,
        request: schedules_pb2.ScheduleRef,
        context: grpc.aio.ServicerContext[schedules_pb2.ScheduleRef, schedules_pb2.DeleteScheduleResponse],
    ) -> schedules_pb2.DeleteScheduleResponse:
        await self._book.delete(request.schedule_id)
        return schedules_pb2.DeleteScheduleResponse()

    @reports_errors
    async def ListRuns(
        self,
        request: schedules_pb2.ListRunsRequest,
        context: grpc.aio.ServicerContext[schedules_pb2.ListRunsRequest, schedules_pb2.ListRunsResponse],
    ) -> schedules_pb2.ListRunsResponse:
        runs = self._book.runs(request.schedule_id, request.limit)
        return schedules_pb2.ListRunsResponse(runs=[run_pb(run) for run in runs])
