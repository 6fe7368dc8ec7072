"""A daemon's metrics and per-task events over FakeBroker and real slots: what moves, what goes."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.waiting import eventually
from truba.daemon import task_events
from truba.daemon.daemon import Daemon, DaemonConfig
from truba.daemon.metrics_http import metrics_listen, metrics_server
from truba.daemon.task_events import sampled
from truba.logs import ContextFilter
from truba.pipes.testing import FakeBroker
from truba.proto.v1 import common_pb2, daemons_pb2
from truba.queues import JobQueues, job_queues
from truba.wire import ResultCodec, TaskCodec, TaskMessage

BROKER = "fake://b0"


class Running:
    def __init__(self, daemon: Daemon, broker: FakeBroker, queues: JobQueues) -> None:
        self.daemon = daemon
        self.broker = broker
        self.queues = queues

    def assign(self, version: int, slots: int, handler: str = "tests.handlers.basic:square") -> None:
        queues = self.queues
        wire = common_pb2.JobQueues(tasks=queues.tasks, results=queues.results, dead=queues.dead)
        jobs = [daemons_pb2.JobSlots(job_id="fk", handler=handler, slots=slots, queues=wire)] if slots else []
        self.daemon.assign(daemons_pb2.Assignment(version=version, jobs=jobs))

    async def submit(self, *tasks: TaskMessage) -> None:
        publisher = await self.broker.sender(self.queues.tasks)
        for task in tasks:
            await (await publisher.send(TaskCodec().encode(task)))

    def results(self) -> dict[str, bool]:
        decoded = [ResultCodec().decode(body) for body in self.broker.messages(self.queues.results)]
        return {r.task_id: r.ok for r in decoded}

    def sample(self, name: str, **labels: str) -> float | None:
        return self.daemon.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    broker = FakeBroker(BROKER)
    queues = job_queues("fk")
    for spec in queues.specs():
        await broker.declare(spec)
    daemon = Daemon(
        DaemonConfig("127.0.0.1:1", 1, ["tests.handlers.*"], daemon_id="d-fake"), brokers=lambda _: broker
    )
    daemon.welcome(daemons_pb2.Welcome(brokers=[common_pb2.Broker(url=BROKER, name="b0")]))
    task = asyncio.create_task(daemon.run())
    try:
        yield Running(daemon, broker, queues)
    finally:
        daemon.stop_now()
        await asyncio.wait_for(task, 20)


async def test_attempts_durations_and_confirms_move_as_tasks_run_and_a_job_that_leaves_drops_its_series(
    running: Running,
) -> None:
    running.assign(1, 1)
    await running.submit(TaskMessage("t1", 7), TaskMessage("t2", -1), TaskMessage("t3", 3))
    await eventually(lambda: len(running.results()) == 3, timeout=20, what="three outcomes")
    assert running.results() == {"t1": True, "t2": False, "t3": True}
    await eventually(lambda: running.broker.messages(running.queues.tasks) == [], what="acked")

    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="ok") == 2
    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="failed") == 1
    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="timeout") == 0
    assert running.sample("truba_daemon_attempt_duration_seconds_count", job_id="fk") == 3
    # Each result is confirmed by the broker (results go out in frames: at least one message).
    confirmed = running.sample("truba_daemon_broker_confirms_total", broker=BROKER, result="ok")
    assert confirmed is not None and confirmed >= 1
    assert running.sample("truba_daemon_broker_confirms_total", broker=BROKER, result="failed") == 0
    assert running.sample("truba_daemon_slot_processes") == 1
    assert running.sample("truba_daemon_busy_slot_processes") == 0
    assert running.sample("truba_daemon_info", daemon="d-fake") == 1

    running.assign(2, 0)  # the job leaves this daemon: its series go with it
    await eventually(lambda: running.daemon.metrics.jobs == frozenset(), what="job forgotten")
    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="ok") is None
    assert running.sample("truba_daemon_attempt_duration_seconds_count", job_id="fk") is None


async def test_a_task_that_crashes_its_slot_counts_each_attempt_each_restart_and_the_give_up(
    running: Running,
) -> None:
    running.assign(1, 1, "tests.handlers.basic:behave")
    await running.submit(TaskMessage("boom", ["exit", 3]))  # three attempts (the default), then given up
    given_up = {"job_id": "fk", "outcome": "given_up"}
    await eventually(lambda: running.sample("truba_daemon_attempts_total", **given_up) == 1, timeout=20)
    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="crashed") == 3
    assert running.sample("truba_daemon_slot_restarts_total", reason="crashed") == 3
    assert running.sample("truba_daemon_slot_restarts_total", reason="timeout") == 0
    assert running.sample("truba_daemon_attempts_total", job_id="fk", outcome="ok") == 0


async def test_each_task_s_life_is_told_in_debug_events_with_its_ids(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(ContextFilter())
    with caplog.at_level(logging.DEBUG, logger="truba.daemon"):
        running.assign(1, 1)
        await running.submit(TaskMessage("t1", 7), TaskMessage("t2", 8))
        await eventually(
            lambda: running.broker.messages(running.queues.tasks) == [], timeout=20, what="acked"
        )
        await eventually(lambda: sum(r.message == "daemon.task.acked" for r in caplog.records) == 2)
    life = ["daemon.task.received", "daemon.task.started", "daemon.task.ended", "daemon.task.confirmed"]
    life.append("daemon.task.acked")
    for task_id in ("t1", "t2"):
        told = [r for r in caplog.records if getattr(r, "task_id", None) == task_id and r.message in life]
        assert [r.message for r in told] == life, task_id
        for record in told:
            fields = vars(record)
            assert (fields["job_id"], fields["daemon_id"], fields["slot"]) == ("fk", "d-fake", 0), (
                record.message
            )
        ended = told[2]
        assert ended.how == "ok" and ended.seconds >= 0  # type: ignore[attr-defined]


async def test_metrics_endpoint_serves_text_that_promtool_accepts(running: Running) -> None:
    running.assign(1, 1)
    await running.submit(TaskMessage("t1", 2))
    await eventually(lambda: running.results() == {"t1": True}, timeout=20)
    server = metrics_server(running.daemon.metrics, "127.0.0.1:0")
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{server.address}/metrics") as response:
                assert response.status == 200
                text = await response.text()
    finally:
        await server.close()
    assert 'truba_daemon_attempts_total{job_id="fk",outcome="ok"} 1.0' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/bootstrap installs Debian's prometheus package")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_metrics_given_a_port_alone_listen_on_loopback() -> None:
    assert metrics_listen("9100") == "127.0.0.1:9100"
    assert metrics_listen("0.0.0.0:9100") == "0.0.0.0:9100"
    assert metrics_listen("[::1]:9100") == "[::1]:9100"
    with pytest.raises(ValueError, match="HOST:PORT or PORT"):
        metrics_listen("localhost")


async def test_at_info_the_life_of_a_troubled_long_or_sampled_task_is_written_once_it_is_settled_and_no_other(
    running: Running, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sampled("ok-32") and not any(sampled(t) for t in ("ok-1", "bad", "slow"))
    monkeypatch.setattr(task_events, "LONG_ATTEMPT", 0.5)  # far above an echo, even on a busy machine
    caplog.handler.addFilter(ContextFilter())
    with caplog.at_level(logging.INFO, logger="truba.daemon"):
        running.assign(1, 1, "tests.handlers.basic:behave")
        await running.submit(
            TaskMessage("ok-1", ["ok", 1]),
            TaskMessage("ok-32", ["ok", 2]),  # sampled
            TaskMessage("bad", ["raise", "no"]),  # failed
            TaskMessage("slow", ["sleep", 0.5]),  # long enough to be written whatever happens
        )
        await eventually(
            lambda: running.broker.messages(running.queues.tasks) == [], timeout=20, what="acked"
        )
        await eventually(lambda: sum(r.message == "daemon.task.acked" for r in caplog.records) == 3)
    life = ["daemon.task.received", "daemon.task.started", "daemon.task.ended", "daemon.task.confirmed"]
    life.append("daemon.task.acked")
    told = {
        task_id: [r for r in caplog.records if getattr(r, "task_id", None) == task_id and r.message in life]
        for task_id in ("ok-1", "ok-32", "bad", "slow")
    }
    assert told["ok-1"] == []  # a short ok task not sampled: nothing written
    for task_id in ("ok-32", "bad", "slow"):
        records = told[task_id]
        assert [r.message for r in records] == life, task_id
        assert {r.levelno for r in records} == {logging.INFO}
        times = [r.created for r in records]
        assert times == sorted(times) and times[0] < times[-1], "each event keeps the time it happened"
        assert {(vars(r)["job_id"], vars(r)["slot"]) for r in records} == {("fk", 0)}
    assert [getattr(r, "how", None) for r in told["bad"]][2] == "failed"


def test_a_daemon_given_a_bad_metrics_address_says_so_and_exits_2() -> None:
    argv = [
        sys.executable,
        "-m",
        "truba.daemon",
        "--allow",
        "x:*",
        "--metrics",
        "nowhere",
        "--log-format",
        "text",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "daemon.bad_args" in done.stderr and "--metrics" in done.stderr
