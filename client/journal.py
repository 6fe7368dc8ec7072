"""The client's journal: every task stays on disk from ``submit`` until its outcome is taken.

A broker's confirm only means one broker has the task; the end-to-end guarantee needs the client
to keep it until its outcome arrives (see DESIGN.md, "End to end"). The journal is built on the
pipes' disk buffer (:class:`~truba.pipes.spool_log.SpoolLog` and its fsync policies,
:mod:`truba.pipes.fsync`) and holds, in one directory per job::

    tasks/          one record per task: its id, its order key if it has one, and its
                    encoded message; forgotten when the application has taken the task's outcome
    confirmed/      one 8-byte record (the task record's seq) per task a broker confirmed,
                    written in batches (a frame's confirm confirms many); forgotten with the task
    withdrawn.json  tasks whose ``submit`` gave up before a broker took them (never sent)

After a crash, :meth:`Journal.open` recovers every task without an outcome: those no broker
confirmed are to be sent again at once, the confirmed ones are waited for (and sent again if
their broker is declared lost); the tasks with an order key come back with their keys, oldest
first with their messages (:meth:`Journal.take_keyed`), so that their chains are rebuilt
(:mod:`truba.client.key_order`, which keeps held tasks' messages in memory until they are sent).
``recorded`` counts every task ever submitted to the job,
across runs, exactly: the tasks log's seqs never go back.

Memory: per outstanding task, its id, two seqs and when it was submitted (``start``, this
process's monotonic clock, for the outcome latency; not written: a recovered task's is unknown);
payloads stay on disk and are read back only to be sent again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from truba.pipes.fsync import Committer, FsyncPolicy, check_policy
from truba.pipes.spool_log import SpoolError, SpoolLog

log = logging.getLogger(__name__)

SEGMENT_BYTES: Final = 64 * 1024 * 1024
_KEY: Final = struct.Struct("<H")
_KEYED: Final = 0x8000
"""Set in a task record's id length: the task has an order key (its length and bytes follow the id)."""
_SEQ: Final = struct.Struct("<Q")
WITHDRAWN_FILE: Final = "withdrawn.json"
_PENDING: Final = -1
"""A confirm mark not written yet (see :meth:`Journal.confirmed`)."""


@dataclass(slots=True)
class _Entry:
    seq: int
    """The task record's seq."""
    mark: int | None = None
    """The confirm record's seq (``_PENDING`` until written); None while no broker has
    confirmed the task."""
    start: float = 0.0
    """When it was submitted (monotonic; 0.0: unknown, recovered after a crash)."""


@final
class Journal:
    """One job's tasks on disk until their outcomes are taken. One owner per directory.

    Raises (from :meth:`open`):
        SpoolLocked: another client has this job's journal open.
        SpoolError: the directory cannot be read or written.
    """

    def __init__(self, directory: Path, tasks: SpoolLog, confirms: SpoolLog, fsync: FsyncPolicy) -> None:
        self.directory = directory
        self._tasks = tasks
        self._confirms = confirms
        self._commit = Committer(tasks, fsync)
        self._entries: dict[str, _Entry] = {}
        self._marking: list[str] = []
        """Tasks confirmed whose marks are not written yet."""
        self._withdrawn = 0
        self._closed = False
        self._keyed: list[tuple[str, str, bytes]] = []
        """The recovered tasks with an order key (id, key, message), oldest first, until taken."""

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, fsync: FsyncPolicy = "interval") -> Journal:
        """Opens (locks, recovers) the journal in ``directory``, creating it if missing."""
        path = Path(directory)
        durable = check_policy(fsync) != "never"
        tasks = SpoolLog.open(path / "tasks", durable=durable, segment_bytes=SEGMENT_BYTES)
        try:
            confirms = SpoolLog.open(path / "confirmed", durable=False, segment_bytes=SEGMENT_BYTES)
        except BaseException:
            tasks.close()
            raise
        journal = cls(path, tasks, confirms, fsync)
        try:
            journal._recover()
        except BaseException:
            journal.close_now()
            raise
        return journal

    # -- reading ---------------------------------------------------------------------------------

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def __len__(self) -> int:
        """Tasks without a taken outcome."""
        return len(self._entries)

    @property
    def recorded(self) -> int:
        """Tasks ever submitted to this job (every run of the client), withdrawn ones excepted."""
        return self._tasks.next_seq - self._withdrawn

    def outstanding(self) -> list[str]:
        """Ids of the tasks without a taken outcome, oldest first."""
        return list(self._entries)

    def unconfirmed(self) -> list[str]:
        """Ids of the outstanding tasks no broker has confirmed yet, oldest first."""
        return [task_id for task_id, entry in self._entries.items() if entry.mark is None]

    def load(self, task_ids: Iterable[str]) -> dict[str, bytes]:
        """The encoded messages of outstanding tasks, read back from disk.

        Raises:
            SpoolError: the disk could not be read.
        """
        seqs = [self._entries[t].seq for t in task_ids if t in self._entries]
        return dict(_split(record)[:2] for record in self._tasks.read(seqs).values())

    def take_keyed(self) -> list[tuple[str, str, bytes]]:
        """The recovered outstanding tasks that have an order key, ``(task id, key, encoded
        message)``, oldest first; once (the job's key chains are rebuilt from them)."""
        keyed, self._keyed = self._keyed, []
        return [task for task in keyed if task[0] in self._entries]

    # -- writing ---------------------------------------------------------------------------------

    async def record(self, task_id: str, data: bytes, key: str | None = None, start: float = 0.0) -> None:
        """Writes a new task (with its order ``key``, if any) before it is sent; returns when it
        is as durable as the fsync policy says. ``start``: when it counts as submitted, for its
        outcome latency (:meth:`started`).

        Raises:
            ValueError: ``task_id`` is already outstanding.
            SpoolFull, SpoolError: it could not be written (the task must not be sent).
        """
        if task_id in self._entries:
            raise ValueError(f"task {task_id} is already in the journal")
        name = task_id.encode()
        if key is None:
            head = _KEY.pack(len(name)) + name
        else:
            ordered = key.encode()
            head = _KEY.pack(len(name) | _KEYED) + name + _KEY.pack(len(ordered)) + ordered
        seq = self._tasks.append(head, data)  # no copy of the payload to join them
        self._entries[task_id] = _Entry(seq, None, start)
        await self._commit.commit()

    def started(self, task_id: str) -> float:
        """When the outstanding task counts as submitted (0.0: unknown, or not outstanding)."""
        entry = self._entries.get(task_id)
        return 0.0 if entry is None else entry.start

    def confirmed(self, task_id: str) -> None:
        """A broker confirmed the task: after a crash it is waited for, not sent again.

        The mark is written soon after, with the marks of every task confirmed meanwhile (one
        write: a frame's confirm confirms all its tasks at once), or by :meth:`flush`. A mark
        not written (a crash first, or a disk error) only costs a duplicate after a crash.
        """
        self.confirmed_many((task_id,))

    def confirmed_many(self, task_ids: Iterable[str]) -> None:
        """:meth:`confirmed` for each of ``task_ids`` (a frame's tasks share one confirm)."""
        if self._closed:
            return
        entries, marking = self._entries, self._marking
        was_empty = not marking
        for task_id in task_ids:
            entry = entries.get(task_id)
            if entry is not None and entry.mark is None:
                entry.mark = _PENDING
                marking.append(task_id)
        if was_empty and marking:
            try:
                asyncio.get_running_loop().call_soon(self._write_marks)
            except RuntimeError:  # no event loop: write them now
                self._write_marks()

    def _write_marks(self) -> None:
        """Writes the pending confirm marks (of the tasks still outstanding), in one write."""
        marking, self._marking = self._marking, []
        entries = [
            entry
            for task_id in dict.fromkeys(marking)
            if (entry := self._entries.get(task_id)) is not None and entry.mark == _PENDING
        ]
        if not entries or self._closed:
            return
        try:
            seqs = self._confirms.append_many([_SEQ.pack(entry.seq) for entry in entries])
        except SpoolError as exc:
            log.warning("client.journal.mark_failed", extra={"tasks": len(entries), "error": str(exc)})
            for entry in entries:
                entry.mark = None
            return
        for entry, seq in zip(entries, seqs, strict=True):
            entry.mark = seq

    def unmark(self, task_ids: Iterable[str]) -> None:
        """These tasks are to be sent again (their broker was lost): until confirmed anew, a
        crash sends them again too."""
        for task_id in task_ids:
            entry = self._entries.get(task_id)
            if entry is not None and entry.mark is not None:
                if entry.mark != _PENDING:
                    self._confirms.forget(entry.mark)
                entry.mark = None
        self._confirms.flush_forgets()

    def settle(self, task_id: str) -> bool:
        """The application took the task's outcome: forget the task. False if it was not
        outstanding (a duplicate outcome, or a task of another run already settled)."""
        entry = self._entries.pop(task_id, None)
        if entry is None:
            return False
        self._tasks.forget(entry.seq)
        if entry.mark is not None and entry.mark != _PENDING:
            self._confirms.forget(entry.mark)
        return True

    def flush(self) -> None:
        """Writes the pending confirm marks, then the forget marks of settled tasks (one write
        per segment; no fsync: a lost mark costs at most a duplicate, dropped by task id)."""
        if self._closed:
            return
        self._write_marks()
        self._tasks.flush_forgets()
        self._confirms.flush_forgets()

    def withdraw(self, task_id: str) -> None:
        """The task's ``submit`` gave up before any broker took it: it never counts as submitted.

        Raises:
            SpoolError: the withdrawal could not be written (the task then stays outstanding).
        """
        entry = self._entries.get(task_id)
        if entry is None:
            return
        self._save_withdrawn(self._withdrawn + 1, [task_id])
        self._withdrawn += 1
        self.settle(task_id)
        self.flush()

    async def close(self) -> None:
        """Waits for a pending fsync, writes forget marks and releases the directory; idempotent."""
        if self._closed:
            return
        try:
            await self._commit.drain()
        finally:
            self.close_now()

    def close_now(self) -> None:
        """Like :meth:`close`, without waiting for a pending fsync."""
        if self._closed:
            return
        self._write_marks()
        self._closed = True
        self._tasks.close()
        self._confirms.close()

    # -- recovery --------------------------------------------------------------------------------

    def _recover(self) -> None:
        marks = {_SEQ.unpack(record)[0]: seq for seq, record in self._confirms.recovered}
        self._confirms.recovered = []
        withdrawn, pending_withdrawals = self._load_withdrawn()
        self._withdrawn = withdrawn
        for seq, record in self._tasks.recovered:
            task_id, data, key = _split(record)
            if task_id in pending_withdrawals:
                self._tasks.forget(seq)
                continue
            self._entries[task_id] = _Entry(seq, marks.pop(seq, None))
            if key is not None:
                self._keyed.append((task_id, key, data))
        self._tasks.recovered = []
        for orphan in marks.values():  # its task was settled, its own forget mark lost
            self._confirms.forget(orphan)
        if pending_withdrawals:
            self._save_withdrawn(withdrawn, [])
        self.flush()
        log.info(
            "client.journal.opened",
            extra={
                "directory": str(self.directory),
                "outstanding": len(self._entries),
                "unconfirmed": len(self.unconfirmed()),
                "recorded": self.recorded,
                "keyed": len(self._keyed),
            },
        )

    def _load_withdrawn(self) -> tuple[int, set[str]]:
        try:
            data = json.loads((self.directory / WITHDRAWN_FILE).read_text())
        except FileNotFoundError:
            return 0, set()
        except (OSError, ValueError) as exc:
            raise SpoolError(f"journal {self.directory}: {WITHDRAWN_FILE} is unreadable: {exc}") from exc
        return int(data["count"]), set(data["pending"])

    def _save_withdrawn(self, count: int, pending: list[str]) -> None:
        path = self.directory / WITHDRAWN_FILE
        scratch = path.with_suffix(".tmp")
        try:
            with open(scratch, "w") as file:
                json.dump({"count": count, "pending": pending}, file)
                file.flush()
                os.fsync(file.fileno())
            scratch.replace(path)
        except OSError as exc:
            raise SpoolError(f"journal {self.directory}: cannot write {WITHDRAWN_FILE}: {exc}") from exc


def _split(record: bytes) -> tuple[str, bytes, str | None]:
    """A task record's id, encoded message and order key (None: it has none)."""
    (size,) = _KEY.unpack_from(record)
    if not size & _KEYED:
        end = _KEY.size + size
        return record[_KEY.size : end].decode(), record[end:], None
    end = _KEY.size + (size & ~_KEYED)
    task_id = record[_KEY.size : end].decode()
    (key_size,) = _KEY.unpack_from(record, end)
    key_end = end + _KEY.size + key_size
    return task_id, record[key_end:], record[end + _KEY.size : key_end].decode()


@final
class MemoryJournal:
    """The journal's interface with nothing on disk (``Client(journal=False)``): tasks are kept
    until their outcome while this process lives; a crash loses the job's unfinished tasks."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self._entries: dict[str, tuple[bytes, bool, float]] = {}
        self._recorded = 0

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def recorded(self) -> int:
        return self._recorded

    def outstanding(self) -> list[str]:
        return list(self._entries)

    def unconfirmed(self) -> list[str]:
        return [task_id for task_id, (_, confirmed, _) in self._entries.items() if not confirmed]

    def load(self, task_ids: Iterable[str]) -> dict[str, bytes]:
        return {t: self._entries[t][0] for t in task_ids if t in self._entries}

    def take_keyed(self) -> list[tuple[str, str, bytes]]:
        return []  # nothing to recover: the job cannot be resumed

    async def record(self, task_id: str, data: bytes, key: str | None = None, start: float = 0.0) -> None:
        if task_id in self._entries:
            raise ValueError(f"task {task_id} is already in the journal")
        self._entries[task_id] = (data, False, start)
        self._recorded += 1

    def started(self, task_id: str) -> float:
        entry = self._entries.get(task_id)
        return 0.0 if entry is None else entry[2]

    def confirmed(self, task_id: str) -> None:
        entry = self._entries.get(task_id)
        if entry is not None:
            self._entries[task_id] = (entry[0], True, entry[2])

    def confirmed_many(self, task_ids: Iterable[str]) -> None:
        entries = self._entries
        for task_id in task_ids:
            entry = entries.get(task_id)
            if entry is not None:
                entries[task_id] = (entry[0], True, entry[2])

    def unmark(self, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            entry = self._entries.get(task_id)
            if entry is not None:
                self._entries[task_id] = (entry[0], False, entry[2])

    def settle(self, task_id: str) -> bool:
        return self._entries.pop(task_id, None) is not None

    def flush(self) -> None:
        pass

    def withdraw(self, task_id: str) -> None:
        if self._entries.pop(task_id, None) is not None:
            self._recorded -= 1

    async def close(self) -> None:
        pass

    def close_now(self) -> None:
        pass


TaskJournal = Journal | MemoryJournal
"""What a job keeps its tasks in until their outcomes: on disk, or in memory only."""
