"""The SDK's dead letters: typed, printable records; retry_dead sends them again as new tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.unit.client.fakes import FakeDaemon, FakeScheduler, client_for, daemons_for, rpc_error
from truba.client import Client, DeadLetter, DeadLetters, DeadReason, FailedPrecondition
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2
from truba.wire import ErrorInfo, ResultCodec, ResultMessage, TaskCodec, TaskMessage

TIMEOUT = ErrorInfo("TaskTimeout", "attempt 3 ran past 1 s", "Traceback (most recent call last): ...")


class DeadLetterScheduler(FakeScheduler):
    """A :class:`FakeScheduler` that also keeps dead letters per job (as the real one lists them)."""

    def __init__(self, brokers: list[FakeBroker]) -> None:
        super().__init__(brokers)
        self.dead: dict[str, list[jobs_pb2.DeadLetter]] = {}

    async def ListDeadLetters(
        self, request: jobs_pb2.ListDeadLettersRequest, **_: object
    ) -> jobs_pb2.ListDeadLettersResponse:
        self._enter("ListDeadLetters")
        job = self._job(request.job_id)
        if job.state == jobs_pb2.JOB_STATE_FINISHED:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "its dead letters are deleted")
        letters = [_copy(d, request.bodies) for d in self.dead.get(job.id, [])]
        return jobs_pb2.ListDeadLettersResponse(dead_letters=letters)

    async def RemoveDeadLetters(
        self, request: jobs_pb2.RemoveDeadLettersRequest, **_: object
    ) -> jobs_pb2.RemoveDeadLettersResponse:
        self._enter("RemoveDeadLetters")
        kept = self.dead.get(request.job_id, [])
        left = [d for d in kept if d.task_id not in request.task_ids]
        self.dead[request.job_id] = left
        return jobs_pb2.RemoveDeadLettersResponse(removed=len(kept) - len(left))


def _copy(letter: jobs_pb2.DeadLetter, bodies: bool) -> jobs_pb2.DeadLetter:
    copy = jobs_pb2.DeadLetter()
    copy.CopyFrom(letter)
    if not bodies:
        copy.body = b""
    return copy


def gave_up(task: TaskMessage) -> jobs_pb2.DeadLetter:
    body = TaskCodec().encode(task)
    return jobs_pb2.DeadLetter(
        task_id=task.task_id,
        reason=jobs_pb2.DEAD_LETTER_REASON_GAVE_UP,
        error_type=TIMEOUT.type,
        error_message=TIMEOUT.message,
        traceback=TIMEOUT.traceback,
        attempts=3,
        broker="b0",
        daemon_id="d1",
        body=body,
        size=len(body),
    )


POISON = jobs_pb2.DeadLetter(
    reason=jobs_pb2.DEAD_LETTER_REASON_POISON,
    error_type="MalformedFrame",
    error_message="malformed frame: members 0 and 1 both have task id 'x-1'",
    broker="b1",
    body=b"\xc1TF1...",
    size=7,
)


async def take(daemon: FakeDaemon, count: int) -> list[TaskMessage]:
    """The next ``count`` tasks (a frame may still be gathering the last ones)."""
    tasks: list[TaskMessage] = []
    async with asyncio.timeout(10):
        while len(tasks) < count:
            tasks += await daemon.take()
            await asyncio.sleep(0.01)
    return tasks


@pytest.fixture
def scheduler() -> DeadLetterScheduler:
    return DeadLetterScheduler([FakeBroker("fake://b0")])


@pytest.fixture
async def client(scheduler: DeadLetterScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


def test_dead_letters_are_typed_records_that_print_one_line_each() -> None:
    answer = jobs_pb2.ListDeadLettersResponse(
        dead_letters=[gave_up(TaskMessage("a-1", {"n": 7}, 2)), POISON],
        unreachable=["b2: ConnectionLost: refused"],
        truncated=True,
        kept_until=1_800_000_000.0,
    )
    letters = DeadLetters.from_pb(answer)
    first, poison = letters
    assert first == DeadLetter("a-1", DeadReason.GAVE_UP, TIMEOUT, 3, "b0", "d1", first.body, len(first.body))
    assert first.payload == {"n": 7} and poison.payload is None and poison.task is None
    assert str(first) == "a-1  gave up after 3 attempts (b0, daemon d1): TaskTimeout: attempt 3 ran past 1 s"
    assert (
        str(poison)
        == "-  poison (b1): MalformedFrame: malformed frame: members 0 and 1 both have task id 'x-1'"
    )
    assert str(letters).splitlines()[2:] == [
        "not read: b2: ConnectionLost: refused",
        "(more are kept than listed)",
        "kept until 2027-01-15T08:00:00+00:00",
    ]
    assert str(DeadLetters(())) == "no dead letters"


async def test_job_dead_letters_lists_them_through_the_scheduler(
    scheduler: DeadLetterScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    scheduler.dead[job.id] = [gave_up(TaskMessage("a-1", 1)), POISON]
    letters = await job.dead_letters()
    assert [(d.task_id, d.reason) for d in letters] == [("a-1", DeadReason.GAVE_UP), ("", DeadReason.POISON)]
    assert all(d.body == b"" and d.size for d in letters)  # bodies only when asked
    assert (await job.dead_letters(bodies=True))[0].payload == 1


async def test_retry_dead_sends_each_dead_task_again_as_a_new_task_with_its_own_outcome(
    scheduler: DeadLetterScheduler, client: Client
) -> None:
    # Given a job whose second task gave up (its give-up outcome came, its letter is kept)
    job = await client.create_job("h:f")
    ids = [await job.submit(n) for n in (1, 2)]
    (daemon,) = daemons_for(scheduler, job, handler=lambda n: n)
    first, second = await take(daemon, 2)
    await daemon.answer([first])
    results = await scheduler.brokers[0].sender(scheduler.queues(job.id).results)
    give_up = ResultMessage(second.task_id, False, None, TIMEOUT, "d1", 0.0, 3, gave_up=True)
    await (await results.send(ResultCodec().encode(give_up)))
    scheduler.dead[job.id] = [gave_up(second), POISON]
    # When the application sends the dead tasks again
    retried = await job.retry_dead()
    # Then each went out as a new task of the job, and its letter is gone (poison stays)
    assert list(retried) == [ids[1]] and retried[ids[1]] not in ids
    assert scheduler.dead[job.id] == [POISON]
    assert await job.retry_dead() == {}  # nothing left to send
    (again,) = await take(daemon, 1)
    await daemon.answer([again])
    assert (again.task_id, again.payload, again.attempts) == (retried[ids[1]], 2, 0)
    await job.close()
    async with asyncio.timeout(10):
        outcomes = {o.task_id: o async for o in job.results()}
    assert outcomes[ids[0]].ok and outcomes[ids[1]].gave_up
    assert outcomes[retried[ids[1]]].ok and outcomes[retried[ids[1]]].value == 2


async def test_retry_dead_on_a_closed_job_says_why_and_sends_nothing(
    scheduler: DeadLetterScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    await job.submit(1)
    await job.close()
    scheduler.dead[job.id] = [gave_up(TaskMessage("x-1", 1))]
    with pytest.raises(
        FailedPrecondition, match="is closed: retry_dead\\(\\) sends its dead tasks as new tasks"
    ):
        await job.retry_dead()
    assert "ListDeadLetters" not in scheduler.calls and job.submitted == 1
