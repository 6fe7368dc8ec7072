"""What `truba top` draws from its samples: throughput from successive samples, cluster totals,
the most important job first, and --json frames that parse."""

from __future__ import annotations

import collections
import json

from truba.cli.top_frame import Sample, cluster_totals, frame_dict, frame_lines, throughput
from truba.proto.v1 import daemons_pb2, jobs_pb2


def a_job(job_id: str, done: int, failed: int = 0, importance: float = 1.0) -> jobs_pb2.Job:
    return jobs_pb2.Job(
        id=job_id,
        handler="examples.primes:count",
        importance=importance,
        state=jobs_pb2.JOB_STATE_OPEN,
        fair_share=1.5,
        assigned_slots=2,
        counts=jobs_pb2.JobCounts(submitted=100, done=done, failed=failed, running=2, backlog=7),
    )


def a_daemon(daemon_id: str, slots: int, busy: int) -> daemons_pb2.DaemonInfo:
    return daemons_pb2.DaemonInfo(
        daemon_id=daemon_id, slots=slots, stats=[daemons_pb2.JobStats(job_id="j-1", busy_slots=busy)]
    )


def test_throughput_is_outcomes_a_second_since_the_oldest_sample_that_had_the_job() -> None:
    samples = [
        Sample(10.0, 0.0, [a_job("j-1", done=0)], []),
        Sample(11.0, 0.0, [a_job("j-1", done=4, failed=1), a_job("j-2", done=3)], []),
        Sample(12.0, 0.0, [a_job("j-1", done=18, failed=2), a_job("j-2", done=9)], []),
    ]
    assert throughput(samples) == {"j-1": 10.0, "j-2": 6.0}
    assert throughput(collections.deque(samples, maxlen=5)) == {"j-1": 10.0, "j-2": 6.0}  # as top keeps them
    assert throughput(samples[:1]) == {}  # one look says nothing of a rate
    assert throughput([]) == {}


def test_the_frame_shows_cluster_totals_and_the_most_important_job_first() -> None:
    sample = Sample(
        12.0,
        1764072000.0,
        [a_job("j-1", done=20), a_job("j-2", done=5, importance=4.0)],
        [a_daemon("d0", 4, 3), a_daemon("d1", 2, 0)],
    )
    assert cluster_totals(sample) == {"daemons": 2, "slots": 6, "busy": 3}
    title, totals, blank, header, *rows = frame_lines("h:1", sample, {"j-1": 2.5})
    assert title == "truba top  scheduler h:1  2025-11-25T12:00:00Z"
    assert totals == "daemons 2  slots 6  busy 3  jobs 2  tasks/s 2.5"
    assert header.split() == "ID NAME STATE IMPORTANCE SHARE HELD BACKLOG RUNNING DONE FAILED TASKS/S".split()
    assert [row.split() for row in rows] == [
        ["j-2", "examples.primes:count", "open", "4", "1.5", "2", "7", "2", "5", "0", "-"],
        ["j-1", "examples.primes:count", "open", "1", "1.5", "2", "7", "2", "20", "0", "2.5"],
    ]
    assert frame_lines("h:1", Sample(0.0, 0.0, [], []), {})[-1] == "no jobs"


def test_a_json_frame_is_one_parsable_line_with_the_same_numbers() -> None:
    sample = Sample(12.0, 1764072000.0, [a_job("j-1", done=20, failed=1)], [a_daemon("d0", 4, 3)])
    frame = json.loads(json.dumps(frame_dict("h:1", sample, {"j-1": 2.5})))
    assert frame["cluster"] == {"daemons": 1, "slots": 4, "busy": 3}
    (job,) = frame["jobs"]
    assert (job["id"], job["done"], job["failed"], job["tasks_per_second"]) == ("j-1", 20, 1, 2.5)
    assert (job["fair_share"], job["assigned_slots"], job["backlog"], job["running"]) == (1.5, 2, 7, 2)
