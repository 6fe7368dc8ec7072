from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from truba.scheduler.model import Job, JobSettings, JobState, Preemption, QueueType
from truba.scheduler.store import SCHEMA_VERSION, SqliteJobStore, settings_from_json, settings_json


def make_job(job_id: str, created_at: float, **changes: object) -> Job:
    job = Job(
        id=job_id, handler="examples.math:square", importance=2.5, state=JobState.OPEN, created_at=created_at
    )
    return replace(job, **changes)  # type: ignore[arg-type]


def test_a_job_reads_back_as_written(store: SqliteJobStore) -> None:
    job = make_job("a1", 10.0, name="squares", submitted=0, problem="")
    store.insert(job)
    assert store.get("a1") == job
    assert store.get("nope") is None


def test_jobs_survive_reopening_the_same_file(tmp_path: Path) -> None:
    # Given jobs in every state written by one store
    path = tmp_path / "jobs.sqlite3"
    first = SqliteJobStore(path)
    jobs = [
        make_job("j1", 1.0, name="one"),
        make_job("j2", 2.0, state=JobState.CLOSED, submitted=123, closed_at=3.5),
        make_job("j3", 3.0, state=JobState.FINISHED, submitted=7, closed_at=4.0, finished_at=5.0),
        make_job("j4", 4.0, state=JobState.CANCELLED, finished_at=6.0, problem="broker b1 down"),
    ]
    for job in jobs:
        first.insert(job)
    first.close()
    # When a new store opens the same file
    second = SqliteJobStore(path)
    # Then every job is back, unchanged
    assert list(second.list(include_done=True)) == jobs
    assert [j.id for j in second.list()] == ["j1", "j2"]
    second.close()


def test_the_store_uses_a_wal_journal(store: SqliteJobStore) -> None:
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()


def test_jobs_are_listed_oldest_first(store: SqliteJobStore) -> None:
    for job_id, created in [("c", 3.0), ("a", 1.0), ("b", 2.0)]:
        store.insert(make_job(job_id, created))
    assert [j.id for j in store.list()] == ["a", "b", "c"]


def test_update_replaces_a_job_and_unknown_ids_are_errors(store: SqliteJobStore) -> None:
    job = make_job("a", 1.0)
    store.insert(job)
    closed = replace(job, state=JobState.CLOSED, submitted=5, closed_at=2.0)
    store.update(closed)
    assert store.get("a") == closed
    with pytest.raises(KeyError):
        store.insert(job)
    with pytest.raises(KeyError):
        store.update(make_job("zzz", 1.0))


def test_the_stale_ledger_follows_reserve_insert_and_end(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path)
    # A reservation is stale until its job is stored
    store.reserve("a")
    store.reserve("b")
    assert list(store.stale()) == ["a", "b"]
    store.insert(make_job("a", 1.0))
    assert list(store.stale()) == ["b"]
    # Ending a job with delete_queues puts it back, in the same transaction
    store.update(replace(make_job("a", 1.0), state=JobState.FINISHED, finished_at=2.0), delete_queues=True)
    assert set(store.stale()) == {"a", "b"}
    store.close()
    # The ledger survives a restart, and forget_stale empties it
    store = SqliteJobStore(path)
    assert set(store.stale()) == {"a", "b"}
    store.forget_stale("a")
    store.forget_stale("b")
    assert list(store.stale()) == []
    store.close()


def test_a_file_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    SqliteJobStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(RuntimeError, match="newer"):
        SqliteJobStore(path)


def test_close_is_idempotent(store: SqliteJobStore) -> None:
    store.close()
    store.close()


def test_settings_and_counters_are_stored(store: SqliteJobStore) -> None:
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
    store.save_counters({"j1": '{"submitted": 3}'})
    store.save_counters({"j1": '{"submitted": 4}', "j2": "{}"})
    assert store.load_counters() == {"j1": '{"submitted": 4}', "j2": "{}"}


def test_a_version_1_file_is_migrated_and_its_jobs_get_default_settings(tmp_path: Path) -> None:
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
        (version,) = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION
    finally:
        store.close()


def test_frames_off_is_stored_and_a_row_without_the_key_has_frames_on(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path)
    off = make_job(
        "off", 1.0, settings=JobSettings(frames=False, priorities=True, queue_type=QueueType.CLASSIC)
    )
    store.insert(off)
    store.insert(make_job("old", 2.0, settings=JobSettings(frames=False)))
    store.close()
    # A row written before the setting existed: its settings JSON has no "frames" key
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "UPDATE jobs SET settings=? WHERE id='old'", ('{"max_attempts": 4, "queue_type": "quorum"}',)
        )
    db.close()
    store = SqliteJobStore(path)
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
