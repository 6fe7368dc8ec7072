"""The store's schema as numbered migration steps, one list for SQLite and PostgreSQL alike.

A store records every step applied in its ``schema_version`` table (one row per step: version,
time, what it did). At start it applies the steps above its highest version, in order, in the
same transaction that records them, so a crash leaves either every step of the start or none;
starting again on an up-to-date store changes nothing. A store whose version is above
:data:`SCHEMA_VERSION` was written by a newer truba and is refused (:class:`StoreTooNew`).

To change the schema, append a :class:`Migration` with the next version and the statements of
each dialect; never edit a step that has shipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from truba.scheduler.errors import StoreTooNew


@dataclass(frozen=True)
class Migration:
    """One schema step: ``version`` is the schema it produces from ``version - 1``."""

    version: int
    about: str
    sqlite: Sequence[str]
    postgresql: Sequence[str]


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "jobs and the stale-queue ledger",
        sqlite=(
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL,"
            " handler TEXT NOT NULL, importance REAL NOT NULL, state TEXT NOT NULL,"
            " submitted INTEGER NOT NULL, created_at REAL NOT NULL, closed_at REAL, finished_at REAL,"
            " problem TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at)",
            "CREATE TABLE IF NOT EXISTS stale_queues (job_id TEXT PRIMARY KEY, since REAL NOT NULL)",
        ),
        # Ids sort bytewise (COLLATE "C") as in SQLite, whatever the database's locale.
        postgresql=(
            'CREATE TABLE jobs (id TEXT COLLATE "C" PRIMARY KEY, name TEXT NOT NULL,'
            " handler TEXT NOT NULL, importance DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,"
            " submitted BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
            " closed_at DOUBLE PRECISION, finished_at DOUBLE PRECISION, problem TEXT NOT NULL)",
            "CREATE INDEX jobs_by_state ON jobs (state, created_at)",
            'CREATE TABLE stale_queues (job_id TEXT COLLATE "C" PRIMARY KEY,'
            " since DOUBLE PRECISION NOT NULL)",
        ),
    ),
    Migration(
        2,
        "job settings, task counters",
        sqlite=(
            "ALTER TABLE jobs ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'",
            "CREATE TABLE IF NOT EXISTS counters (job_id TEXT PRIMARY KEY, data TEXT NOT NULL)",
        ),
        postgresql=(
            "ALTER TABLE jobs ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'",
            'CREATE TABLE counters (job_id TEXT COLLATE "C" PRIMARY KEY, data TEXT NOT NULL)',
        ),
    ),
    Migration(
        3,
        "dead-letter queues kept after their job ended",
        sqlite=("CREATE TABLE IF NOT EXISTS dead_queues (job_id TEXT PRIMARY KEY, until REAL NOT NULL)",),
        postgresql=(
            'CREATE TABLE dead_queues (job_id TEXT COLLATE "C" PRIMARY KEY, until DOUBLE PRECISION NOT NULL)',
        ),
    ),
    Migration(
        4,
        "periodic schedules and their last runs",
        sqlite=(
            "CREATE TABLE IF NOT EXISTS schedules (id TEXT PRIMARY KEY, name TEXT NOT NULL,"
            " handler TEXT NOT NULL, job_id TEXT NOT NULL, every REAL NOT NULL, cron TEXT NOT NULL,"
            " payload BLOB NOT NULL, deadline REAL NOT NULL, importance REAL NOT NULL,"
            " state TEXT NOT NULL, created_at REAL NOT NULL, next_due REAL NOT NULL,"
            " lease_until REAL NOT NULL, run_task TEXT NOT NULL, runs INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS schedule_runs (schedule_id TEXT NOT NULL, task_id TEXT NOT NULL,"
            " due REAL NOT NULL, started REAL NOT NULL, ended REAL NOT NULL, outcome TEXT NOT NULL,"
            " error TEXT NOT NULL, duration REAL NOT NULL, daemon_id TEXT NOT NULL,"
            " PRIMARY KEY (schedule_id, task_id))",
            "CREATE INDEX IF NOT EXISTS schedule_runs_by_start ON schedule_runs (schedule_id, started)",
        ),
        postgresql=(
            'CREATE TABLE schedules (id TEXT COLLATE "C" PRIMARY KEY, name TEXT NOT NULL,'
            " handler TEXT NOT NULL, job_id TEXT NOT NULL, every DOUBLE PRECISION NOT NULL,"
            " cron TEXT NOT NULL, payload BYTEA NOT NULL, deadline DOUBLE PRECISION NOT NULL,"
            " importance DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,"
            " created_at DOUBLE PRECISION NOT NULL, next_due DOUBLE PRECISION NOT NULL,"
            " lease_until DOUBLE PRECISION NOT NULL, run_task TEXT NOT NULL, runs BIGINT NOT NULL)",
            'CREATE TABLE schedule_runs (schedule_id TEXT COLLATE "C" NOT NULL,'
            ' task_id TEXT COLLATE "C" NOT NULL, due DOUBLE PRECISION NOT NULL,'
            " started DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION NOT NULL, outcome TEXT NOT NULL,"
            " error TEXT NOT NULL, duration DOUBLE PRECISION NOT NULL, daemon_id TEXT NOT NULL,"
            " PRIMARY KEY (schedule_id, task_id))",
            "CREATE INDEX schedule_runs_by_start ON schedule_runs (schedule_id, started)",
        ),
    ),
    Migration(
        5,
        "the leader lease and its epoch",
        # One row: who leads (a process's id), where (its advertised address), the epoch (one more
        # at every change of leader, and at every start of a scheduler that does not elect), and
        # until when (PostgreSQL: the database's clock; SQLite has one scheduler and no expiry).
        sqlite=(
            "CREATE TABLE IF NOT EXISTS leader (id INTEGER PRIMARY KEY CHECK (id = 1),"
            " holder TEXT NOT NULL, address TEXT NOT NULL, epoch INTEGER NOT NULL,"
            " expires_at REAL NOT NULL)",
            "INSERT OR IGNORE INTO leader (id, holder, address, epoch, expires_at) VALUES (1, '', '', 0, 0)",
        ),
        postgresql=(
            "CREATE TABLE leader (id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL,"
            " address TEXT NOT NULL, epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
            "INSERT INTO leader (id, holder, address, epoch, expires_at) VALUES (1, '', '', 0, '-infinity')",
        ),
    ),
)

SCHEMA_VERSION: Final = MIGRATIONS[-1].version
"""The schema this truba reads and writes."""

VERSION_TABLE: Final = "schema_version"


def pending(current: int, where: str) -> Sequence[Migration]:
    """The steps that bring a store at version ``current`` up to :data:`SCHEMA_VERSION`, in order.

    Raises:
        StoreTooNew: ``current`` is above :data:`SCHEMA_VERSION`; ``where`` names the store.
    """
    if current > SCHEMA_VERSION:
        raise StoreTooNew(
            f"{where}: schema version {current} is newer than {SCHEMA_VERSION}, the newest this truba"
            " knows; run a newer truba (or a fresh store)"
        )
    return [step for step in MIGRATIONS if step.version > current]
