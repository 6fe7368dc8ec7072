from __future__ import annotations

import asyncio

import pytest

from tests.unit.scheduler.fakes import FakeCluster, make_fake_cluster, no_sleep
from truba.backoff import Backoff
from truba.pipes.errors import SendTimeout
from truba.scheduler.errors import Unavailable
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.model import job_queues
from truba.scheduler.store import SqliteJobStore

QUEUES = job_queues("j1")


async def test_declare_creates_the_three_queues_and_the_record_on_every_broker(cluster: FakeCluster) -> None:
    await cluster.brokers.declare(QUEUES)
    for fake in cluster.fakes:
        assert set(fake.queues) == {QUEUES.tasks, QUEUES.results, QUEUES.dead, QUEUES.result_log}
        assert fake.queues[QUEUES.result_log].kind == "stream"
        assert fake.queues[QUEUES.tasks].kind == "quorum"
        assert fake.queues[QUEUES.tasks].dead_letter_to == QUEUES.dead
        assert fake.queues[QUEUES.results].kind == "quorum"
        assert fake.queues[QUEUES.results].dead_letter_to == QUEUES.dead
        assert fake.queues[QUEUES.dead].kind == "classic"
        assert fake.queues[QUEUES.dead].dead_letter_to is None
    assert [b.name for b in cluster.brokers.infos] == ["b0", "b1"]


async def test_a_steps_queues_are_declared_at_once_not_one_after_another(cluster: FakeCluster) -> None:
    await cluster.brokers.declare(QUEUES)
    # dead + tasks, then results + record: CreateJob waits for the slowest of each pair.
    assert [fake.most_declaring for fake in cluster.fakes] == [2, 2]


async def test_a_broker_that_refuses_streams_gets_the_job_without_a_record(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.fakes[1].refuses = {"stream"}
    await cluster.brokers.declare(QUEUES)
    assert set(cluster.fakes[1].queues) == {QUEUES.tasks, QUEUES.results, QUEUES.dead}
    assert QUEUES.result_log in cluster.fakes[0].queues
    assert "sched.queues.no_record" in caplog.text


async def test_a_down_broker_fails_declare_naming_it_without_its_password(cluster: FakeCluster) -> None:
    cluster.fakes[1].down = True
    with pytest.raises(Unavailable) as caught:
        await cluster.brokers.declare(QUEUES)
    message = str(caught.value)
    assert message.startswith("broker b1 (amqp://guest@127.0.0.1:5673/) is unavailable: ConnectionLost")
    assert "secret" not in message
    assert "b0" not in message


async def test_one_connection_per_broker_reopened_after_it_broke(cluster: FakeCluster) -> None:
    fake = cluster.fakes[0]
    await cluster.brokers.declare(job_queues("a"))
    await cluster.brokers.declare(job_queues("b"))
    assert fake.connects == 1
    # When the broker goes away and comes back
    fake.down = True
    with pytest.raises(Unavailable):
        await cluster.brokers.declare(job_queues("c"))
    fake.down = False
    # Then the next operation reconnects
    await cluster.brokers.declare(job_queues("d"))
    assert fake.connects == 2
    assert job_queues("d").tasks in fake.queues


async def test_a_hanging_broker_times_out() -> None:
    cluster = make_fake_cluster(count=1, timeout=0.05)
    await cluster.brokers.declare(job_queues("a"))
    cluster.fakes[0].hang = True
    with pytest.raises(Unavailable, match="SendTimeout"):
        await cluster.brokers.declare(job_queues("b"))
    cluster.fakes[0].hang = False
    with pytest.raises(SendTimeout):
        cluster.fakes[0].hang = True
        await cluster.brokers.all[0].delete(job_queues("a"))


async def test_the_janitor_retries_a_down_broker_until_the_queues_are_gone(
    cluster: FakeCluster, store: SqliteJobStore
) -> None:
    # Given queues on both brokers and a stale-ledger entry, with broker b1 down
    await cluster.brokers.declare(QUEUES)
    store.reserve("j1")
    cluster.fakes[1].down = True
    attempts = 0

    async def sleep(_: float) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 3:
            cluster.fakes[1].down = False  # b1 comes back after three failed attempts
        await no_sleep(0)

    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=sleep))
    # When the janitor reaps the job
    assert await janitor.reap_within("j1", timeout=5)
    # Then both brokers are clean and the ledger forgot the job
    assert attempts == 3
    assert cluster.fakes[0].queues == {} and cluster.fakes[1].queues == {}
    assert list(store.stale()) == []
    await janitor.close()


async def test_a_closed_janitor_leaves_the_ledger_for_the_next_start(
    cluster: FakeCluster, store: SqliteJobStore
) -> None:
    await cluster.brokers.declare(QUEUES)
    store.reserve("j1")
    cluster.fakes[0].down = True
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    assert not await janitor.reap_within("j1", timeout=0.05)
    await janitor.close()
    assert list(store.stale()) == ["j1"]
    # The next start resumes from the ledger
    cluster.fakes[0].down = False
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    janitor.resume()
    assert janitor.pending() == {"j1"}
    assert await janitor.reap_within("j1", timeout=5)
    assert list(store.stale()) == [] and cluster.fakes[0].queues == {}
    await janitor.close()


async def test_restore_declares_missing_queues_and_deletions_wait_for_it(
    cluster: FakeCluster, store: SqliteJobStore
) -> None:
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    janitor.restore([job_queues("a"), job_queues("b")])
    store.reserve("b")
    assert await janitor.reap_within("b", timeout=5)
    for fake in cluster.fakes:
        assert set(fake.queues) == set(job_queues("a").all())
    await janitor.close()


async def test_deleted_queues_are_deleted_once_more_later(
    cluster: FakeCluster, store: SqliteJobStore
) -> None:
    await cluster.brokers.declare(QUEUES)
    store.reserve("j1")
    janitor = QueueJanitor(
        cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep), resweep_after=0.05
    )
    assert await janitor.reap_within("j1", timeout=5)
    # A reconnecting daemon re-declared the task queue in the meantime
    await cluster.brokers.all[0].declare(QUEUES)
    assert cluster.fakes[0].queues
    for _ in range(100):
        if not cluster.fakes[0].queues:
            break
        await asyncio.sleep(0.01)
    assert cluster.fakes[0].queues == {}
    await janitor.close()
