"""Fixtures of the scheduler's unit tests (the fakes themselves are in fakes.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.postgres import LocalPostgres
from tests.unit.scheduler.fakes import FakeCluster, ManualClock, make_fake_cluster, no_sleep
from truba.backoff import Backoff
from truba.scheduler.assigner import Assigner
from truba.scheduler.janitor import QueueJanitor
from truba.scheduler.lifecycle import JobLifecycle
from truba.scheduler.registry import DaemonRegistry
from truba.scheduler.store import JobStore, SqliteJobStore
from truba.scheduler.store_postgres import PostgresJobStore
from truba.scheduler.view import ClusterView


@pytest.fixture
def cluster() -> FakeCluster:
    return make_fake_cluster()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteJobStore]:
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    yield store
    store.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@dataclass
class Scheduled:
    """A job lifecycle over fake brokers (dead letters deleted with a job) and its read model."""

    jobs: JobLifecycle
    view: ClusterView


@pytest.fixture
async def scheduled(
    cluster: FakeCluster, store: SqliteJobStore, clock: ManualClock
) -> AsyncIterator[Scheduled]:
    assigner = Assigner(DaemonRegistry(), store.list, heartbeat_interval=1.0, clock=clock, event_delay=0)
    janitor = QueueJanitor(cluster.brokers, store, backoff=Backoff(attempts=None, sleep=no_sleep))
    jobs = JobLifecycle(store, cluster.brokers, janitor, assigner, clock=clock, delete_wait=1.0, keep_dead=0)
    yield Scheduled(jobs, ClusterView(jobs, assigner))
    await janitor.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """One PostgreSQL server for the session (each test takes a database of its own)."""
    server = LocalPostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@dataclass
class StoreBackend:
    """One store database: ``open()`` opens a store on it (again and again), ``sql()`` runs a
    raw statement on it (committed) and returns the rows."""

    name: str
    open: Callable[[], JobStore]
    sql: Callable[[str], list[tuple[Any, ...]]]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StoreBackend:
    """The same database behind each store kind: the contract suite runs on both."""
    if request.param == "sqlite":
        path = tmp_path / "jobs.sqlite3"

        def sqlite_sql(statement: str) -> list[tuple[Any, ...]]:
            db = sqlite3.connect(path)
            try:
                with db:
                    return db.execute(statement).fetchall()
            finally:
                db.close()

        return StoreBackend("sqlite", lambda: SqliteJobStore(path), sqlite_sql)
    server: LocalPostgres = request.getfixturevalue("postgres_server")
    url = server.create_database()

    def postgres_sql(statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.execute(statement.encode())
            return cursor.fetchall() if cursor.description else []

    return StoreBackend("postgresql", lambda: PostgresJobStore(url), postgres_sql)
