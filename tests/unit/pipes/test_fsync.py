"""The ``interval`` fsync policy: a timer, not a task, syncs soon after a write; a drain syncs
what is still to come at once; a failed fsync fails the next commit."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from truba.pipes.fsync import SYNC_INTERVAL, Committer
from truba.pipes.spool_log import SpoolError, SpoolLog


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    fdatasync = os.fdatasync

    def recording(fd: int) -> None:
        fdatasync(fd)
        calls.append(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return calls


async def test_a_write_is_synced_soon_after_by_a_timer_not_a_task(tmp_path: Path, synced: list[int]) -> None:
    log = SpoolLog.open(tmp_path, durable=True, segment_bytes=1 << 20)
    log.append(b"first")  # creating the segment syncs it (durable)
    committer = Committer(log, "interval")
    synced.clear()
    tasks = len(asyncio.all_tasks())
    for i in range(5):
        log.append(b"record %d" % i)
        await committer.commit()  # at once
    assert len(asyncio.all_tasks()) == tasks and synced == []
    await asyncio.sleep(SYNC_INTERVAL + 0.2)
    assert len(synced) == 1  # one fsync for the burst
    await committer.drain()
    log.close()


async def test_a_drain_syncs_what_is_still_to_come_at_once(tmp_path: Path, synced: list[int]) -> None:
    log = SpoolLog.open(tmp_path, durable=True, segment_bytes=1 << 20)
    log.append(b"first")
    committer = Committer(log, "interval")
    synced.clear()
    log.append(b"second")
    await committer.commit()
    await asyncio.wait_for(committer.drain(), SYNC_INTERVAL / 2 + 1)
    assert len(synced) == 1
    log.close()


async def test_a_failed_fsync_fails_the_next_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SpoolLog.open(tmp_path, durable=True, segment_bytes=1 << 20)
    log.append(b"first")
    committer = Committer(log, "interval")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", failing)
    log.append(b"second")
    await committer.commit()
    await committer.drain()
    assert log.sync_error is not None
    with pytest.raises(SpoolError):
        await committer.commit()
    log.close()
