"""What ``truba top`` shows: samples of the scheduler's jobs and daemons, and one frame of them.

A :class:`Sample` is one ``ListJobs`` and one ``ListDaemons`` answer with the time they were
taken. Throughput is not something the scheduler reports: it is the change in a job's outcomes
(done + failed) between the oldest and the newest of the last few samples, over the time between
them (:func:`throughput`), so a one-second interval still gives a steady number. A frame is a
few lines of text (:func:`frame_lines`) or, for ``--json``, a dict (:func:`frame_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from truba.cli.render import Row, iso_time, job_name, job_state, table_lines
from truba.proto.v1 import daemons_pb2, jobs_pb2

HEADERS: Final = "ID NAME STATE IMPORTANCE SHARE HELD BACKLOG RUNNING DONE FAILED TASKS/S".split()
"""SHARE is the fair share in slots, HELD the slots the job holds now."""


@dataclass(frozen=True)
class Sample:
    """The scheduler's jobs and daemons at one moment (``at``: monotonic; ``wall``: Unix time)."""

    at: float
    wall: float
    jobs: Sequence[jobs_pb2.Job]
    daemons: Sequence[daemons_pb2.DaemonInfo]


def outcomes(job: jobs_pb2.Job) -> int:
    """Tasks of ``job`` with an outcome (each counted once)."""
    return int(job.counts.done + job.counts.failed)


def throughput(samples: Iterable[Sample]) -> dict[str, float]:
    """Outcomes a second of each job in the newest sample, since the oldest sample that had it
    (a job seen once, or samples taken at one instant, have none)."""
    history = list(samples)  # a deque of the last few, in top
    if not history:
        return {}
    *older, newest = history
    rates: dict[str, float] = {}
    for job in newest.jobs:
        for old in older:
            before = next((j for j in old.jobs if j.id == job.id), None)
            if before is not None and newest.at > old.at:
                rates[job.id] = max(0, outcomes(job) - outcomes(before)) / (newest.at - old.at)
                break
    return rates


def cluster_totals(sample: Sample) -> dict[str, int]:
    """Daemons, their slots and the slots busy (per their last heartbeats)."""
    return {
        "daemons": len(sample.daemons),
        "slots": sum(d.slots for d in sample.daemons),
        "busy": sum(s.busy_slots for d in sample.daemons for s in d.stats),
    }


def _ordered(jobs: Sequence[jobs_pb2.Job]) -> list[jobs_pb2.Job]:
    """The most important first, then the oldest."""
    return sorted(jobs, key=lambda job: (-job.importance, job.created_at, job.id))


def frame_dict(address: str, sample: Sample, rates: Mapping[str, float]) -> Row:
    """One frame as ``--json`` prints it (one line each)."""
    return {
        "time": iso_time(sample.wall),
        "scheduler": address,
        "cluster": cluster_totals(sample),
        "jobs": [
            {
                "id": job.id,
                "name": job_name(job),
                "state": job_state(job),
                "importance": job.importance,
                "fair_share": round(job.fair_share, 3),
                "assigned_slots": job.assigned_slots,
                "backlog": job.counts.backlog,
                "running": job.counts.running,
                "done": job.counts.done,
                "failed": job.counts.failed,
                "tasks_per_second": None if job.id not in rates else round(rates[job.id], 3),
            }
            for job in _ordered(sample.jobs)
        ],
    }


def frame_lines(address: str, sample: Sample, rates: Mapping[str, float]) -> list[str]:
    """One frame as text: a title, the cluster's totals, then a row per job."""
    totals = cluster_totals(sample)
    rows = [
        [
            job.id,
            job_name(job),
            job_state(job),
            f"{job.importance:g}",
            f"{job.fair_share:.1f}",
            job.assigned_slots,
            job.counts.backlog,
            job.counts.running,
            job.counts.done,
            job.counts.failed,
            f"{rates[job.id]:.1f}" if job.id in rates else "-",
        ]
        for job in _ordered(sample.jobs)
    ]
    total_rate = sum(rates.values())
    return [
        f"truba top  scheduler {address}  {iso_time(sample.wall)}",
        f"daemons {totals['daemons']}  slots {totals['slots']}  busy {totals['busy']}  "
        f"jobs {len(sample.jobs)}  tasks/s {total_rate:.1f}",
        "",
        *(table_lines(HEADERS, rows, right=frozenset(range(3, len(HEADERS)))) if rows else ["no jobs"]),
    ]
