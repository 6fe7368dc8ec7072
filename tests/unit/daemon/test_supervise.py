"""An attempt under watch, on a real slot: every way it ends, in the worker's own task.

The watch ends an attempt by cancelling the task that awaits it; these check that it tells its
own cancellation from a real one (which must propagate), that the task is left with no cancel
request of the watch's, and that a reply already here wins over an interrupt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from truba.daemon import slot_process
from truba.daemon.replies import ReplyReader
from truba.daemon.slot_process import SlotProcess
from truba.daemon.supervise import MIB, Ending, Interrupt, Limits, run_attempt

BEHAVE = "tests.handlers.basic:behave"
HOG = "tests.handlers.faults:hog"


@pytest.fixture
async def slot() -> AsyncIterator[SlotProcess]:
    process = SlotProcess(0)
    await process.start()
    yield process
    await process.stop()


def cancels_left() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


async def test_a_reply_is_the_attempt_s_end_and_the_slot_is_kept(slot: SlotProcess) -> None:
    pid = slot.pid
    end = await run_attempt(slot, BEHAVE, "t", ["ok", 7], Limits(timeout=5, memory=512 * MIB), Interrupt())
    assert end.ending is Ending.REPLIED and end.reply is not None and end.reply.value == 7
    assert slot.pid == pid and cancels_left() == 0


async def test_a_slot_that_exits_ends_it_as_died(slot: SlotProcess) -> None:
    end = await run_attempt(slot, BEHAVE, "t", ["exit", 3], Limits(timeout=5), Interrupt())
    assert end.ending is Ending.DIED and end.error is not None and end.error.type == "SlotDied"
    assert cancels_left() == 0


async def test_a_timeout_kills_the_slot_and_starts_it_afresh(slot: SlotProcess) -> None:
    pid = slot.pid
    end = await run_attempt(slot, BEHAVE, "t", ["sleep", 30], Limits(timeout=0.3), Interrupt())
    assert end.ending is Ending.TIMED_OUT and end.error is not None and end.error.type == "TaskTimeout"
    assert 0.3 <= end.seconds < 10 and slot.alive and slot.pid != pid
    assert cancels_left() == 0  # the watch took its cancel request back
    again = await run_attempt(slot, BEHAVE, "u", ["ok", 1], Limits(timeout=5), Interrupt())
    assert again.ending is Ending.REPLIED  # the fresh slot serves the next task


async def test_a_slot_over_its_memory_limit_is_killed(slot: SlotProcess) -> None:
    limits = Limits(timeout=30, memory=64 * MIB)
    end = await run_attempt(slot, HOG, "t", [256, 30], limits, Interrupt())
    assert end.ending is Ending.OUT_OF_MEMORY and end.error is not None
    assert end.error.type == "MemoryLimitExceeded" and "over the limit of 64 MiB" in end.error.message
    assert slot.alive and cancels_left() == 0


async def test_an_interrupt_stops_it_unspent_and_starts_the_slot_afresh(slot: SlotProcess) -> None:
    pid, interrupt = slot.pid, Interrupt()
    asyncio.get_running_loop().call_later(0.2, interrupt.set)
    end = await run_attempt(slot, BEHAVE, "t", ["sleep", 30], Limits(timeout=30), interrupt)
    assert end.ending is Ending.INTERRUPTED and end.error is None and end.seconds < 10
    assert slot.alive and slot.pid != pid and cancels_left() == 0


async def test_an_interrupt_set_before_it_begins_stops_it_at_once(slot: SlotProcess) -> None:
    pid, interrupt = slot.pid, Interrupt()
    interrupt.set()
    end = await run_attempt(slot, BEHAVE, "t", ["ok", 1], Limits(), interrupt)
    assert end.ending is Ending.INTERRUPTED and slot.alive and slot.pid != pid


async def test_a_reply_that_races_an_interrupt_wins(
    slot: SlotProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interrupt comes after the reply was read but before the waiting task took it (on a
    # slot up already: its ping's reply is not the one meant).
    await slot.warm()
    pid, interrupt = slot.pid, Interrupt()
    wake = ReplyReader._wake

    def wake_then_interrupt(reader: ReplyReader) -> None:
        wake(reader)
        if reader.woken:
            interrupt.set()

    monkeypatch.setattr(ReplyReader, "_wake", wake_then_interrupt)
    end = await run_attempt(slot, BEHAVE, "t", ["ok", 5], Limits(timeout=30), interrupt)
    assert interrupt.is_set()
    assert end.ending is Ending.REPLIED and end.reply is not None and end.reply.value == 5
    assert slot.pid == pid and cancels_left() == 0  # the slot kept: finished work is kept


async def test_a_real_cancellation_propagates_and_kills_the_slot(slot: SlotProcess) -> None:
    pid = slot.pid
    attempt = asyncio.create_task(
        run_attempt(slot, BEHAVE, "t", ["sleep", 30], Limits(timeout=30), Interrupt())
    )
    await asyncio.sleep(0.2)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert not slot.alive and slot.pid == pid  # killed, not restarted


async def test_a_real_cancellation_that_comes_with_an_interrupt_still_propagates(slot: SlotProcess) -> None:
    interrupt = Interrupt()
    attempt = asyncio.create_task(
        run_attempt(slot, BEHAVE, "t", ["sleep", 30], Limits(timeout=30), interrupt)
    )
    await asyncio.sleep(0.2)
    interrupt.set()  # the watch cancels the task once ...
    attempt.cancel()  # ... and so does its owner: that one must not be taken for the watch's
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert attempt.cancelled()


async def test_a_slot_slow_to_come_up_does_not_spend_the_attempt_s_time(slot: SlotProcess) -> None:
    # Given a slot process that cannot answer for 0.6 s (as a fresh interpreter on a loaded
    # machine), and an attempt limited to 0.3 s
    assert slot.pid is not None
    os.kill(slot.pid, signal.SIGSTOP)
    asyncio.get_running_loop().call_later(0.6, os.kill, slot.pid, signal.SIGCONT)
    began = time.monotonic()
    # When a quick task runs on it
    end = await run_attempt(slot, BEHAVE, "t", ["ok", 1], Limits(timeout=0.3), Interrupt())
    # Then its clock started once the slot was up: it replied, on the same process
    assert end.ending is Ending.REPLIED and end.reply is not None and end.reply.value == 1
    assert time.monotonic() - began >= 0.6 and not slot.cold


async def test_a_slot_that_never_comes_up_is_replaced_within_its_startup_bound(
    slot: SlotProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(slot_process, "STARTUP_TIMEOUT", 0.3)
    stuck = slot.pid
    assert stuck is not None
    os.kill(stuck, signal.SIGSTOP)
    with caplog.at_level(logging.WARNING, logger="truba.daemon.slot_process"):
        end = await run_attempt(slot, BEHAVE, "t", ["ok", 2], Limits(timeout=10), Interrupt())
    assert end.ending is Ending.REPLIED and end.reply is not None and end.reply.value == 2
    assert slot.pid != stuck
    assert [r.getMessage() for r in caplog.records] == ["daemon.slot.start_timed_out"]
