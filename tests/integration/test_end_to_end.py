"""One job end to end with real processes: scheduler + 2 daemons + 2 brokers."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pika
import pytest

import truba
from tests.integration.processes import ANY_HTTP, Cluster, queues_of
from truba.proto.v1 import jobs_pb2

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(rabbit_nodes: list[object], tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, rabbit_nodes)
    try:
        running.start()
        yield running
    finally:
        running.local.stop()


def test_a_job_of_2000_tasks_gives_exactly_2000_outcomes_and_its_queues_but_the_dead_letters_are_deleted(
    cluster: Cluster, rabbit_nodes: list[object]
) -> None:
    payloads = list(range(2000))
    payloads[777] = -1  # the handler raises for -1
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:square", importance=1.0)
        # tasks, results, dead, the record (made by the scheduler) and the client's marker, on
        # both brokers
        assert len(queues_of(job.id, rabbit_nodes)) == 10
        began = time.perf_counter()
        outcomes = list(job.map(payloads))
        seconds = time.perf_counter() - began
        info = client.get_job_info(job.id)
    print(f"2000 tasks in {seconds:.2f} s: {2000 / seconds:.0f} tasks/s")
    assert len(outcomes) == 2000
    assert len({o.task_id for o in outcomes}) == 2000
    failed = [o for o in outcomes if not o.ok]
    assert len(failed) == 1 and failed[0] is outcomes[777]
    assert failed[0].error is not None and failed[0].error.type == "ValueError"
    assert "negative one" in failed[0].error.message and "Traceback" in failed[0].error.traceback
    assert [o.value for i, o in enumerate(outcomes) if i != 777] == [
        p * p for i, p in enumerate(payloads) if i != 777
    ]
    # Both daemons worked on it.
    assert len({o.daemon_id for o in outcomes}) == 2
    assert info.state == jobs_pb2.JOB_STATE_FINISHED
    # The dead-letter queues are kept (the scheduler's --keep-dead), the others deleted
    assert queues_of(job.id, rabbit_nodes) == [info.queues.dead] * 2


def test_a_daemon_killed_halfway_loses_no_outcome(cluster: Cluster) -> None:
    total = 2000
    seen: collections.Counter[str] = collections.Counter()
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:sleep")
        for _ in range(total):
            job.submit(0.002)
        job.close()
        killed = False
        for outcome in job.results():
            seen[outcome.task_id] += 1
            assert outcome.ok, outcome.error
            if not killed and sum(seen.values()) >= total // 2:
                cluster.daemons[0].kill()
                killed = True
    assert killed
    assert len(seen) == total
    assert set(seen.values()) == {1}, "an outcome was delivered twice"
    assert not cluster.daemons[0].alive() and cluster.daemons[1].alive()


def test_large_payloads_among_small_ones_come_back_whole_once_each(cluster: Cluster) -> None:
    # 1 MB and 70 KB payloads are packed in parts, cross the slots' widened pipes and come back
    # in chunks; the small ones between them travel in frames.
    sizes = [100, 70_000, 1_000_000, 10] * 15
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:echo")
        outcomes = list(job.map(payloads))
    assert len({o.task_id for o in outcomes}) == len(payloads)
    assert [o.value for o in outcomes] == payloads


def test_a_handler_outside_the_allow_list_is_refused_at_once(cluster: Cluster) -> None:
    with truba.connect(cluster.address) as client:
        began = time.monotonic()
        with pytest.raises(truba.FailedPrecondition, match="os:system"):
            client.create_job(handler="os:system")
        assert time.monotonic() - began < 5


def test_an_allowed_handler_that_cannot_be_imported_gives_error_outcomes(cluster: Cluster) -> None:
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.missing_module:f")
        outcomes = list(job.map([1, 2, 3]))
    assert [o.ok for o in outcomes] == [False] * 3
    assert all(o.error is not None and o.error.type == "HandlerImportError" for o in outcomes)
    assert "tests.handlers.missing_module:f" in str(outcomes[0].error)


def test_bad_requests_get_clear_errors(cluster: Cluster) -> None:
    with truba.connect(cluster.address) as client:
        with pytest.raises(truba.NotFound, match="nope"):
            client.get_job_info("nope")
        with pytest.raises(truba.InvalidArgument) as bad_handler:
            client.create_job(handler="not a handler")
        assert bad_handler.value.details.startswith("handler")
        with pytest.raises(truba.InvalidArgument) as bad_importance:
            client.create_job(handler="tests.handlers.basic:echo", importance=-1)
        assert bad_importance.value.details.startswith("importance")


def test_garbage_in_a_task_queue_is_dead_lettered_and_the_daemons_keep_serving(
    cluster: Cluster, rabbit_nodes: list[object]
) -> None:
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:echo")
        info = job.info()
        broker = rabbit_nodes[0]
        # A foreign client (pika) publishes garbage straight into the job's task queue.
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))  # type: ignore[attr-defined]
        channel = connection.channel()
        channel.confirm_delivery()
        for body in (b"\xc1\xc1 not msgpack", b'{"json": "is not a truba task"}'):
            channel.basic_publish("", info.queues.tasks, body, pika.BasicProperties(delivery_mode=2))
        connection.close()
        dead = _wait_for(lambda: sum(b.list_queues().get(info.queues.dead, 0) for b in rabbit_nodes) == 2)  # type: ignore[attr-defined]
        assert dead, "the garbage did not reach the dead-letter queue"
        records = _take_all(rabbit_nodes, info.queues.dead)
        assert sorted(cast(bytes, r["body"]) for r in records) == sorted(
            [b"\xc1\xc1 not msgpack", b'{"json": "is not a truba task"}']
        )
        assert all(r["kind"] == "poison" and "task:" in cast(str, r["error"]) for r in records), records
        outcomes = list(job.map(["a", "b", "c"]))
    assert [o.value for o in outcomes] == ["a", "b", "c"]
    assert all(d.alive() for d in cluster.daemons)
    assert "pipe.poison" in cluster.logs()


def _take_all(brokers: list[object], queue: str) -> list[dict[str, object]]:
    """Every message of ``queue`` on every broker, decoded from msgpack, taken with pika."""
    import msgpack

    records = []
    for broker in brokers:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))  # type: ignore[attr-defined]
        channel = connection.channel()
        while True:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            records.append(msgpack.unpackb(body, raw=False))
        connection.close()
    return records


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_daemons_reconnect_after_the_scheduler_is_killed_and_the_job_completes(cluster: Cluster) -> None:
    total = 300
    with truba.connect(cluster.address) as client:
        job = client.create_job(handler="tests.handlers.basic:sleep")
        for _ in range(total):
            job.submit(0.01)
        job.close()
        scheduler = cluster.local.processes[0]
        assert scheduler.name == "scheduler"
        received = 0
        restarted = False
        for outcome in job.results():
            assert outcome.ok
            received += 1
            if received == 50:
                scheduler.kill()
                cluster.local.processes.remove(scheduler)
                time.sleep(1.0)  # daemons notice and start backing off
                urls = [b.url for b in cluster.brokers]  # type: ignore[attr-defined]
                cluster.local.start_scheduler(urls, cluster.address, "--heartbeat-interval", "0.5", *ANY_HTTP)
                restarted = True
        assert restarted and received == total
        assert client.get_job_info(job.id).state == jobs_pb2.JOB_STATE_FINISHED
    cluster.local.wait_for_daemons(2, timeout=30)
    for daemon in cluster.daemons:
        log = daemon.log()
        assert "daemon.scheduler.unreachable" in log
        assert log.count("daemon.scheduler.connected") >= 2
