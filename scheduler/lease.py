"""The leader lease's rules, apart from any database: the row, the store's interface, the fence.

Several schedulers share one PostgreSQL store; one of them *leads* (serves the API, plans,
pushes assignments) while it holds the lease, a one-row table (schema step 5): who holds it,
where it serves, its **epoch** and until when. A scheduler takes the row with one conditional
UPDATE that the database's clock decides (``expires_at < now() OR holder = me``); taking it from
another holder adds one to the epoch, renewing keeps it
(:class:`~truba.scheduler.lease_postgres.PostgresLease`).

**Self-fencing.** The database lets another scheduler take the row once ``expires_at`` is past,
and ``expires_at`` is at least ``ttl`` after the database *received* our last successful renew,
which is after we *sent* it. So the leader may lead until ``sent + ttl``, by its own monotonic
clock, whatever the network did with the answer; :class:`Fence` keeps that deadline less a
margin, and the leader stops leading before it passes. A deposed leader can therefore never
overlap with the next one, whatever its connection to the database does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, final

DEFAULT_TTL: Final = 3.0
"""Seconds a lease lasts after each renew (a standby leads about this long after a kill -9)."""
POLL: Final = 0.5
"""Seconds between a standby's tries to take the lease."""
MARGIN_SHARE: Final = 0.15
"""The part of the ttl the leader gives up before its deadline (at least :data:`MIN_MARGIN`):
time to stop, and clock-rate differences between the machines."""
MIN_MARGIN: Final = 0.2


@dataclass(frozen=True)
class LeaseRow:
    """The lease as the database holds it (``expires_at``: Unix time, by the database's clock)."""

    holder: str
    address: str
    epoch: int
    expires_at: float


class LeaseStore(Protocol):
    """The lease in a database; every call is bounded and may raise
    :class:`~truba.scheduler.errors.StoreUnavailable`. Calls are blocking (run them in a thread)."""

    def acquire(self, holder: str, address: str, ttl: float) -> LeaseRow:
        """Takes or renews the lease for ``holder`` if it is free, expired or already its own;
        returns the row as it is after the try (its holder says whether it worked)."""

    def release(self, holder: str) -> None:
        """Ends ``holder``'s lease now (a standby may take it at once); nothing if not its own."""

    def close(self) -> None:
        """Closes the connection; idempotent."""


@dataclass(frozen=True)
class Leadership:
    """What a leading scheduler is told by its election: its epoch, whether it still leads (the
    fence) and where the leader is (for the answers once it does not)."""

    epoch: int
    leading: Callable[[], bool]
    leader: Callable[[], str]
    holder: str = ""
    """The lease's holder id: the store fences its writes with it (PostgreSQL)."""


@final
class Fence:
    """How long this scheduler may lead: until the send time of its last successful renew plus
    the ttl, less a margin. Once :meth:`lose` is called it never leads again (a process that
    stepped down becomes a fresh standby)."""

    def __init__(self, ttl: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl > 0:
            raise ValueError(f"lease ttl: must be > 0 seconds, got {ttl}")
        self.ttl = ttl
        self.margin = max(MIN_MARGIN, MARGIN_SHARE * ttl)
        if self.margin >= ttl / 2:
            raise ValueError(f"lease ttl: must be > {2 * MIN_MARGIN:g} seconds, got {ttl}")
        self.clock = clock
        self._deadline = -math.inf
        self._lost = False

    @property
    def deadline(self) -> float:
        """The monotonic time at which this scheduler stops leading (``-inf``: it does not lead)."""
        return -math.inf if self._lost else self._deadline

    def renewed(self, sent_at: float) -> None:
        """A renew (or the first acquire) sent at ``sent_at`` (monotonic) succeeded."""
        if not self._lost:
            self._deadline = max(self._deadline, sent_at + self.ttl - self.margin)

    @property
    def lost(self) -> bool:
        """:meth:`lose` was called."""
        return self._lost

    def leading(self) -> bool:
        """True while the deadline is ahead: sending assignments and serving are allowed."""
        return self.clock() < self.deadline

    def lose(self) -> None:
        """Stops leading for good."""
        self._lost = True
