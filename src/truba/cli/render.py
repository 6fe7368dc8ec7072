"""How commands print: scheduler messages as plain dicts (the ``--json`` form) and as tables.

The JSON form is the same data as the tables, with stable snake_case keys, numbers as numbers,
enums as lowercase words and times as ISO 8601 UTC strings (null when not reached).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from truba.pipes.broker import redact
from truba.proto.v1 import common_pb2, daemons_pb2, jobs_pb2

Row = dict[str, object]


def iso_time(seconds: float) -> str | None:
    """Unix ``seconds`` as ISO 8601 UTC; None for 0 (not reached)."""
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _enum(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def job_state(job: jobs_pb2.Job) -> str:
    return _enum(jobs_pb2.JobState.Name(job.state), "JOB_STATE_")


def job_name(job: jobs_pb2.Job) -> str:
    """The job's name if it has one, else its handler."""
    return job.name or job.handler


def job_dict(job: jobs_pb2.Job) -> Row:
    c, s = job.counts, job.settings
    return {
        "id": job.id,
        "name": job.name,
        "handler": job.handler,
        "state": job_state(job),
        "importance": job.importance,
        "fair_share": round(job.fair_share, 3),
        "assigned_slots": job.assigned_slots,
        "counts": {
            "submitted": c.submitted,
            "done": c.done,
            "failed": c.failed,
            "running": c.running,
            "backlog": c.backlog,
            "service_time": c.service_time,
        },
        "settings": {
            "min_slots": s.min_slots,
            "max_slots": s.max_slots,
            "preemption": _enum(common_pb2.Preemption.Name(s.preemption), "PREEMPTION_"),
            "preemption_grace": s.preemption_grace,
            "task_timeout": s.task_timeout,
            "max_attempts": s.max_attempts,
            "queue_type": _enum(common_pb2.QueueType.Name(s.queue_type), "QUEUE_TYPE_"),
            "priorities": s.priorities,
            "frames": not s.no_frames,
        },
        "queues": {"tasks": job.queues.tasks, "results": job.queues.results, "dead": job.queues.dead},
        "created_at": iso_time(job.created_at),
        "closed_at": iso_time(job.closed_at),
        "finished_at": iso_time(job.finished_at),
        "problem": job.problem,
    }


def daemon_dict(daemon: daemons_pb2.DaemonInfo) -> Row:
    return {
        "id": daemon.daemon_id,
        "hostname": daemon.hostname,
        "pid": daemon.pid,
        "version": daemon.version,
        "slots": daemon.slots,
        "busy": sum(s.busy_slots for s in daemon.stats),
        "state": "draining" if daemon.draining else "up",
        "allow": list(daemon.allow),
        "jobs": [{"id": j.job_id, "handler": j.handler, "slots": j.slots} for j in daemon.assigned],
        "last_seen": iso_time(daemon.last_seen),
    }


def cluster_dict(address: str, status: str, info: jobs_pb2.ClusterInfo) -> Row:
    return {
        "scheduler": address,
        "status": status.lower(),
        "daemons": info.daemons,
        "slots": info.slots,
        "brokers": [{"name": b.name, "url": redact(b.url)} for b in info.brokers],
    }


def print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: frozenset[int]) -> None:
    """Columns as wide as their widest cell; the columns numbered in ``right`` are right-aligned."""
    for line in table_lines(headers, rows, right):
        print(line)


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[object]], right: frozenset[int]) -> list[str]:
    """The lines :func:`print_table` prints."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in cells
    ]
