"""``truba job ID --running``: a table a person reads (TASK, DAEMON, SLOT, ATTEMPT, SINCE, FOR)
and --json that parses, from the scheduler's ListRunning answer."""

from __future__ import annotations

import json

import pytest

from truba.cli.render import print_json
from truba.cli.running import HEADERS, duration, running_dict, running_rows
from truba.proto.v1 import jobs_pb2

AT = 1_764_144_000.0 + 3600  # 2025-11-26T09:00:00Z


def an_answer() -> jobs_pb2.ListRunningResponse:
    return jobs_pb2.ListRunningResponse(
        job_id="j1",
        at=AT,
        left_out=2,
        running=[
            jobs_pb2.RunningTask(
                daemon_id="d0",
                hostname="node-a",
                slot=3,
                task_id="t1",
                attempt=2,
                started_at=AT - 86_400 - 7200,
            ),
            jobs_pb2.RunningTask(
                daemon_id="d1", hostname="d1", slot=0, task_id="t2", attempt=1, started_at=AT - 4.25
            ),
        ],
    )


def test_the_table_says_where_each_task_runs_since_when_and_for_how_long() -> None:
    assert HEADERS == ["TASK", "DAEMON", "SLOT", "ATTEMPT", "SINCE", "FOR"]
    assert running_rows(an_answer()) == [
        ["t1", "d0 (node-a)", 3, 2, "2025-11-25T07:00:00Z", "1d02h"],
        ["t2", "d1", 0, 1, "08:59:55", "4.2s"],
    ]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-3.0, "0.0s"),
        (59.94, "59.9s"),
        (65, "1m05s"),
        (3600 * 2 + 180, "2h03m"),
        (86_400 * 3 + 3600, "3d01h"),
    ],
)
def test_durations_show_two_units_at_most(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_json_parses_with_iso_times_and_seconds_as_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    print_json(running_dict(an_answer()))
    answer = json.loads(capsys.readouterr().out)
    assert answer["job_id"] == "j1" and answer["left_out"] == 2 and answer["at"] == "2025-11-26T09:00:00Z"
    assert answer["running"][1] == {
        "task_id": "t2",
        "daemon_id": "d1",
        "hostname": "d1",
        "slot": 0,
        "attempt": 1,
        "started_at": "2025-11-26T08:59:55Z",
        "for_seconds": 4.25,
    }
