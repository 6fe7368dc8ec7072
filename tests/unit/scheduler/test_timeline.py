"""The scheduler's task history per job: bounded, forgotten a while after the job, served."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import aiohttp
import grpc
import grpc.aio
import pytest

from truba.proto.v1 import daemons_pb2, jobs_pb2, jobs_pb2_grpc
from truba.scheduler import Scheduler, SchedulerConfig
from truba.scheduler.timeline import FAILURES, TaskTimeline


def span(
    job_id: str,
    task_id: str,
    end: float,
    outcome: daemons_pb2.SpanOutcome.ValueType = daemons_pb2.SPAN_OUTCOME_OK,
) -> daemons_pb2.Span:
    return daemons_pb2.Span(
        job_id=job_id,
        task_id=task_id,
        slot=1,
        start=end - 1,
        end=end,
        outcome=outcome,
        attempt=1,
    )


def test_a_job_keeps_its_newest_spans_and_counts_what_it_lost() -> None:
    timeline = TaskTimeline(per_job=3)
    timeline.report("d1", [span("j1", f"t{i}", 10.0 + i) for i in range(5)], dropped=2)
    spans, dropped = timeline.of("j1")
    assert [e.task_id for e in spans] == ["t2", "t3", "t4"]
    assert dropped == 2 + 2  # two over the bound here, two the daemon left out
    assert spans[0].daemon_id == "d1" and spans[0].start == 11.0


def test_an_answer_holds_the_newest_spans_within_its_limit_and_byte_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeline = TaskTimeline()
    timeline.report("d1", [span("j1", f"t{i:04}", 10.0 + i) for i in range(1000)])
    answer = timeline.timeline_pb("j1", limit=10)
    assert [s.span.task_id for s in answer.spans] == [f"t{i:04}" for i in range(990, 1000)]
    assert answer.left_out == 990
    monkeypatch.setattr("truba.scheduler.timeline.ANSWER_BYTES", 100 * 1024)
    answer = timeline.timeline_pb("j1")
    assert 0 < answer.ByteSize() <= 100 * 1024 and answer.left_out == 1000 - len(answer.spans)
    assert answer.spans[-1].span.task_id == "t0999"
    assert timeline.timeline_json("j1", limit=1)["left_out"] == 999


def test_spans_come_oldest_end_first_and_since_filters_by_end() -> None:
    timeline = TaskTimeline()
    timeline.report("d2", [span("j1", "late", 30.0)])
    timeline.report("d1", [span("j1", "early", 20.0), span("j2", "other", 25.0)])
    assert [e.task_id for e in timeline.of("j1")[0]] == ["early", "late"]
    assert [e.task_id for e in timeline.of("j1", since=20.0)[0]] == ["late"]
    assert timeline.of("unknown") == ([], 0)


def test_old_jobs_are_forgotten_and_at_most_so_many_are_kept() -> None:
    now = [1000.0]
    timeline = TaskTimeline(jobs=2, keep=60.0, clock=lambda: now[0])
    timeline.report("d1", [span("j1", "a", 1.0)])
    timeline.report("d1", [span("j2", "b", 1.0)])
    timeline.report("d1", [span("j1", "c", 2.0)])  # j1 is now the most recent
    timeline.report("d1", [span("j3", "d", 3.0)])  # over two jobs: the least recent (j2) goes
    assert timeline.of("j2") == ([], 0) and len(timeline.of("j1")[0]) == 2
    now[0] += 61.0
    timeline.report("d1", [span("j4", "e", 4.0)])  # j1 and j3 sent nothing for over a minute
    assert timeline.of("j1") == ([], 0) and timeline.of("j3") == ([], 0)
    assert timeline.timeline_json("j4")["spans"] == [
        {
            "daemon_id": "d1",
            "task_id": "e",
            "slot": 1,
            "start": 3.0,
            "end": 4.0,
            "outcome": "ok",
            "attempt": 1,
            "error": "",
        }
    ]


async def test_the_timeline_of_an_unknown_job_is_refused_over_grpc_and_http(tmp_path: Path) -> None:
    config = SchedulerConfig(
        brokers=["amqp://guest:guest@127.0.0.1:1/"],
        state_dir=tmp_path,
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
    )
    async with Scheduler(config) as scheduler:
        async with grpc.aio.insecure_channel(scheduler.address) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetTimeline(jobs_pb2.GetTimelineRequest(job_id="nope"))
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        url = f"http://{scheduler.http_address}/api/v1/jobs/nope/timeline"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 404


def errors(timeline: TaskTimeline, job_id: str, limit: int = FAILURES) -> list[dict[str, object]]:
    return cast(list[dict[str, object]], timeline.errors_json(job_id, limit)["errors"])


def test_failed_attempts_are_kept_apart_with_their_messages_newest_first() -> None:
    timeline = TaskTimeline(per_job=10)
    failed = span("j1", "bad", 5.0, daemons_pb2.SPAN_OUTCOME_ERROR)
    failed.error, failed.error_message = "ValueError", "no such thing"
    gave_up = span("j1", "dead", 6.0, daemons_pb2.SPAN_OUTCOME_GAVE_UP)
    timeline.report("d1", [failed, gave_up, span("j1", "ok", 7.0)])
    # many good attempts push the failures out of the timeline, not out of the errors
    timeline.report("d2", [span("j1", f"t{i}", 10.0 + i) for i in range(20)])
    assert "bad" not in {e.task_id for e in timeline.of("j1")[0]}
    kept = errors(timeline, "j1")
    assert [(e["task_id"], e["outcome"], e["error"], e["message"]) for e in kept] == [
        ("dead", "gave_up", "", ""),
        ("bad", "error", "ValueError", "no such thing"),
    ]
    assert (kept[1]["daemon_id"], kept[1]["attempt"], kept[1]["end"]) == ("d1", 1, 5.0)
    assert len(errors(timeline, "j1", limit=1)) == 1
    assert timeline.errors_json("nobody") == {"job_id": "nobody", "errors": []}


def test_the_failures_kept_per_job_are_bounded() -> None:
    timeline = TaskTimeline()
    timeout = daemons_pb2.SPAN_OUTCOME_TIMEOUT
    timeline.report("d1", [span("j1", f"t{i}", float(i), timeout) for i in range(FAILURES + 50)])
    kept = errors(timeline, "j1", limit=10_000)
    assert len(kept) == FAILURES and kept[0]["task_id"] == f"t{FAILURES + 49}"
