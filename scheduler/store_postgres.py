"""A :class:`~truba.scheduler.store.JobStore` on a PostgreSQL server (psycopg 3, synchronous).

The contract is the SQLite store's, call for call: the scheduler calls the store from its event
loop, each call one short transaction, so its read-modify-write sequences need no locks. The
price is that a call blocks the loop while the database answers; every such wait is bounded:

- connecting: ``connect_timeout`` (whole seconds, at least 2: libpq's rule);
- each statement: ``statement_timeout`` and ``lock_timeout`` on the server;
- a network that stops answering mid-call: TCP keepalives and ``tcp_user_timeout``;
- a transaction left open by a dying client: ``idle_in_transaction_session_timeout``.

All are derived from one ``timeout`` (seconds); a ``postgresql://`` URL may set any of them
itself (``?connect_timeout=10``, ``?options=-c statement_timeout=2s``), and its values win. A
call that fails because of the database raises :class:`StoreUnavailable` (one line: what and
where); the broken connection is dropped and the next call connects again. A call whose
connection turns out dead before anything was sent on it (a restarted server) reconnects once
by itself.

Schema steps (:mod:`~truba.scheduler.store_schema`) are applied at start in one transaction
under an advisory lock, so schedulers starting together on one database migrate it once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar, final

import psycopg
import psycopg.conninfo
import psycopg.errors

from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.model import Job
from truba.scheduler.schedule_store import ScheduleStore, Tx
from truba.scheduler.store import JOB_COLUMNS, RUNNABLE_STATES, job_row, row_job
from truba.scheduler.store_schema import VERSION_TABLE, Migration, pending

log = logging.getLogger(__name__)

T = TypeVar("T")
Cursor = psycopg.Cursor[tuple[Any, ...]]

DEFAULT_TIMEOUT: Final = 5.0
"""Seconds: the bound on connecting and on each statement of a call."""
MIGRATION_TIMEOUT: Final = 60.0
"""Seconds each statement of a schema step may take (a step may rewrite a table)."""
MIGRATION_LOCK: Final = 0x7472756261  # "truba": pg_advisory_xact_lock key serialising migrations

_VALUES: Final = ",".join(["%s"] * len(JOB_COLUMNS.split(",")))


def redact_url(url: str) -> str:
    """``url`` without its password, for logs and error messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://?"
    user = f"{params['user']}@" if params.get("user") else ""
    host = str(params.get("host") or "")
    port = f":{params['port']}" if params.get("port") else ""
    dbname = params.get("dbname") or ""
    if host.startswith("/"):  # a unix socket folder
        return f"postgresql://{user}/{dbname}?host={host}{'&port=' + str(params['port']) if port else ''}"
    return f"postgresql://{user}{host}{port}/{dbname}"


def connect_params(url: str, timeout: float) -> dict[str, Any]:
    """psycopg's connection parameters for ``url``, with the bounds derived from ``timeout``.

    Raises:
        ValueError: ``url`` is not a valid PostgreSQL connection URL.
    """
    try:
        params: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"store: not a PostgreSQL URL: {' '.join(str(exc).split())}") from None
    millis = int(timeout * 1000)
    ours = (
        f"-c statement_timeout={millis} -c lock_timeout={millis}"
        f" -c idle_in_transaction_session_timeout={max(millis * 4, 10_000)}"
    )
    params["options"] = f"{ours} {params['options']}" if params.get("options") else ours
    params.setdefault("connect_timeout", max(2, math.ceil(timeout)))
    params.setdefault("application_name", "truba-scheduler")
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", max(1, math.ceil(timeout)))
    params.setdefault("keepalives_interval", 1)
    params.setdefault("keepalives_count", 3)
    params.setdefault("tcp_user_timeout", millis)
    return params


@final
class PostgresJobStore:
    """A :class:`~truba.scheduler.store.JobStore` in one PostgreSQL database.

    Args:
        url: ``postgresql://user[:password]@host[:port]/dbname[?param=value...]``.
        timeout: seconds; bounds connecting and each statement (see the module docstring).

    Raises:
        StoreUnavailable: the database cannot be reached (also from every later call).
        StoreTooNew: the database was written by a newer truba.
        ValueError: ``url`` is malformed.
    """

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = redact_url(url)
        self._params = connect_params(url, timeout)
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._closed = False
        self._fence: tuple[str, int] | None = None
        self._schedules = ScheduleStore(_PostgresRunner(self._call))
        try:
            self._write(self._migrate)
        except BaseException:
            self.close()
            raise

    @property
    def schedules(self) -> ScheduleStore:
        return self._schedules

    def reserve(self, job_id: str) -> None:
        self._write(lambda cur: _add_stale(cur, job_id))

    def insert(self, job: Job) -> None:
        def insert(cur: Cursor) -> None:
            try:
                cur.execute(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({_VALUES})", job_row(job))
            except psycopg.errors.UniqueViolation:
                raise KeyError(job.id) from None
            cur.execute("DELETE FROM stale_queues WHERE job_id = %s", (job.id,))

        self._write(insert)

    def update(self, job: Job, *, delete_queues: bool = False, keep_dead_until: float | None = None) -> None:
        def update(cur: Cursor) -> None:
            cur.execute(
                "UPDATE jobs SET name=%s, handler=%s, importance=%s, state=%s, submitted=%s,"
                " created_at=%s, closed_at=%s, finished_at=%s, problem=%s, settings=%s WHERE id=%s",
                (*job_row(job)[1:], job.id),
            )
            if cur.rowcount != 1:
                raise KeyError(job.id)
            if delete_queues:
                _add_stale(cur, job.id)
            if keep_dead_until is not None:
                cur.execute(
                    "INSERT INTO dead_queues (job_id, until) VALUES (%s, %s)"
                    " ON CONFLICT (job_id) DO UPDATE SET until = excluded.until",
                    (job.id, keep_dead_until),
                )

        self._write(update)

    def get(self, job_id: str) -> Job | None:
        def get(cur: Cursor) -> Job | None:
            row = cur.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone()
            return None if row is None else row_job(row)

        return self._read(get)

    def list(self, *, include_done: bool = False) -> Sequence[Job]:
        def list_jobs(cur: Cursor) -> Sequence[Job]:
            if include_done:
                cur.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY created_at, id")
            else:
                cur.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = ANY(%s) ORDER BY created_at, id",
                    (list(RUNNABLE_STATES),),
                )
            return [row_job(row) for row in cur]

        return self._read(list_jobs)

    def stale(self) -> Sequence[str]:
        def stale(cur: Cursor) -> Sequence[str]:
            cur.execute("SELECT job_id FROM stale_queues ORDER BY since, job_id")
            return [str(job_id) for (job_id,) in cur]

        return self._read(stale)

    def forget_stale(self, job_id: str) -> None:
        self._write(lambda cur: cur.execute("DELETE FROM stale_queues WHERE job_id = %s", (job_id,)))

    def dead_until(self, job_id: str) -> float | None:
        def until(cur: Cursor) -> float | None:
            row = cur.execute("SELECT until FROM dead_queues WHERE job_id = %s", (job_id,)).fetchone()
            return None if row is None else float(row[0])

        return self._read(until)

    def dead_kept(self) -> Sequence[tuple[str, float]]:
        def kept(cur: Cursor) -> Sequence[tuple[str, float]]:
            cur.execute("SELECT job_id, until FROM dead_queues ORDER BY until, job_id")
            return [(str(job_id), float(until)) for job_id, until in cur]

        return self._read(kept)

    def forget_dead(self, job_id: str) -> None:
        self._write(lambda cur: cur.execute("DELETE FROM dead_queues WHERE job_id = %s", (job_id,)))

    def save_counters(self, counters: Mapping[str, str]) -> None:
        if counters:
            self._write(
                lambda cur: cur.executemany(
                    "INSERT INTO counters (job_id, data) VALUES (%s, %s)"
                    " ON CONFLICT (job_id) DO UPDATE SET data = excluded.data",
                    list(counters.items()),
                )
            )

    def load_counters(self) -> dict[str, str]:
        def load(cur: Cursor) -> dict[str, str]:
            cur.execute("SELECT job_id, data FROM counters")
            return {str(job_id): str(data) for job_id, data in cur}

        return self._read(load)

    def fence_writes(self, holder: str, epoch: int) -> None:
        """From now on every write transaction first checks, under a share lock on the lease's
        row, that ``holder`` still holds the lease at ``epoch`` (else it fails with
        StoreUnavailable and changes nothing). The lock makes a standby's takeover wait for the
        transaction: no write of a former leader lands after the next one took over."""
        self._fence = (holder, epoch)

    def claim_epoch(self, address: str) -> int:
        def claim(cur: Cursor) -> int:
            row = cur.execute(
                "UPDATE leader SET epoch = epoch + 1, address = %s WHERE id = 1 RETURNING epoch", (address,)
            ).fetchone()
            assert row is not None  # schema step 5 inserted the row
            return int(row[0])

        epoch: int = self._call(claim, write=True)
        return epoch

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._drop()

    # -- connection and transactions -----------------------------------------------------------

    def _read(self, work: Callable[[Cursor], T]) -> T:
        """Runs ``work`` in autocommit (one statement, one round trip)."""
        return self._call(work, write=False)

    def _write(self, work: Callable[[Cursor], object]) -> None:
        """Runs ``work`` in one transaction."""
        self._call(work, write=True)

    def _call(self, work: Callable[[Cursor], T], *, write: bool) -> T:
        if self._closed:
            raise StoreUnavailable(f"the store {self.url} is closed")
        for attempt in (1, 2):
            conn = self._connection()
            begun = False
            try:
                if not write:
                    with conn.cursor() as cur:
                        begun = True
                        return work(cur)
                with conn.transaction(), conn.cursor() as cur:
                    begun = True  # BEGIN went through: from here a failure is not retried
                    if self._fence is not None:
                        _check_fence(cur, self._fence, self.url)
                    return work(cur)
            except psycopg.OperationalError as exc:
                broken = conn.broken or conn.closed
                if broken:
                    self._drop()
                # A kept connection found dead (e.g. the server restarted since the last call):
                # nothing of this call reached the server, so once more on a fresh connection.
                if broken and attempt == 1 and (not begun or not write):
                    log.warning("sched.store.reconnect", extra={"store": self.url, "error": _line(exc)})
                    continue
                raise StoreUnavailable(f"the store {self.url} failed: {_line(exc)}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            started = time.monotonic()
            try:
                self._conn = psycopg.connect(**self._params, autocommit=True)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"the store {self.url} is unreachable: {_line(exc)}") from exc
            log.info(
                "sched.store.connected",
                extra={"store": self.url, "seconds": round(time.monotonic() - started, 3)},
            )
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _migrate(self, cur: Cursor) -> None:
        cur.execute(f"SET LOCAL statement_timeout = {int(MIGRATION_TIMEOUT * 1000)}")
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER PRIMARY KEY,"
            " applied_at DOUBLE PRECISION NOT NULL, about TEXT NOT NULL)"
        )
        row = cur.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}").fetchone()
        steps: Sequence[Migration] = pending(int(row[0]) if row else 0, self.url)
        for step in steps:
            for statement in step.postgresql:
                cur.execute(statement)
            cur.execute(
                f"INSERT INTO {VERSION_TABLE} (version, applied_at, about) VALUES (%s, %s, %s)",
                (step.version, time.time(), step.about),
            )
            log.info("sched.store.migrated", extra={"store": self.url, "version": step.version})


@final
class _PostgresRunner:
    """The schedule store's :class:`~truba.scheduler.schedule_store.SqlRunner` on this database:
    its ``?`` placeholders become ``%s``; every call is bounded and reconnects as the job store's."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        def rows(cur: Cursor) -> list[tuple[Any, ...]]:
            return cur.execute(_marks(sql), params).fetchall()

        result: list[tuple[Any, ...]] = self._call(rows, write=False)
        return result

    def transaction(self, work: Callable[[Tx], T]) -> T:
        result: T = self._call(lambda cur: work(_CursorTx(cur)), write=True)
        return result


@final
class _CursorTx:
    def __init__(self, cur: Cursor) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._cur.execute(_marks(sql), params).rowcount


def _marks(sql: str) -> str:
    return sql.replace("?", "%s")


def _add_stale(cur: Cursor, job_id: str) -> None:
    cur.execute(
        "INSERT INTO stale_queues (job_id, since) VALUES (%s, %s) ON CONFLICT (job_id) DO NOTHING",
        (job_id, time.time()),
    )


def _check_fence(cur: Cursor, fence: tuple[str, int], url: str) -> None:
    holder, epoch = fence
    row = cur.execute(
        "SELECT 1 FROM leader WHERE id = 1 AND holder = %s AND epoch = %s FOR SHARE", (holder, epoch)
    ).fetchone()
    if row is None:
        raise StoreUnavailable(
            f"the store {url}: this scheduler no longer leads (epoch {epoch}); not written"
        )


def _line(exc: BaseException) -> str:
    """psycopg's message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
