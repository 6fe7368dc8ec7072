"""What the listing verbs print: the NAME column, tables, and --json that parses."""

from __future__ import annotations

import json

import pytest

from truba.cli.jobs import print_job
from truba.cli.render import job_dict, job_name, print_json, print_table
from truba.proto.v1 import common_pb2, jobs_pb2


def a_job(name: str = "") -> jobs_pb2.Job:
    return jobs_pb2.Job(
        id="j-1",
        name=name,
        handler="examples.primes:count",
        importance=2.0,
        state=jobs_pb2.JOB_STATE_FINISHED,
        fair_share=1.5,
        counts=jobs_pb2.JobCounts(submitted=40, done=38, failed=2),
        settings=common_pb2.JobSettings(
            max_attempts=3, preemption=common_pb2.PREEMPTION_GRACEFUL, queue_type=common_pb2.QUEUE_TYPE_QUORUM
        ),
        created_at=1_700_000_000.0,
    )


def test_a_job_is_named_by_its_name_else_its_handler() -> None:
    assert job_name(a_job("nightly")) == "nightly"
    assert job_name(a_job()) == "examples.primes:count"


def test_json_of_a_job_parses_with_numbers_words_and_iso_times(capsys: pytest.CaptureFixture[str]) -> None:
    print_json([job_dict(a_job("nightly"))])
    [job] = json.loads(capsys.readouterr().out)
    assert job["name"] == "nightly" and job["state"] == "finished"
    assert job["counts"]["done"] == 38 and job["counts"]["backlog"] == 0  # numbers, not strings
    assert job["settings"]["preemption"] == "graceful" and job["settings"]["frames"] is True
    assert job["created_at"] == "2023-11-14T22:13:20Z" and job["finished_at"] is None


def test_a_table_aligns_its_columns(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["ID", "N"], [["a", 1], ["bbb", 100]], right=frozenset({1}))
    assert capsys.readouterr().out.splitlines() == ["ID     N", "a      1", "bbb  100"]


def test_one_job_in_full_says_no_limit_for_zero_limits(capsys: pytest.CaptureFixture[str]) -> None:
    print_job(a_job("nightly"))
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["name"] == "nightly" and lines["state"] == "finished"
    assert lines["counts"] == "submitted 40, done 38, failed 2, running 0, backlog 0"
    assert "max_slots none" in lines["settings"] and "task_timeout none" in lines["settings"]
    assert lines["problem"] == "-"
