"""A real daemon's ``--metrics`` endpoint over real brokers: promtool accepts it, values move as
tasks run, a job's series go when it leaves, a broker connection cut under it counts a reconnect;
and its debug log tells each task's life.

The scheduler is scripted (test_daemon_harness.py); the daemon is ``python -m truba.daemon``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.brokers import BrokerNode, amqp_url
from tests.integration.test_daemon_harness import (
    DaemonProcess,
    JobQueues,
    dump_logs,
    eventually,
    job_slots,
    scripted,
)
from truba.local import ThreadedFaultProxy
from truba.pipes.broker import redact
from truba.wire import TaskMessage

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def urls(rabbit_nodes: list[object]) -> list[str]:
    return [node.url for node in rabbit_nodes]  # type: ignore[attr-defined]


@pytest.fixture
async def job(urls: list[str], request: pytest.FixtureRequest) -> AsyncIterator[JobQueues]:
    queues = JobQueues(f"metrics-{secrets.token_hex(3)}", urls)
    await queues.declare()
    try:
        yield queues
    finally:
        await queues.delete()


def metrics_address(daemon: DaemonProcess) -> str | None:
    """Where the daemon serves its metrics, from its ``daemon.metrics.started`` event."""
    for line in daemon.log().splitlines():
        if '"daemon.metrics.started"' in line:
            return str(json.loads(line)["listen"])
    return None


async def scrape(address: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"http://{address}/metrics", timeout=aiohttp.ClientTimeout(total=5)
        ) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            return await response.text()


async def scrape_until(
    address: str, holds: Callable[[Samples], bool], what: str, timeout: float = 20.0
) -> Samples:
    """Scrapes until ``holds`` is true of what the daemon serves (the counters follow the acks,
    which come just after the outcomes); AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = samples(await scrape(address))
        if holds(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s: {found}")
        await asyncio.sleep(0.05)


def samples(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def total(found: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series that have ``labels`` (any other labels)."""
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/bootstrap installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_daemon_metrics_move_as_tasks_run_promtool_accepts_them_and_a_job_that_leaves_drops_its_series(
    urls: list[str], job: JobQueues, tmp_path: Path
) -> None:
    async with scripted(urls, tmp_path) as (scheduler, start_daemon):
        daemon = start_daemon("d-metrics", 2, "--metrics", "127.0.0.1:0", "--max-tasks-per-slot", "1")
        await eventually(lambda: scheduler.connected("d-metrics"), what="daemon connected")
        await eventually(lambda: metrics_address(daemon), what="metrics served")
        address = metrics_address(daemon)
        assert address is not None and address.startswith("127.0.0.1:")
        await scrape_until(
            address, lambda found: value(found, "truba_daemon_scheduler_connected") == 1, "welcomed"
        )
        before = await scrape(address)
        promtool_check(before)
        found = samples(before)
        assert value(found, "truba_daemon_scheduler_connects_total") == 1
        assert value(found, "truba_daemon_scheduler_connected") == 1
        assert value(found, "truba_daemon_slot_processes") == 2
        assert total(found, "truba_daemon_attempts_total") == 0

        scheduler.assign(
            "d-metrics", job_slots(job, "tests.handlers.basic:behave", 2, task_timeout=1.0, max_attempts=1)
        )
        tasks = [TaskMessage(f"ok-{i}", ["ok", i]) for i in range(4)]
        tasks += [
            TaskMessage("raises", ["raise", "no"]),
            TaskMessage("too-slow", ["sleep", 30]),  # past the 1 s timeout: given up (one attempt)
            TaskMessage("crashes", ["exit", 3]),  # kills its slot: given up
        ]
        await job.submit(*tasks)
        await job.collect([t.task_id for t in tasks], timeout=30)
        job_id = job.job_id

        given_up = {"job_id": job_id, "outcome": "given_up"}
        await scrape_until(
            address,
            lambda found: value(found, "truba_daemon_attempts_total", **given_up) == 2,
            "both given up",
        )
        after = await scrape(address)
        promtool_check(after)
        found = samples(after)
        attempts = {
            outcome: value(found, "truba_daemon_attempts_total", job_id=job_id, outcome=outcome)
            for outcome in ("ok", "failed", "timeout", "crashed", "preempted", "retried", "given_up")
        }
        assert attempts == {
            "ok": 4,
            "failed": 1,
            "timeout": 1,
            "crashed": 1,
            "preempted": 0,
            "retried": 0,
            "given_up": 2,
        }, dump_logs(tmp_path)
        assert value(found, "truba_daemon_attempt_duration_seconds_count", job_id=job_id) == 7
        slow = value(found, "truba_daemon_attempt_duration_seconds_bucket", job_id=job_id, le="0.5")
        assert slow is not None and slow <= 6  # the timed-out attempt held its slot a second
        assert value(found, "truba_daemon_slot_restarts_total", reason="timeout") == 1
        assert value(found, "truba_daemon_slot_restarts_total", reason="crashed") == 1
        recycled = value(found, "truba_daemon_slot_recycles_total", reason="max_tasks")
        assert recycled is not None and recycled >= 1
        # Results, give-ups and dead letters were confirmed by the brokers; each broker connected.
        assert total(found, "truba_daemon_broker_confirms_total", result="ok") >= 1
        assert total(found, "truba_daemon_broker_confirms_total", result="failed") == 0
        for url in urls:
            assert (value(found, "truba_daemon_broker_connects_total", broker=redact(url)) or 0) >= 1, found
        assert (value(found, "truba_daemon_heartbeats_total") or 0) >= 1
        assert value(found, "truba_daemon_busy_slot_processes") == 0

        scheduler.assign("d-metrics")  # the job leaves this daemon: its series go
        gone = await scrape_until(
            address,
            lambda found: value(found, "truba_daemon_attempt_duration_seconds_count", job_id=job_id) is None,
            "the job's series gone",
        )
        assert total(gone, "truba_daemon_attempts_total", job_id=job_id) == 0
        assert value(gone, "truba_daemon_attempt_duration_seconds_count", job_id=job_id) is None

        # The daemon's debug log tells each task's life, each event with the task's ids.
        life = ["daemon.task.received", "daemon.task.started", "daemon.task.ended"]
        life += ["daemon.task.confirmed", "daemon.task.acked"]
        events = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
        for task in tasks:
            told = [e for e in events if e.get("task_id") == task.task_id and e["event"] in life]
            # A task handed to a slot in a chunk behind one that crashed it went back unstarted
            # and came again: its life here is then two, which may overlap.
            names = [e["event"] for e in told]
            assert set(names) == set(life) and names[0] == life[0] and names[-1] == life[-1], names
            for event in told:
                assert event["job_id"] == job_id and event["daemon_id"] == "d-metrics", event
                assert event["slot"] in (0, 1) and event["time"].endswith("Z"), event
        ended = {e["task_id"]: e["how"] for e in events if e["event"] == "daemon.task.ended"}
        assert (
            ended["too-slow"] == "timeout" and ended["crashes"] == "crashed" and ended["raises"] == "failed"
        )


async def test_a_broker_connection_cut_under_a_daemon_counts_a_reconnect_and_tasks_go_on(
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
    tmp_path: Path,
) -> None:
    node = rabbit_nodes[0]
    proxy = fault_proxy(node)
    via_proxy = amqp_url(proxy.host, proxy.port)
    queues = JobQueues(f"reconnect-{secrets.token_hex(3)}", [node.url])
    await queues.declare()
    try:
        async with scripted([via_proxy], tmp_path) as (scheduler, start_daemon):
            daemon = start_daemon("d-cut", 1, "--metrics", "127.0.0.1:0", "--broker-heartbeat", "1")
            await eventually(lambda: scheduler.connected("d-cut"), what="daemon connected")
            await eventually(lambda: metrics_address(daemon), what="metrics served")
            address = metrics_address(daemon)
            assert address is not None
            scheduler.assign("d-cut", job_slots(queues, "tests.handlers.basic:echo", 1))
            await queues.submit(TaskMessage("before", 1))
            await queues.collect(["before"], timeout=30)
            broker = redact(via_proxy)
            connects = "truba_daemon_broker_connects_total"
            found = await scrape_until(address, lambda f: value(f, connects, broker=broker) == 1, "connected")

            assert proxy.cut() >= 1  # every connection through the proxy reset under the daemon
            await queues.submit(TaskMessage("after", 2))
            await queues.collect(["after"], timeout=30)
            confirms = "truba_daemon_broker_confirms_total"

            def reconnected(f: Samples) -> bool:  # a confirm may come just after its result is taken
                return (value(f, connects, broker=broker) or 0) >= 2 and (
                    value(f, confirms, broker=broker, result="ok") or 0
                ) >= 2

            found = await scrape_until(address, reconnected, "reconnected, both results confirmed")
            # (3 when the cut took the ack of the first: it ran again)
            assert (value(found, "truba_daemon_attempts_total", job_id=queues.job_id, outcome="ok") or 0) >= 2
    finally:
        await queues.delete()
