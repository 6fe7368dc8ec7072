"""The store contract: every test taking ``backend`` or ``store`` runs on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.scheduler.conftest import StoreBackend
from truba.scheduler import store_schema
from truba.scheduler.errors import StoreTooNew
from truba.scheduler.model import Job, JobSettings, JobState, Preemption, QueueType
from truba.scheduler.store import JobStore, SqliteJobStore, settings_from_json, settings_json
from truba.scheduler.store_schema import MIGRATIONS, SCHEMA_VERSION, Migration
from truba.scheduler.validate import MAX_SUBMITTED


def make_job(job_id: str, created_at: float, **changes: object) -> Job:
    job = Job(
        id=job_id, handler="examples.math:square", importance=2.5, state=JobState.OPEN, created_at=created_at
    )
    return replace(job, **changes)  # type: ignore[arg-type]


@pytest.fixture
def store(backend: StoreBackend) -> Iterator[JobStore]:
    store = backend.open()
    yield store
    store.close()


def test_a_job_reads_back_as_written(store: JobStore) -> None:
    job = make_job("a1", 10.0, name="squares", submitted=0, problem="")
    store.insert(job)
    assert store.get("a1") == job
    assert store.get("nope") is None


def test_jobs_survive_reopening_the_same_database(backend: StoreBackend) -> None:
    # Given jobs in every state written by one store
    first = backend.open()
    jobs = [
        make_job("j1", 1.0, name="one"),
        make_job("j2", 2.0, state=JobState.CLOSED, submitted=123, closed_at=3.5),
        make_job("j3", 3.0, state=JobState.FINISHED, submitted=7, closed_at=4.0, finished_at=5.0),
        make_job("j4", 4.0, state=JobState.CANCELLED, finished_at=6.0, problem="broker b1 down"),
    ]
    for job in jobs:
        first.insert(job)
    first.close()
    # When a new store opens the same database
    second = backend.open()
    # Then every job is back, unchanged
    assert list(second.list(include_done=True)) == jobs
    assert [j.id for j in second.list()] == ["j1", "j2"]
    second.close()


def test_the_sqlite_store_uses_a_wal_journal(tmp_path: Path) -> None:
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()
        store.close()


def test_jobs_are_listed_oldest_first_then_by_id_bytewise(store: JobStore) -> None:
    for job_id, created in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("B", 2.0), ("_", 2.0)]:
        store.insert(make_job(job_id, created))
    assert [j.id for j in store.list()] == ["a", "B", "_", "b", "c"]


def test_update_replaces_a_job_and_unknown_ids_are_errors(store: JobStore) -> None:
    job = make_job("a", 1.0)
    store.insert(job)
    closed = replace(job, state=JobState.CLOSED, submitted=5, closed_at=2.0)
    store.update(closed)
    assert store.get("a") == closed
    with pytest.raises(KeyError):
        store.insert(job)
    with pytest.raises(KeyError):
        store.update(make_job("zzz", 1.0))
    # The failed calls changed nothing, and the store still works after them
    assert store.get("a") == closed
    store.insert(make_job("b", 2.0))
    assert [j.id for j in store.list()] == ["a", "b"]


def test_the_largest_task_count_is_stored(store: JobStore) -> None:
    job = make_job("big", 1.0, state=JobState.CLOSED, submitted=MAX_SUBMITTED, closed_at=2.0)
    store.insert(job)
    assert store.get("big") == job


def test_the_stale_ledger_follows_reserve_insert_and_end(backend: StoreBackend) -> None:
    store = backend.open()
    # A reservation is stale until its job is stored
    store.reserve("a")
    store.reserve("b")
    store.reserve("b")  # reserving twice is one entry
    assert list(store.stale()) == ["a", "b"]
    store.insert(make_job("a", 1.0))
    assert list(store.stale()) == ["b"]
    # Ending a job with delete_queues puts it back, in the same transaction
    store.update(replace(make_job("a", 1.0), state=JobState.FINISHED, finished_at=2.0), delete_queues=True)
    assert set(store.stale()) == {"a", "b"}
    store.close()
    # The ledger survives a restart, and forget_stale empties it
    store = backend.open()
    assert set(store.stale()) == {"a", "b"}
    store.forget_stale("a")
    store.forget_stale("b")
    store.forget_stale("never")
    assert list(store.stale()) == []
    store.close()


def test_dead_letter_keep_deadlines_are_stored_with_the_end_and_survive_a_restart(
    backend: StoreBackend,
) -> None:
    store = backend.open()
    store.insert(make_job("a", 1.0))
    store.insert(make_job("b", 2.0))
    assert store.dead_until("a") is None and list(store.dead_kept()) == []
    ended = replace(make_job("a", 1.0), state=JobState.FINISHED, finished_at=3.0)
    store.update(ended, delete_queues=True, keep_dead_until=500.0)
    store.update(
        replace(make_job("b", 2.0), state=JobState.CANCELLED), delete_queues=True, keep_dead_until=100.0
    )
    store.update(ended, keep_dead_until=600.0)  # a later end moves the deadline
    store.close()
    store = backend.open()
    assert store.dead_until("a") == 600.0
    assert list(store.dead_kept()) == [("b", 100.0), ("a", 600.0)]
    store.forget_dead("b")
    assert list(store.dead_kept()) == [("a", 600.0)] and store.dead_until("b") is None
    store.close()


def test_an_update_of_an_unknown_job_leaves_the_stale_ledger_alone(store: JobStore) -> None:
    with pytest.raises(KeyError):
        store.update(make_job("ghost", 1.0, state=JobState.FINISHED), delete_queues=True)
    assert list(store.stale()) == []


def test_close_is_idempotent(store: JobStore) -> None:
    store.close()
    store.close()


def test_settings_and_counters_are_stored(store: JobStore) -> None:
    settings = JobSettings(
        min_slots=1,
        max_slots=8,
        preemption=Preemption.IMMEDIATE,
        task_timeout=12.5,
        max_attempts=5,
        queue_type=QueueType.CLASSIC,
    )
    job = Job(id="j1", handler="m:f", importance=1.0, state=JobState.OPEN, created_at=1.0, settings=settings)
    store.insert(job)
    assert store.get("j1") == job
    assert job.queues.kind == "classic"
    store.save_counters({})
    store.save_counters({"j1": '{"submitted": 3}'})
    store.save_counters({"j1": '{"submitted": 4}', "j2": "{}"})
    assert store.load_counters() == {"j1": '{"submitted": 4}', "j2": "{}"}


def test_frames_off_is_stored_and_a_row_without_the_key_has_frames_on(backend: StoreBackend) -> None:
    store = backend.open()
    off = make_job(
        "off", 1.0, settings=JobSettings(frames=False, priorities=True, queue_type=QueueType.CLASSIC)
    )
    store.insert(off)
    store.insert(make_job("old", 2.0, settings=JobSettings(frames=False)))
    store.close()
    # A row written before the setting existed: its settings JSON has no "frames" key
    backend.sql("""UPDATE jobs SET settings='{"max_attempts": 4, "queue_type": "quorum"}' WHERE id='old'""")
    store = backend.open()
    try:
        assert store.get("off") == off
        old = store.get("old")
        assert old is not None and old.settings == JobSettings(max_attempts=4, frames=True)
    finally:
        store.close()


def test_settings_json_round_trips_frames() -> None:
    for frames in (True, False):
        settings = JobSettings(frames=frames)
        assert settings_from_json(settings_json(settings)) == settings
    assert settings_from_json("{}").frames is True


def test_a_job_s_retry_settings_and_codec_survive_a_scheduler_restart() -> None:
    settings = JobSettings(
        retry_on=("TimeoutError", "a.b.Busy"), backoff_initial=0.5, backoff_max=9.0, codec="pickle"
    )
    assert settings_from_json(settings_json(settings)) == settings
    assert settings_from_json("{}") == JobSettings()  # rows of older schedulers take the defaults


# -- schema migrations ---------------------------------------------------------------------------


def test_migration_steps_are_numbered_from_one_without_gaps() -> None:
    assert [step.version for step in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert SCHEMA_VERSION == MIGRATIONS[-1].version
    assert all(step.sqlite and step.postgresql for step in MIGRATIONS)


def test_a_new_store_records_every_schema_step_once_and_reopening_changes_nothing(
    backend: StoreBackend,
) -> None:
    backend.open().close()
    versions = backend.sql("SELECT version, about FROM schema_version ORDER BY version")
    assert versions == [(step.version, step.about) for step in MIGRATIONS]
    backend.open().close()
    assert backend.sql("SELECT version, about FROM schema_version ORDER BY version") == versions


def test_a_database_from_a_newer_truba_is_refused_with_its_version(backend: StoreBackend) -> None:
    backend.open().close()
    backend.sql("INSERT INTO schema_version (version, applied_at, about) VALUES (99, 0, 'the future')")
    with pytest.raises(StoreTooNew, match=f"schema version 99 is newer than {SCHEMA_VERSION}"):
        backend.open()


def test_a_version_1_database_is_migrated_and_its_jobs_get_default_settings(backend: StoreBackend) -> None:
    # Given a database that a truba of schema version 1 wrote
    backend.sql(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL,"
        " about TEXT NOT NULL)"
    )
    first = MIGRATIONS[0]
    for statement in first.sqlite if backend.name == "sqlite" else first.postgresql:
        backend.sql(statement)
    backend.sql(f"INSERT INTO schema_version VALUES (1, 0, '{first.about}')")
    backend.sql("INSERT INTO jobs VALUES ('old1', '', 'm:f', 2.0, 'OPEN', 0, 5.0, NULL, NULL, '')")
    # When this truba opens it
    store = backend.open()
    try:
        # Then the job is there with default settings, and counters can be kept
        job = store.get("old1")
        assert job is not None and job.settings == JobSettings() and job.importance == 2.0
        assert store.load_counters() == {}
        store.save_counters({"old1": "{}"})
        assert backend.sql("SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    finally:
        store.close()


def test_a_failing_schema_step_leaves_the_database_as_it_was(
    backend: StoreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.open().close()
    broken = Migration(
        SCHEMA_VERSION + 1,
        "a step that fails half-way",
        sqlite=("CREATE TABLE half (x INTEGER)", "ALTER TABLE no_such_table ADD COLUMN y INTEGER"),
        postgresql=("CREATE TABLE half (x INTEGER)", "ALTER TABLE no_such_table ADD COLUMN y INTEGER"),
    )
    monkeypatch.setattr(store_schema, "MIGRATIONS", (*MIGRATIONS, broken))
    monkeypatch.setattr(store_schema, "SCHEMA_VERSION", broken.version)
    with pytest.raises(Exception, match="no_such_table"):
        backend.open()
    monkeypatch.undo()
    # Nothing of the failed step is left: the table it created is gone, the version unchanged
    assert backend.sql("SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    with pytest.raises(Exception, match="half"):
        backend.sql("SELECT * FROM half")
    backend.open().close()


def test_a_sqlite_file_of_a_truba_before_the_version_table_is_adopted_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, handler TEXT NOT NULL,
            importance REAL NOT NULL, state TEXT NOT NULL, submitted INTEGER NOT NULL,
            created_at REAL NOT NULL, closed_at REAL, finished_at REAL, problem TEXT NOT NULL);
        CREATE TABLE stale_queues (job_id TEXT PRIMARY KEY, since REAL NOT NULL);
        INSERT INTO jobs VALUES ('old1', '', 'm:f', 2.0, 'OPEN', 0, 5.0, NULL, NULL, '');
        PRAGMA user_version=1;
        """
    )
    db.close()
    store = SqliteJobStore(path)
    try:
        job = store.get("old1")
        assert job is not None and job.settings == JobSettings() and job.importance == 2.0
        assert store.load_counters() == {}
        db = sqlite3.connect(path)
        (version,) = db.execute("PRAGMA user_version").fetchone()
        rows = db.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        db.close()
        # user_version stays in step: trubas before the version table still refuse newer files
        assert version == SCHEMA_VERSION
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    finally:
        store.close()


def test_a_sqlite_file_whose_user_version_is_newer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    SqliteJobStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StoreTooNew, match="newer"):
        SqliteJobStore(path)
