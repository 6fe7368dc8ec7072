"""The leader lease on PostgreSQL (see :mod:`~truba.scheduler.lease`): one connection of its own.

The lease has its own connection, apart from the job store's, so that a renew never waits behind
a job-store call (and the elector runs it in a thread: the scheduler's loop never waits for it).
Its bounds are short, a third of the ttl per statement, so a renew that does not come back in
time fails while the fence still has time to act.

One statement takes, renews or reads the lease; the database's clock decides expiry::

    UPDATE leader SET holder = me, ..., epoch = epoch + (holder <> me), expires_at = now() + ttl
    WHERE holder = me OR expires_at < now()
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Final, final

import psycopg

from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.lease import LeaseRow
from truba.scheduler.store_postgres import connect_params, redact_url

log = logging.getLogger(__name__)

_ACQUIRE: Final = """
WITH won AS (
    UPDATE leader SET holder = %(me)s, address = %(address)s,
        epoch = CASE WHEN holder = %(me)s THEN epoch ELSE epoch + 1 END,
        expires_at = now() + %(ttl)s * interval '1 second'
    WHERE id = 1 AND (holder = %(me)s OR expires_at < now())
    RETURNING holder, address, epoch, expires_at
)
SELECT holder, address, epoch, extract(epoch FROM expires_at)::float8 FROM won
UNION ALL
SELECT holder, address, epoch, extract(epoch FROM expires_at)::float8 FROM leader
WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM won)
"""
_RELEASE: Final = "UPDATE leader SET expires_at = '-infinity' WHERE id = 1 AND holder = %s"


@final
class PostgresLease:
    """A :class:`~truba.scheduler.lease.LeaseStore` in the PostgreSQL database at ``url``
    (the job store's database; its schema step 5 made the table).

    ``timeout`` bounds each statement and the network under it (connecting takes at least 2 s:
    libpq's rule); the elector gives it a third of the ttl.
    """

    def __init__(self, url: str, *, timeout: float) -> None:
        self.url = redact_url(url)
        self._params = connect_params(url, timeout)
        self._params["application_name"] = "truba-scheduler-lease"
        self._params["keepalives_idle"] = 1
        self._params["connect_timeout"] = max(2, math.ceil(timeout))
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def acquire(self, holder: str, address: str, ttl: float) -> LeaseRow:
        row = self._one(_ACQUIRE, {"me": holder, "address": address, "ttl": ttl})
        if row is None:
            raise StoreUnavailable(f"the store {self.url} has no leader row (schema step 5 missing)")
        who, where, epoch, until = row
        return LeaseRow(str(who), str(where), int(epoch), float(until))

    def release(self, holder: str) -> None:
        self._one(_RELEASE, (holder,), fetch=False)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _one(self, sql: str, params: Any, *, fetch: bool = True) -> tuple[Any, ...] | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(**self._params, autocommit=True)
            cur = self._conn.execute(sql, params)
            return cur.fetchone() if fetch else None
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailable(f"the lease in {self.url} failed: {' '.join(str(exc).split())}") from exc
