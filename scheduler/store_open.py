"""Opening the configured store, and keeping the plan going while it is unavailable."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.model import Job
from truba.scheduler.store import JobStore, SqliteJobStore

log = logging.getLogger(__name__)

POSTGRESQL_SCHEMES: Final = ("postgresql://", "postgres://")
"""How a ``--store`` URL of a PostgreSQL database starts."""


def open_store(location: str | None, sqlite_path: Path, *, timeout: float) -> tuple[JobStore, str]:
    """The store at ``location`` (None: SQLite at ``sqlite_path``) and where it is, without a
    password, for logs.

    Raises:
        StoreUnavailable: the database cannot be reached, or psycopg is not installed.
        StoreTooNew: the store was written by a newer truba.
        ValueError: ``location`` is not a PostgreSQL URL.
    """
    if location is None:
        return SqliteJobStore(sqlite_path), str(sqlite_path)
    if not location.startswith(POSTGRESQL_SCHEMES):
        raise ValueError(f"store: must be a postgresql:// URL, got {location.split(':', 1)[0]!r}")
    try:
        from truba.scheduler.store_postgres import PostgresJobStore
    except ImportError as exc:
        raise StoreUnavailable(
            f"the postgresql store needs psycopg: pip install 'truba[postgresql]' ({exc})"
        ) from None
    store = PostgresJobStore(location, timeout=timeout)
    return store, store.url


def last_known(list_jobs: Callable[[], Sequence[Job]]) -> Callable[[], Sequence[Job]]:
    """``list_jobs``, answering the last list it returned while the store is unavailable.

    The assigner lists the runnable jobs at every plan; with this, a database that is briefly
    out costs a warning per plan instead of the plan: daemons keep the jobs they know.
    """
    known: Sequence[Job] = ()

    def jobs() -> Sequence[Job]:
        nonlocal known
        try:
            known = list_jobs()
        except StoreUnavailable as exc:
            log.warning("sched.store.stale_plan", extra={"error": str(exc), "jobs": len(known)})
        return known

    return jobs
