"""Fixtures of the scheduler's unit tests (the fakes themselves are in fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.scheduler.fakes import FakeCluster, ManualClock, make_fake_cluster
from truba.scheduler.store import SqliteJobStore


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
