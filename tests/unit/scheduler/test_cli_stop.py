"""The scheduler's process lets the calls its stop ended finish before asyncio.run cancels them."""

from __future__ import annotations

import asyncio
import time

import pytest

from truba.scheduler import cli


async def test_a_task_still_running_after_serve_returns_ends_on_its_own() -> None:
    # A call's task still sending its status when serve returns (gRPC logs a cancelled one as an
    # unhandled error with a traceback): it is waited for, not cancelled.
    ended: list[str] = []

    async def call() -> None:
        await asyncio.sleep(0.05)
        ended.append("call")

    async def serve() -> int:
        asyncio.create_task(call(), name="call")
        return 3

    assert await cli._then_let_calls_end(serve()) == 3
    assert ended == ["call"]


async def test_a_task_that_never_ends_is_left_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "CALLS_END_WAIT", 0.1)
    forever = asyncio.Event()

    async def serve() -> int:
        asyncio.create_task(forever.wait(), name="forever")
        return 0

    started = time.monotonic()
    assert await cli._then_let_calls_end(serve()) == 0
    assert time.monotonic() - started < 1.0
    left = [task for task in asyncio.all_tasks() if task.get_name() == "forever"]
    assert left and not left[0].done()
    left[0].cancel()
