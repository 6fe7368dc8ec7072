"""A sending process killed -9 mid-stream: restarted on the same spool, it resends what was not confirmed.

The child (``spool_sender_proc.py``) sends numbered messages through ``spool(fsync=...)`` over
a real RabbitSender and reports each message the spool accepted (``spooled i``) and each confirm
(``confirmed i``). Killed with SIGKILL mid-stream, then restarted on the same spool directory to
replay only, it must leave every accepted message in the queue at least once, and duplicate only
messages it replayed, none whose confirm it had seen.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from truba.pipes.broker import QueueSpec
from truba.pipes.rabbit import RabbitConnection

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("spool_sender_proc.py")
COUNT = 5000
KILL_AFTER = 1000


@dataclass
class ChildOutput:
    """What a child reported on stdout, by kind of line."""

    spooled: list[int] = field(default_factory=list)
    confirmed: set[int] = field(default_factory=set)
    held: list[int] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    enough: asyncio.Event = field(default_factory=asyncio.Event)
    kill_after: int | None = None

    def add(self, line: str) -> None:
        kind, _, value = line.partition(" ")
        if kind == "spooled":
            self.spooled.append(int(value))
            if self.kill_after is not None and len(self.spooled) >= self.kill_after:
                self.enough.set()
        elif kind == "confirmed":
            self.confirmed.add(int(value))
        elif kind == "held":
            self.held.append(int(value))
        else:
            self.other.append(line)


async def run_child(
    url: str, queue: str, directory: Path, count: int, fsync: str, *, kill_after: int | None = None
) -> tuple[ChildOutput, int]:
    """Runs the child to its end, or kills it -9 once it has spooled ``kill_after`` messages."""
    output = ChildOutput(kill_after=kill_after)
    argv = [sys.executable, str(CHILD), url, queue, str(directory), str(count), fsync]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None

    async def read() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            output.add(raw.decode().strip())

    reader = asyncio.create_task(read())
    stderr = asyncio.create_task(process.stderr.read())
    try:
        if kill_after is not None:
            await asyncio.wait_for(output.enough.wait(), 60)
            process.kill()
        code = await asyncio.wait_for(process.wait(), 60)
        await reader
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    errors = (await stderr).decode()
    if kill_after is None:
        assert code == 0, errors
    return output, code


async def drain(connection: RabbitConnection, queue: str) -> collections.Counter[int]:
    """Consumes (and acks) everything in ``queue``; how many times each number arrived."""
    counts: collections.Counter[int] = collections.Counter()
    listener = await connection.listener(queue, prefetch=500)
    try:
        while (delivery := await listener.get(3.0)) is not None:
            counts[int(delivery.message)] += 1
            await delivery.ack()
    finally:
        await listener.close()
    return counts


@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
async def test_a_sender_killed_mid_stream_resends_what_was_not_confirmed_after_restart(
    rabbit_nodes: list[object], request: pytest.FixtureRequest, tmp_path: Path, fsync: str
) -> None:
    url: str = rabbit_nodes[0].url  # type: ignore[attr-defined]
    queue = f"truba.test.spool_crash.{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "outbox"
    connection = await RabbitConnection.open(url, name=request.node.nodeid, heartbeat=5)
    await connection.declare(QueueSpec(queue, "quorum"))
    try:
        # Given a process sending 5000 messages through the spool, killed -9 mid-stream
        first, code = await run_child(url, queue, directory, COUNT, fsync, kill_after=KILL_AFTER)
        accepted = len(first.spooled)
        assert code == -9 and first.spooled == list(range(accepted))
        assert KILL_AFTER <= accepted < COUNT, "the child must die mid-stream"

        # When it restarts on the same spool and only replays
        second, _ = await run_child(url, queue, directory, 0, fsync)
        held = set(second.held)
        assert second.held == sorted(second.held)  # replayed oldest first
        assert f"replayed {len(held)}" in second.other
        assert f"done confirmed={len(held)} held=0" in second.other
        assert second.confirmed == held

        # Then every accepted message is in the queue; duplicates are replays of unconfirmed ones
        counts = await drain(connection, queue)
        lost = [n for n in range(accepted) if counts[n] == 0]
        duplicated = {n for n, seen in counts.items() if seen > 1}
        print(
            f"spool crash ({fsync}): accepted={accepted} confirmed_before_kill={len(first.confirmed)} "
            f"held_after_kill={len(held)} in_queue={sum(counts.values())} distinct={len(counts)} "
            f"duplicated={len(duplicated)} lost={len(lost)}"
        )
        assert lost == []
        assert set(counts) <= set(range(accepted + 1))  # +1: sent, killed before "spooled" printed
        assert max(counts.values()) <= 2
        assert duplicated <= held  # only a replay duplicates
        assert not duplicated & first.confirmed  # never a message whose confirm was seen
        assert not held & first.confirmed  # a seen confirm is forgotten before a crash
        # Not confirmed as far as the child saw, yet not held: confirmed and forgotten in the
        # instant before the kill, so in the queue once (checked by ``lost`` above).
        late = (set(first.spooled) - first.confirmed) - held
        print(f"spool crash: confirmed but not reported before the kill: {len(late)}")
        assert list(directory.glob("*.seg")) == []  # all confirmed now: compacted away
    finally:
        await connection.delete(queue)
        await connection.close()
