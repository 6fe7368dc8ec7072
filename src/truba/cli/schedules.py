"""``truba schedules`` (list, ``--runs ID``: a schedule's last runs) and ``truba schedule
pause|resume|delete ID``."""

from __future__ import annotations

import argparse
from typing import Final

from truba.cli.exits import OK
from truba.cli.render import Row, iso_time, print_json, print_table
from truba.cli.session import Session, add_client_arguments, session
from truba.proto.v1 import schedules_pb2, schedules_pb2_grpc

ERROR_WIDTH: Final = 60
"""Characters of a run's error a table row shows (``--json`` has all of it)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``schedules`` and ``schedule``."""
    parser = sub.add_parser(
        "schedules",
        help="list periodic schedules; --runs ID: a schedule's last runs",
        description="List the scheduler's periodic schedules: timing, state, next run, last outcome.",
    )
    add_client_arguments(parser)
    parser.add_argument("--runs", metavar="SCHEDULE_ID", help="show this schedule's last runs instead")
    parser.set_defaults(func=list_schedules)

    parser = sub.add_parser(
        "schedule",
        help="pause, resume or delete a schedule",
        description="Pause a schedule (no new runs), resume it, or delete it with its runs and its job.",
    )
    parser.add_argument("action", choices=("pause", "resume", "delete"))
    parser.add_argument(
        "schedule_id", metavar="SCHEDULE_ID", help="the schedule's id (truba schedules lists them)"
    )
    add_client_arguments(parser)
    parser.set_defaults(func=change_schedule)


def schedule_dict(schedule: schedules_pb2.Schedule) -> Row:
    """One schedule as ``--json`` prints it."""
    last = schedule.last_run if schedule.HasField("last_run") else None
    return {
        "id": schedule.id,
        "name": schedule.name,
        "handler": schedule.handler,
        "every": schedule.every or None,
        "cron": schedule.cron or None,
        "deadline": schedule.deadline,
        "importance": schedule.importance,
        "state": schedules_pb2.ScheduleState.Name(schedule.state).removeprefix("SCHEDULE_STATE_").lower(),
        "job_id": schedule.job_id,
        "created_at": iso_time(schedule.created_at),
        "next_due": iso_time(schedule.next_due),
        "running": schedule.lease_until > 0,
        "runs": schedule.runs,
        "last_run": run_dict(last) if last is not None else None,
    }


def run_dict(run: schedules_pb2.ScheduleRun) -> Row:
    """One run as ``--json`` prints it."""
    return {
        "task_id": run.task_id,
        "outcome": schedules_pb2.RunOutcome.Name(run.outcome).removeprefix("RUN_OUTCOME_").lower(),
        "due": iso_time(run.due),
        "started": run.started,
        "ended": run.ended or None,
        "late": round(run.started - run.due, 4) if run.due else None,
        "duration": run.duration,
        "error": run.error,
        "daemon_id": run.daemon_id,
    }


def list_schedules(args: argparse.Namespace) -> int:
    with session(args) as s:
        stub = schedules_pb2_grpc.ScheduleServiceStub(s.channel)
        if args.runs:
            return _runs(s, stub, args.runs, as_json=args.json)
        schedules = s.call(stub.ListSchedules, schedules_pb2.ListSchedulesRequest()).schedules
    rows = [schedule_dict(schedule) for schedule in schedules]
    if args.json:
        print_json(rows)
        return OK
    table = []
    for row in rows:
        last = row["last_run"]
        table.append(
            [
                row["id"],
                row["name"] or "-",
                row["handler"],
                f"every {row['every']:g}s" if row["every"] else f"cron {row['cron']}",
                row["state"],
                row["runs"],
                last["outcome"] if isinstance(last, dict) else "-",
                row["next_due"] if row["state"] == "active" else "-",
            ]
        )
    print_table(
        ["SCHEDULE", "NAME", "HANDLER", "WHEN", "STATE", "RUNS", "LAST", "NEXT"], table, right=frozenset({5})
    )
    return OK


def _runs(
    s: Session, stub: schedules_pb2_grpc.ScheduleServiceStub, schedule_id: str, *, as_json: bool
) -> int:
    runs = s.call(stub.ListRuns, schedules_pb2.ListRunsRequest(schedule_id=schedule_id)).runs
    rows = [run_dict(run) for run in runs]
    if as_json:
        print_json(rows)
        return OK
    table = [
        [
            row["task_id"],
            row["due"],
            row["outcome"],
            f"{row['late']:.3f}" if row["late"] is not None else "-",
            f"{run.duration:.3f}",
            _short(run.error) or "-",
        ]
        for row, run in zip(rows, runs, strict=True)
    ]
    print_table(["RUN", "DUE", "OUTCOME", "LATE", "SECONDS", "ERROR"], table, right=frozenset({3, 4}))
    return OK


def change_schedule(args: argparse.Namespace) -> int:
    with session(args) as s:
        stub = schedules_pb2_grpc.ScheduleServiceStub(s.channel)
        ref = schedules_pb2.ScheduleRef(schedule_id=args.schedule_id)
        if args.action == "delete":
            s.call(stub.DeleteSchedule, ref)
            if args.json:
                print_json({"id": args.schedule_id, "deleted": True})
            else:
                print(f"schedule {args.schedule_id}: deleted")
            return OK
        method = stub.PauseSchedule if args.action == "pause" else stub.ResumeSchedule
        schedule = s.call(method, ref)
    row = schedule_dict(schedule)
    if args.json:
        print_json(row)
    else:
        print(f"schedule {schedule.id}: {row['state']}")
    return OK


def _short(error: str) -> str:
    error = " ".join(error.split())
    return error if len(error) <= ERROR_WIDTH else error[: ERROR_WIDTH - 1] + "…"
