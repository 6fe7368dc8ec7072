"""A job's failed attempts and dead letters over the HTTP API: served behind the token, bounded in
time, the dead letters read through the brokers once for many askers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.scheduler.conftest import Scheduled
from tests.unit.scheduler.fakes import FakeCluster, ManualClock
from truba.pipes.broker import QueuedMessage
from truba.proto.v1 import daemons_pb2, jobs_pb2
from truba.scheduler.dead_answers import DeadLetterAnswers
from truba.scheduler.dead_letters import DeadLetterReader
from truba.scheduler.history import JobHistory
from truba.scheduler.http_api import build_app
from truba.scheduler.metrics import SchedulerMetrics
from truba.scheduler.model import Job
from truba.scheduler.store import SqliteJobStore
from truba.scheduler.timeline import TaskTimeline
from truba.wire import ErrorInfo, GaveUpCodec, GaveUpRecord, TaskCodec, TaskMessage

HANDLER = "examples.math:square"
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def gave_up(task_id: str) -> QueuedMessage:
    task = TaskCodec().encode(TaskMessage(task_id, 30.0, 2))
    error = ErrorInfo("TaskTimeout", "attempt 3 ran past 1 s", "Traceback: ...")
    return QueuedMessage(GaveUpCodec().encode(GaveUpRecord(task_id, 3, error, "d1", task)), {})


class CountingReader:
    """A DeadLetterReader that counts its reads and can be held up."""

    def __init__(self, inner: DeadLetterReader) -> None:
        self.inner = inner
        self.reads = 0
        self.gate: asyncio.Event | None = None

    async def read(
        self, job: Job, limit: int = 0, *, bodies: bool = False
    ) -> jobs_pb2.ListDeadLettersResponse:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        return await self.inner.read(job, limit, bodies=bodies)


@dataclass
class Served:
    http: TestClient[Any, Any]
    job: Job
    reader: CountingReader
    clock: ManualClock
    cluster: FakeCluster


@pytest.fixture
async def served(
    scheduled: Scheduled, cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock
) -> AsyncIterator[Served]:
    job = await scheduled.jobs.create(HANDLER, 1.0)
    timeline = TaskTimeline()
    failed = daemons_pb2.Span(
        job_id=job.id, task_id="t-1", slot=2, start=9.0, end=10.0, outcome=daemons_pb2.SPAN_OUTCOME_ERROR
    )
    failed.attempt, failed.error, failed.error_message = 1, "ValueError", "negative one is not welcome here"
    ok = daemons_pb2.Span(job_id=job.id, task_id="t-2", slot=2, start=10.0, end=11.0)
    timeline.report("d1", [failed, ok])
    cluster.fakes[0].messages[job.queues.dead] = [gave_up("t-9")]
    reader = CountingReader(DeadLetterReader(cluster.brokers, store, clock=clock))
    dead = DeadLetterAnswers(scheduled.jobs.get, cast(DeadLetterReader, reader), wait=0.2, clock=clock)
    view = scheduled.view
    app = build_app(view, SchedulerMetrics(), JobHistory(view), token=TOKEN, timeline=timeline, dead=dead)
    async with TestClient(TestServer(app)) as http:
        yield Served(http, job, reader, clock, cluster)


async def get(served: Served, path: str, *, token: bool = True) -> tuple[int, Any]:
    async with served.http.get(path, headers=AUTH if token else {}) as response:
        return response.status, await response.json()


async def test_a_jobs_failed_attempts_are_served_with_their_errors(served: Served) -> None:
    job_id = served.job.id
    assert (await get(served, f"/api/v1/jobs/{job_id}/errors", token=False))[0] == 401
    status, answer = await get(served, f"/api/v1/jobs/{job_id}/errors")
    assert status == 200 and answer["job_id"] == job_id
    (error,) = answer["errors"]
    assert error["task_id"] == "t-1" and (error["daemon_id"], error["slot"], error["attempt"]) == ("d1", 2, 1)
    assert (error["outcome"], error["error"]) == ("error", "ValueError")
    assert error["message"] == "negative one is not welcome here" and error["end"] == 10.0
    assert (await get(served, f"/api/v1/jobs/{job_id}/errors?limit=0"))[1]["errors"] == []
    assert (await get(served, f"/api/v1/jobs/{job_id}/errors?limit=x"))[0] == 400
    assert (await get(served, "/api/v1/jobs/nope/errors"))[0] == 404


async def test_a_jobs_dead_letters_are_served_without_bodies(served: Served) -> None:
    job_id = served.job.id
    assert (await get(served, f"/api/v1/jobs/{job_id}/dead", token=False))[0] == 401
    status, answer = await get(served, f"/api/v1/jobs/{job_id}/dead")
    assert status == 200 and answer["job_id"] == job_id
    (letter,) = answer["dead_letters"]
    assert (letter["task_id"], letter["reason"], letter["attempts"]) == (
        "t-9",
        "DEAD_LETTER_REASON_GAVE_UP",
        3,
    )
    assert (letter["error_type"], letter["error_message"]) == ("TaskTimeout", "attempt 3 ran past 1 s")
    assert (letter["broker"], letter["daemon_id"]) == ("b0", "d1") and "body" not in letter
    assert int(letter["size"]) > 0
    assert (await get(served, "/api/v1/jobs/nope/dead"))[0] == 404
    assert (await get(served, "/api/v1/jobs/NO!/dead"))[0] == 400
    assert (await get(served, f"/api/v1/jobs/{job_id}/dead?limit=5000"))[0] == 400
    assert (await get(served, f"/api/v1/jobs/{job_id}/dead?limit=x"))[0] == 400


async def test_dead_letters_are_read_once_for_askers_within_a_few_seconds(served: Served) -> None:
    path = f"/api/v1/jobs/{served.job.id}/dead"
    served.reader.gate = asyncio.Event()
    asks = [asyncio.create_task(get(served, path)) for _ in range(3)]
    while served.reader.reads == 0:
        await asyncio.sleep(0)
    served.reader.gate.set()
    answers = await asyncio.gather(*asks)
    assert served.reader.reads == 1 and all(status == 200 for status, _ in answers)
    served.cluster.fakes[1].messages[served.job.queues.dead] = [gave_up("t-10")]
    assert len((await get(served, path))[1]["dead_letters"]) == 1  # the same answer, reused
    served.clock.advance(5.0)
    assert len((await get(served, path))[1]["dead_letters"]) == 2 and served.reader.reads == 2


async def test_brokers_that_do_not_answer_in_time_are_a_504_and_the_read_goes_on(served: Served) -> None:
    path = f"/api/v1/jobs/{served.job.id}/dead"
    served.reader.gate = asyncio.Event()
    status, answer = await get(served, path)
    assert status == 504 and "in time" in answer["error"]
    served.reader.gate.set()
    status, answer = await get(served, path)
    assert status == 200 and served.reader.reads == 1  # the answer the first ask started


async def test_an_ended_jobs_deleted_dead_letters_are_a_409(served: Served, scheduled: Scheduled) -> None:
    await scheduled.jobs.cancel(served.job.id)
    served.clock.advance(10.0)
    status, answer = await get(served, f"/api/v1/jobs/{served.job.id}/dead")
    assert status == 409 and "deleted" in answer["error"]
