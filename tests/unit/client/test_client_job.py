"""Client and Job end to end over FakeBroker and a fake scheduler: submit, outcomes, dedup,
resume, cancel, a broker that lost its data, a callback that fails, finishing."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeDaemon, FakeScheduler, client_for, daemons_for
from tests.waiting import eventually
from truba.client import (
    CallbackFailed,
    Client,
    InvalidArgument,
    Job,
    NoJournal,
    NotFound,
    Outcome,
    TaskFailed,
)
from truba.client.encoded import EncodedTask
from truba.client.journal import Journal
from truba.pipes.errors import ChannelLost, CodecError, MessageTooLarge, PipeClosed
from truba.pipes.fake_broker import FakeBroker
from truba.proto.v1 import jobs_pb2
from truba.wire import TaskCodec, TaskMessage


@pytest.fixture
def scheduler() -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0")])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


async def serve(daemons: list[FakeDaemon]) -> None:
    """The daemons answer every task as it comes, until cancelled, or until the job's queues
    are gone (the job ended and the scheduler deleted them: on a fast run that can come before
    the test cancels this loop)."""
    while True:
        for daemon in daemons:
            try:
                await daemon.run()
            except ChannelLost:
                return
        await asyncio.sleep(0.005)


async def collect(stream: AsyncGenerator[Outcome, None], timeout: float = 10.0) -> list[Outcome]:
    async with asyncio.timeout(timeout):
        return [outcome async for outcome in stream]


async def take(stream: AsyncGenerator[Outcome, None], count: int) -> list[str]:
    """Takes ``count`` outcomes for good: asks for one more, then puts that one back."""
    ids = [(await anext(stream)).task_id for _ in range(count + 1)]
    await stream.aclose()
    return ids[:count]


def task_ids(queue: list[bytes]) -> list[str]:
    return [TaskCodec().decode(body).task_id for body in queue]


async def test_submitted_tasks_come_back_as_one_outcome_each_and_the_job_finishes(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("tests.handlers.basic:echo", name="t")
    ids = [await job.submit(n) for n in range(5)]
    await job.close()
    (daemon,) = daemons_for(scheduler, job, handler=lambda n: n * 10)  # type: ignore[operator]
    assert [task.payload for task in await daemon.run()] == [0, 1, 2, 3, 4]
    outcomes = await collect(job.results())
    assert {o.task_id: o.result() for o in outcomes} == {i: n * 10 for n, i in enumerate(ids)}
    assert job.done and job.ended and (job.submitted, job.received, job.outstanding) == (5, 5, 0)
    state = scheduler.jobs[job.id]
    assert state.state == jobs_pb2.JOB_STATE_FINISHED and state.submitted == 5
    assert scheduler.calls.count("FinishJob") == 1
    assert f"truba.job.{job.id}.results" not in scheduler.brokers[0].queues  # the scheduler deleted them


async def test_a_failed_task_gives_an_outcome_that_raises(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    await job.submit("boom")
    await job.close()

    def fail(payload: object) -> object:
        raise RuntimeError(str(payload))

    (daemon,) = daemons_for(scheduler, job, handler=fail)
    await daemon.run()
    (outcome,) = await collect(job.results())
    assert not outcome.ok
    with pytest.raises(TaskFailed, match="boom"):
        outcome.result()


async def test_submit_refuses_before_anything_is_recorded(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    with pytest.raises(ValueError, match="without priorities"):
        await job.submit(1, priority=3)
    with pytest.raises(MessageTooLarge):
        await job.submit(b"x" * (17 * 1024 * 1024))
    assert job.submitted == 0
    await job.close()
    with pytest.raises(PipeClosed):
        await job.submit(1)
    assert job.submitted == 0 and scheduler.brokers[0].messages(f"truba.job.{job.id}.tasks") == []


async def test_duplicate_results_are_dropped(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    ids = [await job.submit(n) for n in range(4)]
    await job.close()
    (daemon,) = daemons_for(scheduler, job)
    tasks = await daemon.take()
    await daemon.answer(tasks[:2])
    await daemon.answer(tasks)  # a daemon died after sending: the first two ran twice
    outcomes = await collect(job.results())
    assert sorted(o.task_id for o in outcomes) == sorted(ids)


async def test_resume_sends_what_no_broker_confirmed_and_skips_outcomes_taken(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    first = client_for(scheduler, journal=tmp_path)
    await first.connect()
    job = await first.create_job("h:f", frames=False)  # each submit is published at once
    ids = [await job.submit(n) for n in range(3)]
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    taken = await take(job.results(), 1)
    await job.detach()  # as if the process died here (its links are left as they are)
    # A task recorded but never confirmed: the process died between the journal and the broker.
    journal = Journal.open(first.journal_path(job.id))
    await journal.record("lost-0", EncodedTask.of(TaskMessage("lost-0", 99)).data)
    await journal.close()

    async with client_for(scheduler, journal=tmp_path) as second:
        resumed = await second.resume(job.id)
        assert (resumed.submitted, resumed.received, resumed.outstanding) == (4, 1, 3)
        tasks = scheduler.brokers[0].messages(f"truba.job.{job.id}.tasks")
        assert task_ids(tasks) == ["lost-0"]  # sent again at once; the confirmed ones are waited for
        await resumed.close()
        await daemon.run()
        outcomes = await collect(resumed.results())
    assert sorted(o.task_id for o in outcomes) == sorted({*ids, "lost-0"} - set(taken))
    assert not (tmp_path / job.id).exists()


async def test_resume_needs_a_journal_and_a_live_job(scheduler: FakeScheduler, tmp_path: Path) -> None:
    async with client_for(scheduler) as memory_only:
        with pytest.raises(NoJournal):
            await memory_only.resume("job1")
    async with client_for(scheduler, journal=tmp_path) as client:
        job = await client.create_job("h:f")
        await job.detach()
        await scheduler.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
        with pytest.raises(NotFound, match="has ended"):
            await client.resume(job.id)
        assert not (tmp_path / job.id).exists()  # a cancelled job's journal is not left behind


async def test_resuming_an_unknown_or_finished_job_is_not_found_not_no_journal(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        with pytest.raises(NotFound):
            await client.resume("nosuchjob")
        job = await client.create_job("h:f")
        await job.submit(1)
        await job.close()
        (daemon,) = daemons_for(scheduler, job)
        await daemon.run()
        await collect(job.results())
        with pytest.raises(NotFound, match="FINISHED"):
            await client.resume(job.id)


@pytest.mark.parametrize("job_id", ["../../etc", "", "/abs", "a/b", "JOB1", "x" * 65])
async def test_resume_refuses_a_malformed_job_id_before_touching_any_path(
    scheduler: FakeScheduler, tmp_path: Path, job_id: str
) -> None:
    async with client_for(scheduler, journal=tmp_path / "journal") as client:
        with pytest.raises(InvalidArgument, match="job_id"):
            await client.resume(job_id)
        with pytest.raises(InvalidArgument):
            client.job(job_id)
    assert "GetJob" not in scheduler.calls and not (tmp_path / "journal").exists()


async def test_cancel_gives_a_cancelled_outcome_to_every_task_without_one(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        job = await client.create_job("h:f", frames=False)
        ids = [await job.submit(n) for n in range(3)]
        (daemon,) = daemons_for(scheduler, job)
        await daemon.answer(await daemon.take(limit=1))
        stream = job.results()
        first = await anext(stream)
        assert first.ok and first.task_id == ids[0]
        await job.cancel()
        rest = await collect(stream)
    assert [(o.task_id, o.cancelled) for o in rest] == [(ids[1], True), (ids[2], True)]
    assert job.ended and scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED
    assert not (tmp_path / job.id).exists()
    assert "FinishJob" not in scheduler.calls


async def test_a_job_cancelled_elsewhere_ends_with_cancelled_outcomes(
    scheduler: FakeScheduler, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("truba.client.result_stream.STATE_POLL_SECONDS", 0.0)
    job = await client.create_job("h:f")
    ids = [await job.submit(n) for n in range(2)]
    await job.close()
    await scheduler.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))  # another client did
    outcomes = await collect(job.results())
    assert [(o.task_id, o.cancelled) for o in outcomes] == [(i, True) for i in ids]
    assert job.ended


async def test_a_broker_that_lost_its_data_gets_every_outstanding_task_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("truba.client.watch.CHECK_INTERVAL", 0.02)
    scheduler = FakeScheduler([FakeBroker("fake://b0"), FakeBroker("fake://b1")])
    async with client_for(scheduler) as client:
        job = await client.create_job("h:f", frames=False)
        ids = [await job.submit(n) for n in range(8)]
        await job.close()
        daemons = daemons_for(scheduler, job)
        for daemon in daemons:
            await daemon.run()
        taken = await take(job.results(), 2)
        outstanding = set(ids) - set(taken)
        lost, kept = daemons
        before = {daemon: len(daemon.seen) for daemon in daemons}
        lost.broker.lose_data()  # the broker came back empty: its tasks and results are gone
        lost.forget_leaves()
        queue = f"truba.job.{job.id}.tasks"
        async with asyncio.timeout(10):  # the loss is seen, and the tasks are sent again
            while sum(len(daemon.broker.messages(queue)) for daemon in daemons) < len(outstanding):
                await asyncio.sleep(0.01)
        again = [task.task_id for daemon in daemons for task in await daemon.take()]
        assert sorted(again) == sorted(outstanding)  # every outstanding task was sent again, once
        for daemon in daemons:
            await daemon.answer(daemon.seen[before[daemon] :])
        server = asyncio.create_task(serve(daemons))
        try:
            outcomes = await collect(job.results())
        finally:
            server.cancel()
    assert sorted(o.task_id for o in outcomes) == sorted(outstanding)  # each once: duplicates dropped
    assert job._submission.watch.losses == 1


async def test_a_callback_that_raises_puts_its_outcome_back(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    ids = [await job.submit(n) for n in range(4)]
    await job.close()
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    got: list[str] = []

    def picky(outcome: Outcome) -> None:
        if outcome.task_id == ids[1] and "refused" not in got:
            got.append("refused")
            raise ValueError("not now")
        got.append(outcome.task_id)

    job.on_result(picky)
    with pytest.raises(CallbackFailed) as failed:
        await job.wait()
    assert failed.value.task_id == ids[1] and isinstance(failed.value.__cause__, ValueError)
    job.on_result(picky)
    async with asyncio.timeout(10):
        await job.wait()
    assert collections.Counter(got) == collections.Counter([*ids, "refused"])
    assert job.done and job.ended


async def test_finish_waits_out_a_scheduler_that_is_briefly_unreachable(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    await job.submit(1)
    await job.close()
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    scheduler.fail("FinishJob", times=2)
    assert len(await collect(job.results())) == 1
    assert scheduler.calls.count("FinishJob") == 3
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_FINISHED


async def test_close_detaches_jobs_still_going(scheduler: FakeScheduler, tmp_path: Path) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        job: Job = await client.create_job("h:f")
        await job.submit(1)
    assert job.ended and (tmp_path / job.id).is_dir()
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_OPEN


async def test_resume_after_every_broker_came_back_empty_sends_each_outstanding_task_once(
    tmp_path: Path,
) -> None:
    # Given a job whose tasks every broker confirmed, detached (as if its client died),
    scheduler = FakeScheduler([FakeBroker("fake://b0"), FakeBroker("fake://b1")])
    first = client_for(scheduler, journal=tmp_path)
    await first.connect()
    job = await first.create_job("h:f", frames=False)
    ids = [await job.submit(n) for n in range(32)]
    await job._submission.settle_confirms()
    await job.detach()  # (its links stay as they are: closing them would close the fakes)
    # when both brokers come back without their data (truba up restarted with empty brokers)
    for broker in scheduler.brokers:
        broker.lose_data()
    published = sum(broker.published for broker in scheduler.brokers)
    async with client_for(scheduler, journal=tmp_path) as second:
        resumed = await second.resume(job.id)
        await resumed._submission.settle_confirms()
        # then every task without an outcome is sent again exactly once (it was 2-3 times)
        sent = sum(broker.published for broker in scheduler.brokers) - published
        queued = [t for b in scheduler.brokers for t in task_ids(b.messages(f"truba.job.{job.id}.tasks"))]
        assert sent == 32 and sorted(queued) == sorted(ids)
        await resumed.detach()


async def test_brokers_found_lost_in_the_same_round_send_each_task_again_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("truba.client.watch.CHECK_INTERVAL", 0.02)
    scheduler = FakeScheduler([FakeBroker("fake://b0"), FakeBroker("fake://b1")])
    async with client_for(scheduler) as client:
        job = await client.create_job("h:f", frames=False)
        ids = [await job.submit(n) for n in range(16)]
        await job._submission.settle_confirms()
        published = sum(broker.published for broker in scheduler.brokers)
        for broker in scheduler.brokers:
            broker.lose_data()

        def sent() -> int:
            return sum(broker.published for broker in scheduler.brokers) - published

        async with asyncio.timeout(10):
            while job._submission.watch.losses < 2 or sent() < len(ids):
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # many more rounds of checks: nothing more is sent
        assert sent() == len(ids)
        await job.detach()


async def test_a_refused_payload_refuses_that_task_only_and_the_job_stays_usable(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    with pytest.raises(CodecError):
        await job.submit(object())
    with pytest.raises(MessageTooLarge):
        await job.submit(b"x" * (17 * 1024 * 1024))
    task = await job.submit(1)
    await job.close()
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    assert [(o.task_id, o.result()) for o in await collect(job.results())] == [(task, 1)]


async def test_a_job_used_as_a_context_manager_is_cancelled_when_the_block_raises(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        with pytest.raises(ZeroDivisionError):
            async with await client.create_job("h:f") as job:
                await job.submit(1)
                _ = 1 / 0
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CANCELLED  # no orphan holding slots
    assert not (tmp_path / job.id).exists()  # nor its journal


async def test_a_job_used_as_a_context_manager_is_closed_after_the_block(
    scheduler: FakeScheduler, client: Client
) -> None:
    async with await client.create_job("h:f") as job:
        await job.submit(1)
    assert scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_CLOSED
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    assert len(await collect(job.results())) == 1 and job.done


async def test_a_job_used_as_a_context_manager_is_left_running_on_an_interrupt(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    async with client_for(scheduler, journal=tmp_path) as client:
        with pytest.raises(KeyboardInterrupt):
            async with await client.create_job("h:f") as job:
                await job.submit(1)
                raise KeyboardInterrupt
        assert job.ended and scheduler.jobs[job.id].state == jobs_pb2.JOB_STATE_OPEN
        resumed = await client.resume(job.id)  # it is the user's to resume or cancel
        assert resumed.outstanding == 1
        await resumed.cancel()


async def test_a_nacked_task_is_logged_once_with_its_task_id(
    scheduler: FakeScheduler, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The task stack's log layer leaves failed confirms to the submission (one done-callback
    per task, not two): each is still logged, once, now with the task's id."""
    caplog.set_level(logging.WARNING)
    job = await client.create_job("h:f", frames=False)
    await job.submit(0)  # opens the task stack (which declares the queue), and is confirmed
    scheduler.brokers[0].drop_queue(scheduler.queues(job.id).tasks)  # unroutable: nacked
    task_id = await job.submit(1)
    await eventually(lambda: any(r.getMessage() == "client.task.unconfirmed" for r in caplog.records))
    failed = [(r.getMessage(), getattr(r, "task_id", None)) for r in caplog.records]
    assert [entry for entry in failed if entry[0].endswith(".unconfirmed")] == [
        ("client.task.unconfirmed", task_id)
    ]
    await job.cancel()
