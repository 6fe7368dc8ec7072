"""Each task attempt on a slot becomes a span for the timeline, bounded per heartbeat."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tests.waiting import eventually
from truba.daemon.job_pipes import JobPipes
from truba.daemon.runner import JobRunner
from truba.daemon.settings import JobSettings
from truba.daemon.slot_process import SlotProcess
from truba.daemon.spans import MESSAGE_CHARS, SpanLog
from truba.pipes.testing import FakeListener, FakeSender
from truba.proto.v1 import daemons_pb2
from truba.wire import GaveUpRecord, ResultMessage, TaskMessage

OUTCOME = daemons_pb2.SpanOutcome


def test_a_heartbeat_takes_the_newest_spans_and_counts_the_ones_left_out() -> None:
    log = SpanLog(limit=3)
    job = log.for_job("j1", clock=lambda: 50.0)
    for i in range(5):
        job.attempt(f"t{i}", 0, float(i), i + 0.5, daemons_pb2.SPAN_OUTCOME_OK, 1)
    job.slot_taken(2)
    spans, dropped = log.take()
    assert [s.task_id for s in spans] == ["t3", "t4", ""] and dropped == 3
    assert spans[0].job_id == "j1" and spans[0].start == 3.0 and spans[0].end == 3.5
    assert spans[2].outcome == daemons_pb2.SPAN_OUTCOME_SLOT_TAKEN and spans[2].slot == 2
    assert spans[2].start == spans[2].end == 50.0
    # taken: the next heartbeat starts empty
    assert log.take() == ([], 0)


Made = Callable[..., tuple[JobRunner, FakeListener[TaskMessage], SpanLog]]


@pytest.fixture
async def runner() -> AsyncIterator[Made]:
    made: list[tuple[JobRunner, list[SlotProcess]]] = []

    def make(handler: str, settings: JobSettings) -> tuple[JobRunner, FakeListener[TaskMessage], SpanLog]:
        tasks: FakeListener[TaskMessage] = FakeListener()
        results: FakeSender[ResultMessage] = FakeSender(auto_confirm=True)
        requeue: FakeSender[TaskMessage] = FakeSender(auto_confirm=True)
        dead: FakeSender[GaveUpRecord] = FakeSender(auto_confirm=True)
        log = SpanLog()
        job_runner = JobRunner(
            "j1",
            handler,
            "d1",
            JobPipes(tasks, results, requeue, dead),
            lambda slot: None,
            target=1,
            settings=settings,
            spans=log.for_job("j1"),
        )
        slot = SlotProcess(3)
        job_runner.add_worker(slot)
        made.append((job_runner, [slot]))
        return job_runner, tasks, log

    yield make
    for job_runner, slots in made:
        job_runner.stop_now()
        await job_runner.close()
        for slot in slots:
            await slot.stop()


async def test_each_attempt_is_a_span_with_its_slot_times_and_how_it_ended(runner: Made) -> None:
    job_runner, tasks, log = runner("tests.handlers.basic:square", JobSettings())
    tasks.push(TaskMessage("good", 3))
    tasks.push(TaskMessage("bad", -1))
    await eventually(lambda: len(tasks.acked) == 2)
    spans, dropped = log.take()
    assert dropped == 0
    assert [(s.task_id, OUTCOME.Name(s.outcome)) for s in spans] == [
        ("good", "SPAN_OUTCOME_OK"),
        ("bad", "SPAN_OUTCOME_ERROR"),
    ]
    good, bad = spans
    assert all(s.job_id == "j1" and s.slot == 3 and s.attempt == 1 for s in spans)
    assert 0 < good.start <= good.end <= bad.start <= bad.end
    assert bad.error == "ValueError" and good.error == ""
    assert bad.error_message == "negative one is not welcome here" and good.error_message == ""


def test_a_failed_attempts_message_is_cut_to_its_bound() -> None:
    log = SpanLog()
    log.for_job("j1").attempt("t1", 0, 1.0, 2.0, daemons_pb2.SPAN_OUTCOME_ERROR, 1, "E", "x" * 10_000)
    (span,), _ = log.take()
    assert (span.error, span.error_message) == ("E", "x" * MESSAGE_CHARS)


async def test_a_crash_then_a_give_up_are_spans_of_their_own(runner: Made) -> None:
    job_runner, tasks, log = runner("tests.handlers.basic:crash", JobSettings(max_attempts=2))
    tasks.push(TaskMessage("t1", None))
    await eventually(lambda: len(tasks.acked) == 1)
    tasks.push(TaskMessage("t1", None, attempts=1))
    await eventually(lambda: len(tasks.acked) == 2)
    spans, _ = log.take()
    assert [(s.attempt, OUTCOME.Name(s.outcome), s.error) for s in spans] == [
        (1, "SPAN_OUTCOME_CRASHED", "SlotDied"),
        (2, "SPAN_OUTCOME_GAVE_UP", "SlotDied"),
    ]
    assert all(s.error_message for s in spans)  # what the slot's death said


async def test_an_immediate_preemption_is_a_preempted_span_and_the_slot_leaving_is_marked(
    runner: Made,
) -> None:
    job_runner, tasks, log = runner("tests.handlers.basic:sleep", JobSettings(immediate=True))
    tasks.push(TaskMessage("long", 30))
    await eventually(lambda: job_runner.stats.busy == 1)
    job_runner.resize(0)
    await eventually(lambda: not job_runner.crew.workers)
    spans, _ = log.take()
    assert [(s.task_id, OUTCOME.Name(s.outcome), s.slot) for s in spans] == [
        ("long", "SPAN_OUTCOME_PREEMPTED", 3),
        ("", "SPAN_OUTCOME_SLOT_TAKEN", 3),
    ]
    assert spans[0].start < spans[0].end <= spans[1].start
