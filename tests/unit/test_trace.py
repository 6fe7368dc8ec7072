"""The tracing mode (truba.trace): hops recorded per task id, written per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from truba import trace
from truba.pipes.frame_format import pack
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage


def test_the_task_id_is_read_from_the_head_of_a_task_or_a_result() -> None:
    assert trace.task_id_of(TaskCodec().encode(TaskMessage("abc-1", b"x" * 1000))) == "abc-1"
    long_id = "t" * 40  # past a fixstr: str8
    assert trace.task_id_of(TaskCodec().encode(TaskMessage(long_id, None, attempts=2))) == long_id
    assert trace.task_id_of(ResultCodec().encode(ResultMessage("r-7", True, 5))) == "r-7"
    assert trace.task_id_of(b"\x01\x02") is None
    assert trace.task_id_of(b"not msgpack at all") is None


def test_marks_are_written_to_the_process_file_with_each_member_of_a_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "enabled", False)
    monkeypatch.setattr(trace, "_records", [])
    monkeypatch.setattr(trace, "_folder", None)
    monkeypatch.setenv(trace.ENV, "")
    trace.start(tmp_path)
    try:
        trace.mark("client.submit", "a")
        frame = pack([TaskCodec().encode(TaskMessage(task_id, None)) for task_id in ("b", "c")])
        trace.mark_body("tasks.publish", frame)
        trace.mark_body("tasks.publish", TaskCodec().encode(TaskMessage("a", None)))
        trace.flush()
    finally:
        trace.enabled = False
    [written] = list(tmp_path.glob("*.trace"))
    lines = [line.split() for line in written.read_text().splitlines()]
    assert [(hop, task_id) for hop, task_id, _ in lines] == [
        ("client.submit", "a"),
        ("tasks.publish", "b"),
        ("tasks.publish", "c"),
        ("tasks.publish", "a"),
    ]
    times = [int(ns) for _, _, ns in lines]
    assert times == sorted(times)
