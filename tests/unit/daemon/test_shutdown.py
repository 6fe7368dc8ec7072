"""The daemon's shutdown steps are bounded: a hung step is logged with where tasks wait, then
given up, and the daemon exits."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from truba.daemon import shutdown
from truba.daemon.daemon import Daemon, DaemonConfig
from truba.daemon.shutdown import bounded, pending_stacks
from truba.proto.v1 import common_pb2, daemons_pb2


async def hang_forever() -> None:
    await asyncio.Event().wait()


async def test_a_step_that_ends_in_time_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="truba.daemon.shutdown"):
        assert await bounded("quick", asyncio.sleep(0.01), timeout=1.0)
    assert caplog.records == []


async def test_a_failing_step_counts_as_done_and_its_error_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail() -> None:
        raise ConnectionResetError("gone")

    with caplog.at_level(logging.INFO, logger="truba.daemon.shutdown"):
        assert await bounded("brokers", fail(), timeout=1.0)
    assert [(r.message, r.step, r.error) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("daemon.shutdown.step_failed", "brokers", "ConnectionResetError('gone')")
    ]


async def test_a_hung_step_is_given_up_after_its_timeout_and_names_where_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bystander = asyncio.create_task(hang_forever(), name="bystander")
    step = asyncio.create_task(hang_forever(), name="the-step")
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="truba.daemon.shutdown"):
        assert not await bounded("scheduler_link", step, timeout=0.2)
    assert 0.2 <= time.monotonic() - began < 1.5
    assert step.cancelled()
    [record] = caplog.records
    assert (record.levelname, record.message) == ("ERROR", "daemon.shutdown.stuck")
    fields = record.__dict__
    assert fields["step"] == "scheduler_link"
    pending: list[str] = fields["pending"]
    assert any(line.startswith("bystander: Event.wait:") and "< hang_forever:" in line for line in pending), (
        pending
    )
    assert not any(line.startswith("the-step") for line in pending)
    bystander.cancel()


async def test_pending_stacks_lists_each_waiting_task_once_innermost_awaited_frame_first() -> None:
    waiting = asyncio.create_task(hang_forever(), name="waiting")
    await asyncio.sleep(0)
    lines = [line for line in pending_stacks() if line.startswith("waiting")]
    assert len(lines) == 1
    _, where = lines[0].split(": ", 1)
    assert [frame.split(":")[0] for frame in where.split(" < ")] == ["Event.wait", "hang_forever"]
    waiting.cancel()


async def test_a_daemon_whose_scheduler_link_never_ends_still_exits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(shutdown, "STEP_TIMEOUT", 0.3)
    daemon = Daemon(DaemonConfig("127.0.0.1:1", 1, ["tests.handlers.*"], daemon_id="d-stuck"))
    daemon.welcome(daemons_pb2.Welcome(brokers=[common_pb2.Broker(url="amqp://127.0.0.1:1/", name="b0")]))

    async def deaf_link(stop: asyncio.Event) -> None:  # ignores stop, as a hung stream would
        await hang_forever()

    monkeypatch.setattr(daemon.link, "run", deaf_link)
    running = asyncio.create_task(daemon.run())
    await asyncio.sleep(0.2)
    daemon.drain("test")
    with caplog.at_level(logging.INFO, logger="truba.daemon"):
        await asyncio.wait_for(running, 5.0)
    messages = [r.message for r in caplog.records]
    assert "daemon.shutdown.stuck" in messages
    assert messages[-1] == "daemon.stopped"
