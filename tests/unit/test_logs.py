"""Structured logs: one JSON object per line, with the ids bound in the context."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import logging
import sys
import time
from collections.abc import Iterator

import pytest

from truba.logs import JsonFormatter, TextFormatter, bind, iso_time, setup


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    setup("debug", "json", stream)
    yield stream
    root.handlers[:], root.level = saved


def records(stream: io.StringIO) -> list[dict[str, object]]:
    """This test's records (asyncio logs at debug too)."""
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [entry for entry in entries if entry["logger"] == "truba.test"]


def test_bound_ids_reach_every_record_in_their_scope_and_extra_wins(lines: io.StringIO) -> None:
    log = logging.getLogger("truba.test")
    with bind(job_id="j1"):
        with bind(task_id="t1"):
            log.info("inner", extra={"job_id": "given"})
        log.warning("outer")
    log.info("outside")
    inner, outer, outside = records(lines)
    assert inner["event"] == "inner" and inner["job_id"] == "given" and inner["task_id"] == "t1"
    assert outer["job_id"] == "j1" and "task_id" not in outer and outer["level"] == "warning"
    assert "job_id" not in outside and outside["logger"] == "truba.test"


async def test_each_task_sees_only_what_it_bound(lines: io.StringIO) -> None:
    log = logging.getLogger("truba.test")

    async def work(task_id: str) -> None:
        with bind(task_id=task_id):
            await asyncio.sleep(0.01)
            log.info("done")

    await asyncio.gather(work("a"), work("b"))
    assert sorted(str(r["task_id"]) for r in records(lines)) == ["a", "b"]


def test_a_record_with_an_error_carries_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("truba.test", logging.ERROR, __file__, 1, "failed", None, None)
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert entry["event"] == "failed" and "ValueError: boom" in str(entry["traceback"])


def test_times_are_iso_8601_in_utc_with_microseconds(lines: io.StringIO) -> None:
    logging.getLogger("truba.test").info("now")
    (entry,) = records(lines)
    stamp = str(entry["time"])
    parsed = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert stamp.endswith("Z") and parsed.tzinfo == datetime.UTC
    assert abs(parsed.timestamp() - time.time()) < 60
    assert iso_time(1764072000.9999996) == "2025-11-25T12:00:01.000000Z"


def test_text_lines_read_as_utc_time_level_event_then_ids_first_and_quoted_values() -> None:
    # --log-format text used to print local time and fields in any order, values unquoted
    record = logging.LogRecord("truba.test", logging.WARNING, __file__, 1, "daemon.slot.crashed", None, None)
    record.created = 1764072000.25
    record.error = "Killed by signal 9"
    record.attempt = 2
    record.task_id = "t-7"
    record.job_id = "j-1"
    line = TextFormatter().format(record)
    assert line == (
        "2025-11-25 12:00:00.250Z WARNING daemon.slot.crashed  job_id=j-1 task_id=t-7"
        ' error="Killed by signal 9" attempt=2'
    )


def test_a_text_traceback_is_indented_under_its_record() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("truba.test", logging.ERROR, __file__, 1, "failed", None, None)
        record.exc_info = sys.exc_info()
    first, *rest = TextFormatter().format(record).splitlines()
    assert first.endswith(" ERROR   failed")
    assert rest and all(row.startswith("    ") for row in rest)
    assert rest[-1].strip() == "ValueError: boom"


def test_a_text_message_of_several_lines_continues_indented() -> None:
    # grpc logs "Client request_iterator raised exception:\n<traceback>" as its message
    trace = ("Traceback\n  line",)
    record = logging.LogRecord("grpc", logging.DEBUG, __file__, 1, "raised:\n%s", trace, None)
    first, *rest = TextFormatter().format(record).splitlines()
    assert first.endswith(" DEBUG   raised:")
    assert rest == ["    Traceback", "      line"]
