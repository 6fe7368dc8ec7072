from __future__ import annotations

import re

from truba.pipes.rabbit import queue_arguments
from truba.scheduler.allow import allowed
from truba.scheduler.model import JobIds, job_queues


def test_job_ids_are_short_lowercase_alphanumerics() -> None:
    ids = JobIds()
    for _ in range(100):
        job_id = ids.new()
        assert re.fullmatch(r"[a-z0-9]{12}", job_id), job_id


def test_job_ids_sort_by_creation_even_within_one_millisecond() -> None:
    # Given a frozen clock and a random part that goes down: order still follows creation
    randoms = iter(range(1000, 0, -1))
    ids = JobIds(clock=lambda: 1_750_000_000.0, randbelow=lambda _: next(randoms))
    made = [ids.new() for _ in range(50)]
    assert made == sorted(made)
    assert len(set(made)) == 50


def test_job_ids_sort_by_clock_across_instances() -> None:
    early = JobIds(clock=lambda: 1_750_000_000.0).new()
    late = JobIds(clock=lambda: 1_750_000_000.5).new()
    assert early < late


def test_queue_names_derive_from_the_job_id() -> None:
    queues = job_queues("abc123")
    assert (queues.tasks, queues.results, queues.dead) == (
        "truba.job.abc123.tasks",
        "truba.job.abc123.results",
        "truba.job.abc123.dead",
    )
    assert queues.all()[0] == queues.dead
    assert queues.result_log == "truba.job.abc123.done" and queues.result_log in queues.all()


def test_the_record_is_a_stream_with_bounded_retention_and_the_others_dead_letter() -> None:
    specs = {spec.name: queue_arguments(spec) for spec in job_queues("abc123").specs()}
    record = specs["truba.job.abc123.done"]
    assert record["x-queue-type"] == "stream"
    assert record["x-max-age"] == "3600s" and record["x-max-length-bytes"] == 256 * 1024 * 1024
    assert "x-dead-letter-routing-key" not in record and "x-delivery-limit" not in record
    assert specs["truba.job.abc123.tasks"]["x-dead-letter-routing-key"] == "truba.job.abc123.dead"


def test_allow_patterns_match_the_whole_handler_string() -> None:
    assert allowed("examples.math:square", ["examples.*"])
    assert allowed("examples.math:square", ["nope.*", "examples.math:square"])
    assert not allowed("examples.math:square", ["examples"])
    assert not allowed("evil.examples.math:square", ["examples.*"])
    assert not allowed("Examples.math:square", ["examples.*"])  # case-sensitive on every OS
    assert not allowed("examples.math:square", [])
