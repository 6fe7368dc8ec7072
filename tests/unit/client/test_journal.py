"""The client's journal: tasks stay on disk until their outcome, across crashes and runs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from truba.client.journal import Journal, MemoryJournal
from truba.pipes.spool_log import SpoolLocked


def crash(journal: Journal) -> None:
    """What kill -9 leaves: the files as written, no close (the lock goes with the process)."""
    journal._tasks._closed = True
    journal._confirms._closed = True
    journal._tasks.flush_forgets()
    journal._confirms.flush_forgets()
    for log in (journal._tasks, journal._confirms):
        for segment in log._segments:
            for fd in (segment.fd, segment.ack_fd):
                if fd is not None:
                    os.close(fd)
        if log._lock_fd is not None:
            os.close(log._lock_fd)


async def test_a_task_stays_until_settled_and_confirmed_ones_are_not_sent_again(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync="always")
    for i in range(5):
        await journal.record(f"t{i}", f"payload {i}".encode())
    journal.confirmed("t0")
    journal.confirmed("t1")
    journal.confirmed("t2")
    assert journal.settle("t0") and not journal.settle("t0")  # a duplicate outcome is told apart
    journal.flush()
    crash(journal)

    again = Journal.open(tmp_path / "j")
    assert again.outstanding() == ["t1", "t2", "t3", "t4"]
    assert again.unconfirmed() == ["t3", "t4"]  # sent again at resume; t1, t2 are awaited
    assert again.load(["t4", "t1", "t0"]) == {"t4": b"payload 4", "t1": b"payload 1"}
    assert again.recorded == 5 and len(again) == 4
    await again.close()


async def test_confirm_marks_are_written_together_once_the_loop_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    for i in range(6):
        await journal.record(f"t{i}", b"x")
    writes: list[int] = []
    append_many = journal._confirms.append_many

    def counting(records: Sequence[bytes]) -> list[int]:
        writes.append(len(records))
        return append_many(records)

    monkeypatch.setattr(journal._confirms, "append_many", counting)
    for i in range(5):  # a frame's confirm confirms all its tasks at once
        journal.confirmed(f"t{i}")
    assert journal.unconfirmed() == ["t5"] and writes == []  # confirmed now, on disk soon
    journal.settle("t4")  # its outcome came first: its mark is never written
    await asyncio.sleep(0)
    assert writes == [4]
    journal.confirmed("t5")
    journal.flush()  # writes what is pending at once
    assert writes == [4, 1]
    crash(journal)
    again = Journal.open(tmp_path / "j")
    assert again.outstanding() == ["t0", "t1", "t2", "t3", "t5"] and again.unconfirmed() == []
    await again.close()


async def test_a_frames_tasks_are_confirmed_at_once_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    for i in range(5):
        await journal.record(f"t{i}", b"x")
    journal.confirmed("t0")
    await asyncio.sleep(0)
    writes: list[int] = []
    append_many = journal._confirms.append_many

    def counting(records: Sequence[bytes]) -> list[int]:
        writes.append(len(records))
        return append_many(records)

    monkeypatch.setattr(journal._confirms, "append_many", counting)
    # t0 confirmed already, "gone" never recorded: neither gets a second mark
    journal.confirmed_many(["t0", "t1", "gone", "t2", "t3"])
    assert journal.unconfirmed() == ["t4"] and writes == []
    await asyncio.sleep(0)
    assert writes == [3]
    journal.confirmed_many([])  # nothing to mark: no write scheduled
    await asyncio.sleep(0)
    assert writes == [3]
    crash(journal)
    again = Journal.open(tmp_path / "j")
    assert again.outstanding() == ["t0", "t1", "t2", "t3", "t4"] and again.unconfirmed() == ["t4"]
    await again.close()


def test_the_memory_journal_confirms_a_frames_tasks_at_once() -> None:
    journal = MemoryJournal()
    for i in range(3):
        asyncio.run(journal.record(f"t{i}", b"x"))
    journal.confirmed_many(["t0", "t2", "gone"])
    assert journal.unconfirmed() == ["t1"] and journal.outstanding() == ["t0", "t1", "t2"]


async def test_a_pending_mark_is_written_at_close_and_dropped_by_unmark(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    await journal.record("t0", b"x")
    await journal.record("t1", b"y")
    journal.confirmed("t0")
    journal.confirmed("t1")
    journal.unmark(["t1"])  # its broker was lost before the mark was written
    await journal.close()
    again = Journal.open(tmp_path / "j")
    assert again.unconfirmed() == ["t1"]
    await again.close()


async def test_recorded_counts_every_run_even_when_every_task_was_settled(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    for i in range(3):
        await journal.record(f"a{i}", b"x")
        journal.settle(f"a{i}")
    await journal.close()  # nothing outstanding: every segment is deleted
    journal = Journal.open(tmp_path / "j")
    assert journal.recorded == 3 and len(journal) == 0
    await journal.record("b0", b"y")
    journal.settle("b0")
    journal.flush()
    crash(journal)
    journal = Journal.open(tmp_path / "j")
    assert journal.recorded == 4
    await journal.close()


async def test_a_withdrawn_task_is_neither_counted_nor_sent_again(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    await journal.record("t0", b"kept")
    await journal.record("t1", b"withdrawn")
    journal.withdraw("t1")
    assert journal.recorded == 1 and journal.outstanding() == ["t0"]
    crash(journal)
    journal = Journal.open(tmp_path / "j")
    assert journal.recorded == 1 and journal.outstanding() == ["t0"]
    await journal.close()


async def test_unmarked_tasks_are_sent_again_after_a_crash(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync="never")
    await journal.record("t0", b"x")
    journal.confirmed("t0")
    journal.unmark(["t0"])  # its broker was lost: it is on its way again
    crash(journal)
    journal = Journal.open(tmp_path / "j")
    assert journal.unconfirmed() == ["t0"]
    await journal.close()


async def test_one_owner_per_journal(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j")
    with pytest.raises(SpoolLocked):
        Journal.open(tmp_path / "j")
    await journal.record("t", b"x")
    with pytest.raises(ValueError, match="already"):
        await journal.record("t", b"x")
    await journal.close()
    await journal.close()  # idempotent
    Journal.open(tmp_path / "j").close_now()


async def test_memory_journal_has_the_same_verbs() -> None:
    journal = MemoryJournal()
    await journal.record("t0", b"a")
    await journal.record("t1", b"b")
    journal.confirmed("t0")
    assert journal.unconfirmed() == ["t1"] and journal.load(["t0"]) == {"t0": b"a"}
    journal.withdraw("t1")
    assert journal.recorded == 1 and journal.settle("t0") and len(journal) == 0
