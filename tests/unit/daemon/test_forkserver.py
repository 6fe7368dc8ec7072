"""Slots forked from a template that preloaded the handlers: real processes, no brokers."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.waiting import eventually
from truba.daemon.forkserver import ForkServer
from truba.daemon.launch import Spawn
from truba.daemon.slot_process import SlotDied, SlotProcess

PRELOADED = "tests.unit.daemon.preloaded:imported_elsewhere"
SLEEP = "tests.unit.daemon.preloaded:sleep"


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
async def server() -> AsyncIterator[ForkServer]:
    forks = ForkServer([PRELOADED, SLEEP])
    yield forks
    await forks.close()


async def test_forked_slots_run_tasks_with_the_handler_preloaded_and_spawned_ones_do_not(
    server: ForkServer,
) -> None:
    forked, spawned = SlotProcess(0, server), SlotProcess(1, Spawn())
    try:
        assert (await forked.run(PRELOADED, "t1", None)).value is True
        assert (await spawned.run(PRELOADED, "t2", None)).value is False
        assert forked.preloaded == {PRELOADED, SLEEP} and spawned.preloaded == frozenset()
        template = server.template
        assert template is not None and template.loaded == 2
        assert forked.pid in template.children
        # Measured by pid like any slot (the preloaded pages are the template's, not private).
        assert (forked.private_memory() or 0) > 0
    finally:
        await forked.stop()
        await spawned.stop()


async def test_a_forked_slot_killed_by_pid_is_seen_dead_and_the_next_task_gets_a_new_one(
    server: ForkServer,
) -> None:
    slot = SlotProcess(0, server)
    await slot.start()
    victim = slot.pid
    assert victim is not None
    running = asyncio.create_task(slot.run(SLEEP, "t1", 30.0))
    await asyncio.sleep(0.2)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(SlotDied, match="exited with -9"):
        await asyncio.wait_for(running, 5)
    assert not slot.alive
    reply = await slot.run(SLEEP, "t2", 0.0)
    assert reply.ok and reply.value == slot.pid != victim
    await slot.stop()


async def test_an_interrupted_task_kills_its_forked_slot(server: ForkServer) -> None:
    slot = SlotProcess(0, server)
    await slot.start()
    victim = slot.pid
    assert victim is not None
    running = asyncio.create_task(slot.run(SLEEP, "t1", 30.0))
    await asyncio.sleep(0.2)
    running.cancel()  # what a timeout, a memory limit or a preemption does
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not slot.alive and gone(victim)
    await slot.start()
    assert (await slot.run(SLEEP, "t2", 0.0)).value == slot.pid
    await slot.stop()


async def test_a_killed_template_takes_its_slots_along_and_a_new_one_is_started(server: ForkServer) -> None:
    slot = SlotProcess(0, server)
    await slot.start()
    old = server.template
    assert old is not None and old.pid is not None
    os.kill(old.pid, signal.SIGKILL)
    # Its slots die with it (they must not outlive the daemon through an orphaned template).
    await eventually(lambda: not slot.alive, timeout=5)
    reply = await slot.run(PRELOADED, "t1", None)
    assert reply.ok and reply.value is True
    new = server.template
    assert new is not None and new.pid != old.pid
    await slot.stop()


async def test_a_handler_that_fails_to_preload_breaks_nothing_and_its_tasks_report_the_import_error() -> None:
    server = ForkServer(
        ["tests.unit.daemon.broken_at_import:f", "tests.handlers.nope:f", "tests.handlers.basic:square"]
    )
    slot = SlotProcess(0, server)
    try:
        missing = await slot.run("tests.handlers.nope:f", "t1", None)
        assert missing.error is not None and missing.error.type == "HandlerImportError"
        broken = await slot.run("tests.unit.daemon.broken_at_import:f", "t2", None)
        assert broken.error is not None and broken.error.type == "SystemExit"
        assert (await slot.run("tests.handlers.basic:square", "t3", 4)).value == 16
        template = server.template
        assert template is not None and template.loaded == 1 and slot.preloaded == server.handlers
    finally:
        await slot.stop()
        await server.close()


async def test_a_template_that_cannot_start_falls_back_to_spawning_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = ForkServer([PRELOADED], program=["-c", "raise SystemExit(3)"], retry_after=60.0)
    slot = SlotProcess(0, server)
    try:
        with caplog.at_level(logging.WARNING, logger="truba.daemon.forkserver"):
            assert (await slot.run(PRELOADED, "t1", None)).value is False  # a spawned slot
        assert [r.message for r in caplog.records] == ["daemon.forkserver.unavailable"]
        assert server.template is None and slot.preloaded == frozenset()
        # Within retry_after nothing is retried, and the spawned slot is not "outdated".
        await slot.prepare(PRELOADED)
        assert (await slot.run(PRELOADED, "t2", None)).ok
        assert len(caplog.records) == 1
    finally:
        await slot.stop()
        await server.close()


async def test_an_idle_slot_lacking_a_newly_preloaded_handler_is_replaced_and_the_old_template_retires() -> (
    None
):
    server = ForkServer()
    slot = SlotProcess(0, server)
    try:
        await slot.start()
        first, old = slot.pid, server.template
        assert old is not None and old.pid is not None
        await slot.prepare(PRELOADED)  # nothing better to offer: kept
        assert slot.pid == first
        server.preload([PRELOADED])
        await slot.prepare(PRELOADED)
        assert slot.pid != first and PRELOADED in slot.preloaded
        assert (await slot.run(PRELOADED, "t1", None)).value is True
        # The old template had no slot left: it exits; the new one stays.
        await eventually(lambda: gone(old.pid or 0), timeout=5)
        second = slot.pid
        await slot.prepare(PRELOADED)
        assert slot.pid == second
    finally:
        await slot.stop()
        await server.close()


async def test_a_slot_forked_as_its_template_retires_keeps_the_template_and_its_exit_is_seen() -> None:
    # Given a fork in flight on a template that is retired (a new handler preloaded by another
    # slot's launch) after the template answered with the child's pid, before fork() resumed
    server = ForkServer([SLEEP])
    try:
        found = await server._template()
        assert found is not None
        old = found

        class RetiredOnAnswer(collections.deque[asyncio.Future[int]]):
            def append(self, future: asyncio.Future[int]) -> None:
                future.add_done_callback(lambda _: old.retire())  # runs before fork() resumes
                super().append(future)

        old._forks = RetiredOnAnswer()
        slot = await old.fork()
        # Then the template stays for its slot (it did not close, killing it), and the slot works
        assert old.alive and slot.returncode is None
        await asyncio.sleep(0.3)
        assert slot.returncode is None and not gone(slot.pid)
        # And once killed, its exit is seen and the template, retired and childless, exits
        slot.kill()
        assert await asyncio.wait_for(slot.wait(), 5) == -signal.SIGKILL
        await eventually(lambda: gone(old.pid or 0), timeout=5)
    finally:
        await server.close()


async def test_a_template_closed_while_its_reader_waits_leaves_no_stale_watch_on_its_number() -> None:
    # A template closed by force (not by its last slot's exit) while its reader waits on the
    # socket: the next file opened under the socket's number must be watched like any other (a
    # stale watch had hidden a slot's pidfd: its kill waited on forever).
    server = ForkServer([SLEEP])
    template = await server._template()
    assert template is not None and template._sock is not None
    number = template._sock.fileno()
    closing = asyncio.create_task(template.close())  # waits for the template to exit meanwhile
    await eventually(lambda: template._sock is None, timeout=5)  # closed, its number free again
    read, write = os.pipe()
    try:
        assert read == number  # the lowest free number: the socket's
        readable = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(read, readable.set)
        os.write(write, b"x")
        await asyncio.wait_for(readable.wait(), 2)
        loop.remove_reader(read)
        await closing
    finally:
        os.close(read)
        os.close(write)
        await server.close()


OWNER = """
import asyncio, sys
from truba.daemon.forkserver import ForkServer
from truba.daemon.slot_process import SlotProcess

async def main():
    server = ForkServer(["tests.handlers.basic:square"])
    slot = SlotProcess(0, server)
    await slot.start()
    print(server.template.pid, slot.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_the_template_and_its_slots_die_with_the_daemon_even_by_kill_9() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 20)
        template, slot = (int(pid) for pid in line.split())
        assert not gone(template) and not gone(slot)
        owner.kill()
        owner.wait()
        await eventually(lambda: gone(template) and gone(slot), timeout=5)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


ORPHANED = """
import asyncio, ctypes, os, signal
from pathlib import Path
from truba.daemon.forkserver import ForkServer
from truba.daemon.slot_process import SlotProcess

PR_SET_CHILD_SUBREAPER = 36

def state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"

async def main():
    # Orphans now come here, as they come to PID 1 in a container without an init.
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    server = ForkServer(["tests.handlers.basic:square"])
    slot = SlotProcess(0, server)
    await slot.start()
    pid = slot.pid
    os.kill(server.template.pid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while state(pid) != "gone" and loop.time() < deadline:
        await asyncio.sleep(0.02)
    print(state(pid), flush=True)
    await slot.stop()
    await server.close()

asyncio.run(main())
"""


async def test_a_slot_orphaned_by_its_templates_death_is_reaped_by_a_daemon_that_inherits_it() -> None:
    # As PID 1 (or a subreaper) the daemon inherits a dead template's slots: unreaped, each
    # stayed a zombie for the daemon's life.
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", ORPHANED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "gone"
