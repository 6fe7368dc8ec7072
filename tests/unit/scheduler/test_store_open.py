"""Choosing the store (``--store``) and planning on while it is unavailable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.postgres import LocalPostgres
from tests.unit.scheduler.test_store import make_job
from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.model import Job
from truba.scheduler.server import SchedulerConfig
from truba.scheduler.store import SqliteJobStore
from truba.scheduler.store_open import last_known, open_store
from truba.scheduler.store_postgres import PostgresJobStore


def test_without_a_store_url_jobs_are_kept_in_sqlite_in_the_state_directory(tmp_path: Path) -> None:
    store, where = open_store(None, tmp_path / "scheduler.sqlite3", timeout=1.0)
    try:
        assert isinstance(store, SqliteJobStore) and where == str(tmp_path / "scheduler.sqlite3")
    finally:
        store.close()


def test_a_postgresql_url_opens_the_postgresql_store(postgres_server: LocalPostgres, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    store, where = open_store(url, tmp_path / "unused.sqlite3", timeout=2.0)
    try:
        assert isinstance(store, PostgresJobStore) and where == url
        assert not (tmp_path / "unused.sqlite3").exists()
    finally:
        store.close()


def test_a_store_url_of_another_kind_is_refused_before_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="store: must be a postgresql:// URL, got 'mysql'"):
        SchedulerConfig(brokers=["amqp://x/"], state_dir=tmp_path, store="mysql://u@h/db")
    with pytest.raises(ValueError, match="store_timeout"):
        SchedulerConfig(brokers=["amqp://x/"], state_dir=tmp_path, store_timeout=0)
    with pytest.raises(ValueError, match="mysql"):
        open_store("mysql://u@h/db", tmp_path / "x", timeout=1.0)


def test_the_plan_keeps_the_last_known_jobs_while_the_store_is_unavailable() -> None:
    answers: list[Sequence[Job] | Exception] = [
        [make_job("a", 1.0)],
        StoreUnavailable("the store postgresql://db/jobs failed: connection lost"),
        [make_job("a", 1.0), make_job("b", 2.0)],
    ]

    def list_jobs() -> Sequence[Job]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    jobs = last_known(list_jobs)
    assert [j.id for j in jobs()] == ["a"]
    assert [j.id for j in jobs()] == ["a"]  # the store is out: the jobs known
    assert [j.id for j in jobs()] == ["a", "b"]
