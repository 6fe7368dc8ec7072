"""Timelines drawn from spans: the HTML page carries every span with its outcome, self-contained;
the PNG is a real picture; several jobs are told apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

from truba.proto.v1 import daemons_pb2, jobs_pb2
from truba.timeplot import Span, spans_of, write_html, write_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def some_spans(count: int = 3000, job_id: str = "j1") -> list[Span]:
    outcomes = ["ok"] * 6 + ["error", "retried", "timeout", "crashed", "preempted", "gave_up"]
    spans = []
    for i in range(count):
        start = 1_700_000_000.0 + i * 0.05
        outcome = outcomes[i % len(outcomes)]
        spans.append(Span(job_id, f"d{i % 3}", i % 4, f"t{i}", start, start + 0.04, outcome, 1, ""))
    spans.append(Span(job_id, "d0", 1, "", spans[-1].end, spans[-1].end, "slot_taken", 0, ""))
    return spans


def embedded(page: str) -> list[dict[str, object]]:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S)
    assert found is not None
    data: list[dict[str, object]] = json.loads(found.group(1))
    return data


def test_the_html_page_holds_every_span_with_its_outcome_and_fetches_nothing(tmp_path: Path) -> None:
    spans = some_spans()
    spans.append(Span("j1", "d0", 0, "</script><b>", 1.0, 2.0, "error", 1, "ValueError"))
    path = tmp_path / "t.html"
    write_html(path, spans, "job j1", "3002 attempts")
    page = path.read_text()
    data = embedded(page)
    assert len(data) == len(spans)
    assert {d["outcome"] for d in data} >= {"preempted", "error", "retried", "gave_up", "slot_taken"}
    assert {"task_id": "</script><b>", "error": "ValueError"}.items() <= data[-1].items()
    assert "function drawTimeline" in page  # the renderer is inline
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page fetches something from elsewhere"


def test_the_png_is_a_picture_of_thousands_of_spans(tmp_path: Path) -> None:
    path = tmp_path / "t.png"
    write_png(path, some_spans(), "job j1")
    body = path.read_bytes()
    assert body.startswith(PNG_MAGIC) and len(body) > 20_000


def test_several_jobs_are_drawn_together_by_job(tmp_path: Path) -> None:
    path = tmp_path / "t.png"
    write_png(path, some_spans(50, "j1") + some_spans(50, "j2"), "jobs j1, j2")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_spans_come_from_the_scheduler_timeline_with_outcome_words() -> None:
    span = daemons_pb2.Span(
        task_id="t1", slot=2, start=1.0, end=2.0, outcome=daemons_pb2.SPAN_OUTCOME_PREEMPTED, attempt=1
    )
    timeline = jobs_pb2.Timeline(job_id="j1", spans=[jobs_pb2.TimelineSpan(daemon_id="d0", span=span)])
    assert spans_of(timeline) == [Span("j1", "d0", 2, "t1", 1.0, 2.0, "preempted", 1, "")]
