"""``truba job ID --running``: a job's tasks running now, as a table or ``--json``.

The scheduler answers from each daemon's last heartbeat (``ListRunning``, as
:meth:`truba.client.Job.running` does; the answer is read here as it comes, so that every command
does not pay for importing the client), oldest start first. The table has a row per task: TASK,
DAEMON (and its host when that differs), SLOT, ATTEMPT, SINCE (UTC; the time of day when it is
the day of the answer) and FOR (how long it had run when the scheduler answered). Attempts not
listed (over a daemon's per-heartbeat bound) are counted under the table and as ``left_out``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from truba.cli.exits import OK
from truba.cli.render import Row, iso_time, print_json, print_table
from truba.cli.session import Session
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

HEADERS = ["TASK", "DAEMON", "SLOT", "ATTEMPT", "SINCE", "FOR"]


def show_running(s: Session, job_id: str, *, as_json: bool) -> int:
    """Prints the tasks of ``job_id`` running now."""
    stub = jobs_pb2_grpc.JobServiceStub(s.channel)
    answer = s.call(stub.ListRunning, jobs_pb2.ListRunningRequest(job_id=job_id))
    if as_json:
        print_json(running_dict(answer))
        return OK
    if not answer.running:
        print(f"job {job_id}: nothing running")
    else:
        print_table(HEADERS, running_rows(answer), right=frozenset({2, 3, 5}))
    if answer.left_out:
        print(f"(and {answer.left_out} more running, not listed)")
    return OK


def running_dict(answer: jobs_pb2.ListRunningResponse) -> Row:
    """The answer as ``--json`` prints it."""
    return {
        "job_id": answer.job_id,
        "at": iso_time(answer.at),
        "left_out": answer.left_out,
        "running": [
            {
                "task_id": task.task_id,
                "daemon_id": task.daemon_id,
                "hostname": task.hostname,
                "slot": task.slot,
                "attempt": task.attempt,
                "started_at": iso_time(task.started_at),
                "for_seconds": round(max(0.0, answer.at - task.started_at), 3),
            }
            for task in answer.running
        ],
    }


def running_rows(answer: jobs_pb2.ListRunningResponse) -> list[list[object]]:
    """The table's rows, one per task."""
    today = datetime.fromtimestamp(answer.at, UTC).date()
    rows: list[list[object]] = []
    for task in answer.running:
        started = datetime.fromtimestamp(task.started_at, UTC)
        since = started.strftime("%H:%M:%S") if started.date() == today else iso_time(task.started_at)
        host = f" ({task.hostname})" if task.hostname and task.hostname != task.daemon_id else ""
        rows.append(
            [
                task.task_id,
                task.daemon_id + host,
                task.slot,
                task.attempt,
                since,
                duration(answer.at - task.started_at),
            ]
        )
    return rows


def duration(seconds: float) -> str:
    """``4.2s``, ``3m05s``, ``2h03m``, ``1d04h``: two units at most (negative skew shows as 0)."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
