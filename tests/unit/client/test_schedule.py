"""What the client checks and sends for a schedule, and how it reads a run."""

from __future__ import annotations

from typing import Any

import pytest

from truba import codec
from truba.client import InvalidArgument, ScheduleRun
from truba.client.schedule import create_request
from truba.proto.v1 import schedules_pb2


def request(**changes: Any) -> schedules_pb2.CreateScheduleRequest:
    kwargs: dict[str, Any] = {
        "every": 1.0,
        "cron": None,
        "payload": None,
        "deadline": None,
        "importance": 1.0,
        "name": "",
    }
    kwargs.update(changes)
    return create_request("examples.math:square", **kwargs)


def test_the_request_carries_the_payload_encoded_once_and_zero_for_defaults() -> None:
    sent = request(payload={"region": "eu", "n": [1, 2]}, deadline=0.8, name="health")
    assert (sent.handler, sent.every, sent.cron, sent.deadline, sent.name) == (
        "examples.math:square",
        1.0,
        "",
        0.8,
        "health",
    )
    assert codec.unpackb(sent.payload) == {"region": "eu", "n": [1, 2]}
    by_cron = request(every=None, cron="*/5 * * * *")
    assert (by_cron.every, by_cron.cron, by_cron.deadline) == (0.0, "*/5 * * * *", 0.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"every": None}, "every"),
        ({"cron": "* * * * *"}, "every"),
        ({"every": 0}, "every"),
        ({"every": float("inf")}, "every"),
        ({"deadline": -1.0}, "deadline"),
        ({"importance": 0.0}, "importance"),
        ({"payload": object()}, "payload"),
    ],
)
def test_bad_arguments_are_refused_naming_them_before_anything_is_sent(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"^INVALID_ARGUMENT: {field}: "):
        request(**changes)


def test_a_lambda_is_refused_as_a_handler() -> None:
    with pytest.raises(InvalidArgument, match="lambda"):
        create_request(
            lambda x: x, every=1.0, cron=None, payload=None, deadline=None, importance=1.0, name=""
        )


def test_a_run_reads_its_outcome_as_a_word() -> None:
    run = ScheduleRun.from_pb(
        schedules_pb2.ScheduleRun(
            task_id="run-3",
            due=10.0,
            started=10.01,
            ended=10.5,
            outcome=schedules_pb2.RUN_OUTCOME_TIMEOUT,
            error="TaskTimeout: ran longer than 0.4 s",
            duration=0.4,
            daemon_id="d1",
        )
    )
    assert (run.task_id, run.outcome, run.duration, run.daemon_id) == ("run-3", "timeout", 0.4, "d1")
    assert (
        ScheduleRun.from_pb(schedules_pb2.ScheduleRun(outcome=schedules_pb2.RUN_OUTCOME_LOST)).outcome
        == "lost"
    )
