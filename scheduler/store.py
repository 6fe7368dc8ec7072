"""Where the scheduler keeps its jobs: the :class:`JobStore` interface and its SQLite implementation.

Besides the jobs, a store keeps a ledger of *stale queues*: job ids whose queues may still exist
on some broker although no live job owns them. An id enters the ledger before its queues are
declared (:meth:`JobStore.reserve`) or in the same transaction that ends its job
(:meth:`JobStore.update` with ``delete_queues``), and leaves it only once every broker has
deleted them (:meth:`JobStore.forget_stale`). A crash at any point therefore leaves the ledger
naming every queue that may be left behind, and a restarted scheduler deletes them.

A job that ends may keep its dead-letter queue for a while (its given-up and poison tasks stay
inspectable): the same transaction that ends it records until when (:meth:`JobStore.update`
with ``keep_dead_until``), the janitor leaves that queue alone while the deletion of the others
runs, and deletes it once the time is past (:meth:`JobStore.dead_kept`,
:meth:`JobStore.forget_dead`); being in the store, the deadline survives a restart.

The store is synchronous: each call is one short transaction on the event loop's thread, so the
scheduler's read-modify-write sequences need no locks. :class:`SqliteJobStore` (here) is the
embedded default; :class:`~truba.scheduler.store_postgres.PostgresJobStore` keeps the same
contract on a PostgreSQL server, with every call bounded by its timeouts. Both apply the
numbered steps of :mod:`~truba.scheduler.store_schema` at start.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, final

from truba.scheduler.model import Job, JobSettings, JobState, Preemption, QueueType
from truba.scheduler.schedule_store import ScheduleStore, Tx
from truba.scheduler.store_schema import SCHEMA_VERSION as SCHEMA_VERSION
from truba.scheduler.store_schema import VERSION_TABLE, pending

JOB_COLUMNS: Final = (
    "id, name, handler, importance, state, submitted, created_at, closed_at, finished_at, problem, settings"
)
RUNNABLE_STATES: Final = (JobState.OPEN.value, JobState.CLOSED.value)
T = TypeVar("T")


class JobStore(Protocol):
    """Durable jobs plus the stale-queue ledger. Jobs are listed oldest first.

    Any call may raise :class:`~truba.scheduler.errors.StoreUnavailable` when the database behind
    the store fails or passes its timeout (PostgreSQL); the call had no effect unless the
    connection broke during its commit.
    """

    @property
    def schedules(self) -> ScheduleStore:
        """The periodic schedules and their runs, in the same database."""

    def reserve(self, job_id: str) -> None:
        """Records that queues of ``job_id`` may be declared from now on (a stale-ledger entry)."""

    def insert(self, job: Job) -> None:
        """Stores a new job and removes its reservation, atomically.

        Raises:
            KeyError: a job with that id exists.
        """

    def update(self, job: Job, *, delete_queues: bool = False, keep_dead_until: float | None = None) -> None:
        """Replaces a stored job; with ``delete_queues`` its id enters the stale ledger too, and
        with ``keep_dead_until`` (Unix time) its dead-letter queue is kept until then.

        Raises:
            KeyError: no job with that id.
        """

    def get(self, job_id: str) -> Job | None:
        """The job, or None."""

    def list(self, *, include_done: bool = False) -> Sequence[Job]:
        """Runnable (open and closed) jobs, or every job with ``include_done``; oldest first."""

    def stale(self) -> Sequence[str]:
        """Job ids in the stale ledger, oldest entry first."""

    def forget_stale(self, job_id: str) -> None:
        """Removes ``job_id`` from the ledger: its queues are gone from every broker."""

    def dead_until(self, job_id: str) -> float | None:
        """Until when the ended job's dead-letter queue is kept (None: not kept, or deleted)."""

    def dead_kept(self) -> Sequence[tuple[str, float]]:
        """``(job_id, until)`` of every dead-letter queue kept, soonest deadline first."""

    def forget_dead(self, job_id: str) -> None:
        """The job's dead-letter queue is gone from every broker."""

    def save_counters(self, counters: Mapping[str, str]) -> None:
        """Stores each job's counters (an opaque JSON text per job id), replacing older ones."""

    def load_counters(self) -> dict[str, str]:
        """Every job's stored counters, by job id."""

    def claim_epoch(self, address: str) -> int:
        """Adds one to the leader epoch and returns it, for a scheduler that does not elect a
        leader (the only one on its store): daemons see the epoch grow at each of its starts."""

    def close(self) -> None:
        """Releases the store; idempotent."""


@final
class SqliteJobStore:
    """A :class:`JobStore` in one SQLite file (WAL journal, fsync on commit).

    Raises:
        StoreTooNew: the file was written by a newer truba.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            _migrate(self._db, str(self.path))
        except BaseException:
            self._db.close()
            raise
        self._closed = False
        self._schedules = ScheduleStore(_SqliteRunner(self._db))

    @property
    def schedules(self) -> ScheduleStore:
        return self._schedules

    def reserve(self, job_id: str) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO stale_queues (job_id, since) VALUES (?, ?)", (job_id, time.time())
            )

    def insert(self, job: Job) -> None:
        try:
            with self._db:
                self._db.execute(
                    f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", job_row(job)
                )
                self._db.execute("DELETE FROM stale_queues WHERE job_id = ?", (job.id,))
        except sqlite3.IntegrityError:
            raise KeyError(job.id) from None

    def update(self, job: Job, *, delete_queues: bool = False, keep_dead_until: float | None = None) -> None:
        with self._db:
            cursor = self._db.execute(
                "UPDATE jobs SET name=?, handler=?, importance=?, state=?, submitted=?, created_at=?,"
                " closed_at=?, finished_at=?, problem=?, settings=? WHERE id=?",
                (*job_row(job)[1:], job.id),
            )
            if cursor.rowcount != 1:
                raise KeyError(job.id)
            if delete_queues:
                self._db.execute(
                    "INSERT OR IGNORE INTO stale_queues (job_id, since) VALUES (?, ?)", (job.id, time.time())
                )
            if keep_dead_until is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO dead_queues (job_id, until) VALUES (?, ?)",
                    (job.id, keep_dead_until),
                )

    def get(self, job_id: str) -> Job | None:
        row = self._db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else row_job(row)

    def list(self, *, include_done: bool = False) -> Sequence[Job]:
        if include_done:
            rows = self._db.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY created_at, id")
        else:
            rows = self._db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN (?, ?) ORDER BY created_at, id",
                RUNNABLE_STATES,
            )
        return [row_job(row) for row in rows]

    def stale(self) -> Sequence[str]:
        return [
            job_id for (job_id,) in self._db.execute("SELECT job_id FROM stale_queues ORDER BY since, job_id")
        ]

    def forget_stale(self, job_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM stale_queues WHERE job_id = ?", (job_id,))

    def dead_until(self, job_id: str) -> float | None:
        row = self._db.execute("SELECT until FROM dead_queues WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else float(row[0])

    def dead_kept(self) -> Sequence[tuple[str, float]]:
        rows = self._db.execute("SELECT job_id, until FROM dead_queues ORDER BY until, job_id")
        return [(str(job_id), float(until)) for job_id, until in rows]

    def forget_dead(self, job_id: str) -> None:
        with self._db:
            self._db.execute("DELETE FROM dead_queues WHERE job_id = ?", (job_id,))

    def save_counters(self, counters: Mapping[str, str]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT INTO counters (job_id, data) VALUES (?, ?)"
                " ON CONFLICT (job_id) DO UPDATE SET data = excluded.data",
                counters.items(),
            )

    def load_counters(self) -> dict[str, str]:
        return {
            str(job_id): str(data) for job_id, data in self._db.execute("SELECT job_id, data FROM counters")
        }

    def claim_epoch(self, address: str) -> int:
        with self._db:
            self._db.execute("UPDATE leader SET epoch = epoch + 1, address = ? WHERE id = 1", (address,))
            (epoch,) = self._db.execute("SELECT epoch FROM leader WHERE id = 1").fetchone()
        return int(epoch)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()


@final
class _SqliteRunner:
    """The schedule store's :class:`~truba.scheduler.schedule_store.SqlRunner` on this file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, params).fetchall()

    def transaction(self, work: Callable[[Tx], T]) -> T:
        with self._db:
            return work(self)

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._db.execute(sql, params).rowcount


def _migrate(db: sqlite3.Connection, where: str) -> None:
    """Applies the pending schema steps in one transaction (see :mod:`~truba.scheduler.store_schema`).

    Files of trubas older than the ``schema_version`` table carry their version in ``PRAGMA
    user_version`` only; it is adopted as the first row. ``user_version`` is kept in step, so
    those older trubas still refuse a newer file.
    """
    db.execute("BEGIN IMMEDIATE")  # DDL joins it: the sqlite3 module only begins before DML
    try:
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE}"
            " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, about TEXT NOT NULL)"
        )
        (recorded,) = db.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}").fetchone()
        (legacy,) = db.execute("PRAGMA user_version").fetchone()
        current = max(recorded, legacy)
        steps = pending(current, where)
        if recorded == 0 and legacy:
            for version in range(1, legacy + 1):
                _record(db, version, "adopted from PRAGMA user_version")
        for step in steps:
            for statement in step.sqlite:
                db.execute(statement)
            _record(db, step.version, step.about)
        db.execute(f"PRAGMA user_version={steps[-1].version if steps else current}")
        db.commit()
    except BaseException:
        db.rollback()
        raise


def _record(db: sqlite3.Connection, version: int, about: str) -> None:
    db.execute(
        f"INSERT INTO {VERSION_TABLE} (version, applied_at, about) VALUES (?, ?, ?)",
        (version, time.time(), about),
    )


def job_row(job: Job) -> tuple[object, ...]:
    """``job`` as the values of :data:`JOB_COLUMNS`, in order."""
    return (
        job.id,
        job.name,
        job.handler,
        job.importance,
        job.state.value,
        job.submitted,
        job.created_at,
        job.closed_at,
        job.finished_at,
        job.problem,
        settings_json(job.settings),
    )


def row_job(row: Sequence[Any]) -> Job:
    """The inverse of :func:`job_row`: a job from the values of :data:`JOB_COLUMNS`, in order."""
    job_id, name, handler, importance, state, submitted, created, closed, finished, problem, settings = row
    return Job(
        id=str(job_id),
        name=str(name),
        handler=str(handler),
        importance=float(importance),
        state=JobState(state),
        submitted=int(submitted),
        created_at=float(created),
        closed_at=None if closed is None else float(closed),
        finished_at=None if finished is None else float(finished),
        problem=str(problem),
        settings=settings_from_json(str(settings)),
    )


def settings_json(settings: JobSettings) -> str:
    """``settings`` as a JSON object (enums by value), the form the store keeps."""
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return json.dumps({k: v.value if isinstance(v, enum.Enum) else v for k, v in fields.items()})


def settings_from_json(text: str) -> JobSettings:
    """The inverse of :func:`settings_json`; missing keys (older rows) take the defaults."""
    data = json.loads(text)
    defaults = JobSettings()
    return JobSettings(
        min_slots=int(data.get("min_slots", defaults.min_slots)),
        max_slots=int(data.get("max_slots", defaults.max_slots)),
        preemption=Preemption(data.get("preemption", defaults.preemption.value)),
        task_timeout=float(data.get("task_timeout", defaults.task_timeout)),
        max_attempts=int(data.get("max_attempts", defaults.max_attempts)),
        queue_type=QueueType(data.get("queue_type", defaults.queue_type.value)),
        priorities=bool(data.get("priorities", defaults.priorities)),
        frames=bool(data.get("frames", defaults.frames)),
        retry_on=tuple(str(name) for name in data.get("retry_on", defaults.retry_on)),
        backoff_initial=float(data.get("backoff_initial", defaults.backoff_initial)),
        backoff_max=float(data.get("backoff_max", defaults.backoff_max)),
        codec=str(data.get("codec", defaults.codec)),
        preemption_grace=float(data.get("preemption_grace", defaults.preemption_grace)),
    )
