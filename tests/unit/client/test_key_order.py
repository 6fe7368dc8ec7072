"""Tasks in order per key (``submit(key=...)``) over FakeBroker and the fake scheduler: one task of
a key at the brokers at a time, in submission order; keys beside each other; held tasks reported
as no demand; any outcome (an error too) releasing the next; chains rebuilt by a resume that
never sends a held task early; bad keys refused."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.unit.client.fakes import FakeDaemon, FakeScheduler, client_for, daemons_for
from truba.client import Client, InvalidArgument, Job
from truba.client.blocking import BlockingJob, _LoopThread
from truba.client.encoded import EncodedTask
from truba.client.journal import Journal
from truba.client.keys import KeyChains
from truba.pipes.base import Confirmation, Sender
from truba.pipes.errors import PipeBroken
from truba.pipes.fake_broker import FakeBroker
from truba.wire import TaskCodec, TaskMessage


class Clock:
    """The broker's clock: real time moved forward by the test."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def scheduler(clock: Clock) -> FakeScheduler:
    return FakeScheduler([FakeBroker("fake://b0", clock=clock)])


@pytest.fixture
async def client(scheduler: FakeScheduler) -> AsyncIterator[Client]:
    async with client_for(scheduler) as client:
        yield client


def queued(scheduler: FakeScheduler, job: Job) -> list[str]:
    """Ids of the tasks in the job's task queue now (frames off: one per message)."""
    return [
        TaskCodec().decode(body).task_id
        for body in scheduler.brokers[0].messages(f"truba.job.{job.id}.tasks")
    ]


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.002)


async def serve(daemon: FakeDaemon, batches: list[list[TaskMessage]]) -> None:
    """Answers every task as it comes, recording what was at the broker together."""
    while True:
        batch = await daemon.run()
        if batch:
            batches.append(batch)
        await asyncio.sleep(0.001)


def keyed(*pairs: tuple[str, int]) -> list[list[object]]:
    return [[key, seq] for key, seq in pairs]


async def test_a_keys_tasks_go_to_the_brokers_one_at_a_time_in_submission_order(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    ids = [await job.submit(["a", n], key="a") for n in range(5)]  # returns at once: held
    assert queued(scheduler, job) == ids[:1]
    (daemon,) = daemons_for(scheduler, job)
    batches: list[list[TaskMessage]] = []
    serving = asyncio.create_task(serve(daemon, batches))
    await job.close()
    outcomes = [outcome async for outcome in job.results()]
    serving.cancel()
    assert [o.task_id for o in outcomes] == ids
    assert [task.task_id for task in daemon.seen] == ids
    assert all(len(batch) == 1 for batch in batches)  # never two of the key at the broker at once
    assert job.done


async def test_keys_go_side_by_side_and_a_hot_key_holds_back_only_its_own_tasks(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    hot = [await job.submit(["hot", n], key="hot") for n in range(50)]
    cold = {key: [await job.submit([key, n], key=key) for n in range(3)] for key in ("b", "c", "d")}
    loose = await job.submit("no key")
    # The head of every key, and the task without a key, are out at once.
    assert queued(scheduler, job) == [hot[0], cold["b"][0], cold["c"][0], cold["d"][0], loose]
    (daemon,) = daemons_for(scheduler, job)
    batches: list[list[TaskMessage]] = []
    serving = asyncio.create_task(serve(daemon, batches))
    await job.close()
    finished: list[str] = [o.task_id async for o in job.results()]
    serving.cancel()
    for key, ids in {"hot": hot, **cold}.items():
        assert [t.task_id for t in daemon.seen if t.payload[0] == key] == ids  # type: ignore[index]
    for batch in batches:
        keys = collections.Counter(t.payload[0] for t in batch if isinstance(t.payload, list))
        assert max(keys.values(), default=1) == 1, batch
    # The small keys were done long before the hot one: their last outcomes came in its first few.
    last_cold = max(finished.index(ids[-1]) for ids in cold.values())
    assert last_cold < finished.index(hot[10])


async def test_held_tasks_are_reported_as_no_demand_like_delayed_ones(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    for n in range(5):
        await job.submit(n, key="a")
    await job.submit("b", key="b")
    await until(lambda: bool(scheduler.progress) and scheduler.progress[-1][1] == 6)
    assert scheduler.delayed[-1] == 4  # a's four held tasks; the two heads are demand
    await job.cancel()


async def test_an_error_outcome_releases_the_keys_next_task_as_soon_as_it_comes(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    ids = [await job.submit(n, key="a") for n in range(3)]

    def fails_first(payload: object) -> object:
        if payload == 0:
            raise ValueError("first one fails")
        return payload

    (daemon,) = daemons_for(scheduler, job, fails_first)
    await job.close()
    results = job.results()
    await daemon.run()
    failed = await anext(results)
    assert failed.task_id == ids[0] and not failed.ok
    # The consumer still holds the error (not taken yet): the next task went out when it came.
    await until(lambda: queued(scheduler, job) == ids[1:2])
    await daemon.run()
    assert (await anext(results)).task_id == ids[1]
    await until(lambda: queued(scheduler, job) == ids[2:3])
    await daemon.run()
    assert [o.task_id async for o in results] == ids[2:]


async def test_a_duplicate_outcome_of_a_head_releases_its_next_task_once(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    ids = [await job.submit(n, key="a") for n in range(3)]
    (daemon,) = daemons_for(scheduler, job)
    first = await daemon.take()
    await daemon.answer(first)
    await daemon.answer(first)  # a daemon died after sending its result: it ran again
    results = job.results()
    assert (await anext(results)).task_id == ids[0]
    await until(lambda: queued(scheduler, job) == ids[1:2])
    await daemon.run()
    assert (await anext(results)).task_id == ids[1]  # the duplicate of ids[0] was dropped
    await until(lambda: queued(scheduler, job) == ids[2:3])
    assert [t.task_id for t in daemon.seen] == ids[:2]
    await results.aclose()
    await job.cancel()


async def test_cancel_gives_held_tasks_cancelled_outcomes_and_sends_none_of_them(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    ids = [await job.submit(n, key="a") for n in range(4)]
    await job.cancel()
    outcomes = [o async for o in job.results()]
    assert sorted(o.task_id for o in outcomes) == sorted(ids) and all(o.cancelled for o in outcomes)
    assert scheduler.brokers[0].published == 1


async def test_a_bad_key_is_refused_with_invalid_argument_and_nothing_is_recorded(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f")
    for bad in (7, "", "k" * 257, "é" * 129, "\ud800"):
        with pytest.raises(InvalidArgument, match="key"):
            await job.submit("x", key=bad)  # type: ignore[arg-type]
    assert await job.submit("x", key="é" * 128)  # 256 bytes: the longest
    assert job.submitted == 1 and scheduler.brokers[0].published == 1
    await job.cancel()


async def test_a_delayed_head_holds_its_key_until_it_ran(
    scheduler: FakeScheduler, client: Client, clock: Clock
) -> None:
    (broker,) = scheduler.brokers
    job = await client.create_job("h:f", frames=False)
    later = await job.submit("later", key="a", delay=3600)
    after = await job.submit("after", key="a")  # not delayed, but its turn is after `later`'s
    other = await job.submit("other", key="b")
    assert queued(scheduler, job) == [other]
    assert len(broker.held(f"truba.job.{job.id}.tasks")) == 1
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()
    results = job.results()
    assert (await anext(results)).task_id == other
    assert queued(scheduler, job) == []  # `after` waits for `later`, due in an hour
    clock.ahead = 3601
    broker.release_due()
    assert [t.task_id for t in await daemon.run()] == [later]
    assert (await anext(results)).task_id == later
    await until(lambda: queued(scheduler, job) == [after])
    await results.aclose()
    await job.cancel()


class FailingSend:
    """A task sender whose send of ``task_id`` waits for ``go``, then fails (no broker took it)."""

    def __init__(self, inner: Sender[EncodedTask], task_id: str) -> None:
        self.inner = inner
        self.task_id = task_id
        self.go = asyncio.Event()

    async def send(self, message: EncodedTask) -> Confirmation:
        if message.task_id == self.task_id:
            await self.go.wait()
            raise PipeBroken("no broker took it (scripted)")
        return await self.inner.send(message)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_head_whose_submit_failed_is_withdrawn_and_its_keys_next_task_goes_out(
    scheduler: FakeScheduler, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await client.create_job("h:f", frames=False)
    submission = job._submission
    failing = FailingSend(submission._tasks, f"{submission._prefix}-0")
    monkeypatch.setattr(submission, "_tasks", failing)
    head = asyncio.create_task(job.submit("head", key="a"))
    await until(lambda: job.submitted == 1)
    second = await job.submit("second", key="a")  # held behind the head being sent
    failing.go.set()
    with pytest.raises(PipeBroken):
        await head
    await until(lambda: queued(scheduler, job) == [second])
    assert job.submitted == 1
    await job.cancel()


async def test_resume_rebuilds_the_chains_and_sends_only_heads_never_a_held_task(
    scheduler: FakeScheduler, tmp_path: Path
) -> None:
    first = client_for(scheduler, journal=tmp_path)
    await first.connect()
    job = await first.create_job("h:f", frames=False)
    a = [await job.submit(["a", n], key="a") for n in range(3)]
    b = [await job.submit(["b", n], key="b") for n in range(2)]
    (daemon,) = daemons_for(scheduler, job)
    await daemon.run()  # a0 and b0 ran; their results wait
    results = job.results()
    assert (await anext(results)).task_id == a[0]
    assert (await anext(results)).task_id == b[0]  # a0 taken; both came: a1 and b1 go out
    await until(lambda: queued(scheduler, job) == [a[1], b[1]])
    await results.aclose()  # b0 put back (not taken): its result comes again
    await job._submission.settle_confirms()
    await job.detach()  # as if the process died here
    # A key whose tasks were recorded and never sent: the process died before the head went out.
    journal = Journal.open(first.journal_path(job.id))
    for n in range(2):
        await journal.record(f"z-{n}", EncodedTask.of(TaskMessage(f"z-{n}", ["z", n])).data, "z")
    await journal.close()
    published = scheduler.brokers[0].published

    async with client_for(scheduler, journal=tmp_path) as second:
        resumed = await second.resume(job.id)
        # Sent again: z's head only. a1 and b1 (confirmed) are left to the broker, b0 (its
        # outcome came) is not sent again; a2 and z-1 wait.
        assert scheduler.brokers[0].published == published + 1
        assert queued(scheduler, job) == [a[1], b[1], "z-0"]
        assert resumed._submission.keys.held == 2
        batches: list[list[TaskMessage]] = []
        serving = asyncio.create_task(serve(daemon, batches))
        await resumed.close()
        outcomes = [o.task_id async for o in resumed.results()]
        serving.cancel()
    assert sorted(outcomes) == sorted([*a[1:], *b, "z-0", "z-1"])
    for key, ids in {"a": a, "b": b, "z": ["z-0", "z-1"]}.items():
        assert [t.task_id for t in daemon.seen if t.payload[0] == key] == ids  # type: ignore[index]
    for batch in batches:
        keys = collections.Counter(t.payload[0] for t in batch)  # type: ignore[index]
        assert max(keys.values()) == 1, batch


async def test_keyed_calls_and_group_members_keep_their_keys_order(
    scheduler: FakeScheduler, client: Client
) -> None:
    job = await client.create_job("h:f", frames=False)
    (daemon,) = daemons_for(scheduler, job)
    batches: list[list[TaskMessage]] = []
    serving = asyncio.create_task(serve(daemon, batches))
    group = job.group()
    members = [await group.submit(["g", n], key="k") for n in range(3)]
    calls = [asyncio.create_task(job.call(["c", n], key="k")) for n in range(3)]
    async with asyncio.timeout(10):
        assert await asyncio.gather(*calls) == [["c", n] for n in range(3)]
        await group.close()
        assert [o.task_id for o in await group.wait()] == members
    serving.cancel()
    assert [t.payload for t in daemon.seen] == [["g", 0], ["g", 1], ["g", 2], ["c", 0], ["c", 1], ["c", 2]]
    await job.cancel()


async def test_a_job_without_keys_adds_nothing_per_outcome(scheduler: FakeScheduler, client: Client) -> None:
    job = await client.create_job("h:f")
    await job.submit("x")
    assert job._stream.arrived is None and job._stream.settled is None  # tells nobody of outcomes
    await job.submit("y", key="a")
    assert job._stream.arrived is not None and job._stream.settled is not None
    await job.cancel()


def test_a_journal_keeps_each_tasks_key_and_gives_them_back_in_order(tmp_path: Path) -> None:
    async def write() -> None:
        journal = Journal.open(tmp_path)
        await journal.record("t-0", b"zero", "a")
        await journal.record("t-1", b"one")
        await journal.record("t-2", b"two", "ключ")
        await journal.record("t-3", b"three", "a")
        journal.settle("t-0")
        await journal.close()

    asyncio.run(write())
    journal = Journal.open(tmp_path)
    assert journal.take_keyed() == [("t-2", "ключ", b"two"), ("t-3", "a", b"three")]
    assert journal.take_keyed() == []
    assert journal.load(["t-1", "t-2", "t-3"]) == {"t-1": b"one", "t-2": b"two", "t-3": b"three"}
    journal.close_now()


def test_chains_release_the_next_head_only_when_a_head_ends() -> None:
    chains = KeyChains()
    assert chains.add("a", "a0") and not chains.add("a", "a1") and not chains.add("a", "a2")
    assert chains.add("b", "b0")
    assert chains.held == 2 and chains.is_held("a1") and not chains.is_held("a0")
    assert chains.end("a2") is None  # a held task ended (a cancel): nothing goes out
    assert chains.end("a0") == "a1"
    assert chains.end("a0") is None  # a duplicate ends nothing
    assert chains.end("a1") is None and chains.end("b0") is None
    assert len(chains) == 0 and chains.held == 0


def test_rebuilt_chains_start_at_each_keys_newest_confirmed_task() -> None:
    chains = KeyChains()
    tasks = [("a0", "a"), ("b0", "b"), ("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")]
    # a0, a1, a2 confirmed: a2 was sent, so a0's and a1's outcomes had come; b0 never confirmed.
    came = chains.rebuild(tasks, {"a0", "a1", "a2"})
    assert came == ["a0", "a1"]
    assert not chains.is_held("a2") and chains.is_held("a3")
    assert not chains.is_held("b0") and chains.is_held("b1")
    assert chains.held == 2


async def test_a_broker_that_lost_its_data_gets_the_heads_again_never_a_held_task(
    monkeypatch: pytest.MonkeyPatch, scheduler: FakeScheduler, client: Client
) -> None:
    monkeypatch.setattr("truba.client.watch.CHECK_INTERVAL", 0.02)
    (broker,) = scheduler.brokers
    job = await client.create_job("h:f", frames=False)
    a = [await job.submit(["a", n], key="a") for n in range(3)]
    b = [await job.submit(["b", n], key="b") for n in range(2)]
    await job._submission.settle_confirms()
    assert queued(scheduler, job) == [a[0], b[0]]
    broker.lose_data()
    await until(lambda: queued(scheduler, job) == [a[0], b[0]])  # the loss is seen, the heads sent again
    assert broker.published == 4 and job._submission.keys.held == 3
    await job.cancel()


def test_the_blocking_job_submits_and_calls_with_a_key_too(scheduler: FakeScheduler) -> None:
    runner = _LoopThread()
    try:

        async def start() -> tuple[Client, BlockingJob, FakeDaemon, asyncio.Task[None]]:
            client = client_for(scheduler)
            await client.connect()
            job = await client.create_job("h:f", frames=False)
            (daemon,) = daemons_for(scheduler, job)
            return client, BlockingJob(job, runner), daemon, asyncio.create_task(serve(daemon, []))

        client, job, daemon, server = runner.run(start())
        first = job.submit("first", key="k")
        # The call's task goes out once the first one's outcome came, though nobody takes that
        # outcome (it is parked for results()).
        assert job.call("second", key="k", timeout=10) == "second"
        assert [t.task_id for t in daemon.seen][0] == first

        async def stop() -> None:
            server.cancel()
            await client.close()

        runner.run(stop())
    finally:
        runner.stop()
