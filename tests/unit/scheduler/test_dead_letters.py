"""Listing a job's dead letters: every kind with its error, from every broker, none consumed."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.scheduler.fakes import FakeCluster, ManualClock
from truba.pipes.broker import QueuedMessage
from truba.pipes.frame import pack
from truba.pipes.serialize import poison_record
from truba.proto.v1 import jobs_pb2
from truba.scheduler.dead_letters import DeadLetterReader
from truba.scheduler.errors import FailedPrecondition, InvalidArgument
from truba.scheduler.model import Job, JobState
from truba.scheduler.store import SqliteJobStore
from truba.wire import ErrorInfo, GaveUpCodec, GaveUpRecord, TaskCodec, TaskMessage

GAVE_UP = jobs_pb2.DEAD_LETTER_REASON_GAVE_UP
POISON = jobs_pb2.DEAD_LETTER_REASON_POISON
REFUSED = jobs_pb2.DEAD_LETTER_REASON_REFUSED


def _task(task_id: str, attempts: int = 0) -> bytes:
    return TaskCodec().encode(TaskMessage(task_id, {"n": 1}, attempts))


def _gave_up(task_id: str) -> QueuedMessage:
    error = ErrorInfo("TaskTimeout", "attempt 3 ran past 1 s", "Traceback: ...")
    return QueuedMessage(GaveUpCodec().encode(GaveUpRecord(task_id, 3, error, "d1", _task(task_id, 2))), {})


@pytest.fixture
async def job(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> Job:
    job = Job("abc123", "examples.math:square", 1.0, JobState.OPEN, clock())
    store.insert(job)
    await cluster.brokers.declare(job.queues)
    return job


def _reader(cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock) -> DeadLetterReader:
    return DeadLetterReader(cluster.brokers, store, clock=clock)


async def test_every_kind_of_dead_letter_is_listed_with_its_error_and_broker(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock, job: Job
) -> None:
    b0, b1 = cluster.fakes
    b0.messages[job.queues.dead] = [
        _gave_up("t-1"),
        QueuedMessage(poison_record(b"\x93junk", "task: not msgpack"), {}),
    ]
    death: dict[str, object] = {"x-death": [{"reason": "rejected", "queue": job.queues.results, "count": 1}]}
    b1.messages[job.queues.dead] = [QueuedMessage(pack([_task("t-2"), _task("t-3", 1)]), death)]

    answer = await _reader(cluster, store, clock).read(job, bodies=True)

    got = [(d.task_id, d.reason, d.broker, d.attempts) for d in answer.dead_letters]
    assert got == [
        ("t-1", GAVE_UP, "b0", 3),
        ("", POISON, "b0", 0),
        ("t-2", REFUSED, "b1", 0),
        ("t-3", REFUSED, "b1", 1),
    ]
    gave_up, poison, refused = answer.dead_letters[:3]
    assert (gave_up.error_type, gave_up.error_message, gave_up.traceback, gave_up.daemon_id) == (
        "TaskTimeout",
        "attempt 3 ran past 1 s",
        "Traceback: ...",
        "d1",
    )
    assert TaskCodec().decode(gave_up.body).task_id == "t-1"
    assert (poison.error_type, poison.error_message, poison.body) == (
        "CodecError",
        "task: not msgpack",
        b"\x93junk",
    )
    assert (
        refused.error_message
        == f"the broker dead-lettered it from {job.queues.results}: rejected without requeue by a consumer"
    )
    assert (list(answer.unreachable), answer.truncated, answer.kept_until) == ([], False, 0.0)
    # Nothing was consumed: the same again
    assert await _reader(cluster, store, clock).read(job, bodies=True) == answer


async def test_the_list_is_bounded_per_broker_and_in_body_bytes(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock, job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.fakes[0].messages[job.queues.dead] = [_gave_up(f"t-{i}") for i in range(5)]
    answer = await _reader(cluster, store, clock).read(job, 3)
    assert [d.task_id for d in answer.dead_letters] == ["t-0", "t-1", "t-2"] and answer.truncated
    assert all(d.body == b"" and d.size > 0 for d in answer.dead_letters)  # bodies only when asked
    monkeypatch.setattr("truba.scheduler.dead_letters.MAX_BODY_BYTES", 2 * len(_task("t-0", 2)))
    answer = await _reader(cluster, store, clock).read(job, bodies=True)
    assert [bool(d.body) for d in answer.dead_letters] == [True, True, False, False, False]
    with pytest.raises(InvalidArgument, match="^limit: must be 0..1000"):
        await _reader(cluster, store, clock).read(job, 5000)


async def test_a_broker_down_is_named_and_the_others_are_listed(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock, job: Job
) -> None:
    cluster.fakes[0].messages[job.queues.dead] = [_gave_up("t-1")]
    cluster.fakes[1].down = True
    answer = await _reader(cluster, store, clock).read(job)
    assert [d.task_id for d in answer.dead_letters] == ["t-1"]
    assert len(answer.unreachable) == 1 and answer.unreachable[0].startswith("b1: ConnectionLost")


async def test_an_ended_jobs_dead_letters_are_listed_until_their_keep_time_is_past(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock, job: Job
) -> None:
    cluster.fakes[0].messages[job.queues.dead] = [_gave_up("t-1")]
    ended = dataclasses.replace(job, state=JobState.FINISHED, finished_at=clock())
    store.update(ended, keep_dead_until=clock() + 60)
    answer = await _reader(cluster, store, clock).read(ended)
    assert [d.task_id for d in answer.dead_letters] == ["t-1"] and answer.kept_until == clock() + 60
    clock.advance(60)
    with pytest.raises(
        FailedPrecondition, match=r"is finished: its dead letters were kept until .* and are deleted"
    ):
        await _reader(cluster, store, clock).read(ended)
    store.forget_dead(job.id)
    with pytest.raises(
        FailedPrecondition,
        match=r"its dead letters are deleted \(they are kept for the scheduler's --keep-dead time",
    ):
        await _reader(cluster, store, clock).read(ended)


async def test_remove_takes_only_the_named_tasks(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock, job: Job
) -> None:
    poison = QueuedMessage(poison_record(b"junk", "task: not msgpack"), {})
    cluster.fakes[0].messages[job.queues.dead] = [_gave_up("t-1"), poison, _gave_up("t-2")]
    cluster.fakes[1].messages[job.queues.dead] = [_gave_up("t-3")]
    reader = _reader(cluster, store, clock)
    answer = await reader.remove(job, ["t-1", "t-3"])
    assert answer.removed == 2
    left = await reader.read(job)
    assert [(d.task_id, d.reason) for d in left.dead_letters] == [("", POISON), ("t-2", GAVE_UP)]
