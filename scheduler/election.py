"""Leader election over a :class:`~truba.scheduler.lease.LeaseStore`: campaign, hold, fence.

:meth:`Elector.campaign` tries to take the lease every :data:`~truba.scheduler.lease.POLL`
seconds and returns the epoch once it holds it (meanwhile :attr:`Elector.leader` says who
leads, for the standby's answers). :meth:`Elector.hold` renews every third of the ttl and
returns when leadership is lost: the fence's deadline passed (renews failed or came too late) or
the row names another holder. Every database call runs in a thread, bounded by what is left of
the fence, so a database that stops answering never holds the event loop past the deadline.

:meth:`Elector.watchdog` is the backstop: a thread that calls the step-down action once the
deadline passes, even when the event loop is blocked (the job store's calls are synchronous).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Final, final

from truba.scheduler.errors import StoreUnavailable
from truba.scheduler.lease import DEFAULT_TTL, POLL, Fence, LeaseRow, LeaseStore

log = logging.getLogger(__name__)

WATCH_EVERY: Final = 0.05
"""Seconds between the watchdog's looks at the deadline."""


def holder_id() -> str:
    """An id for this process's claim: host, pid and a random part (a re-executed or restarted
    process is a new holder, with a new epoch)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@final
class Elector:
    """One scheduler's part in the election; see the module."""

    def __init__(
        self,
        lease: LeaseStore,
        *,
        address: str,
        ttl: float = DEFAULT_TTL,
        poll: float = POLL,
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self.address = address
        self.poll = poll
        self.holder = holder or holder_id()
        self.fence = Fence(ttl, clock=clock)
        self.epoch = 0
        """The epoch of our lease (0 before we first hold it)."""
        self.lease_until = 0.0
        """Unix time (database clock) at which our last successful renew's lease ends."""
        self.leader: LeaseRow | None = None
        """The lease as last read while not holding it (None: not read yet)."""
        self._clock = clock
        self._losing = threading.Lock()
        """lose() runs on the loop and on the watchdog's thread: one of them says it."""

    @property
    def ttl(self) -> float:
        return self.fence.ttl

    def leader_address(self) -> str:
        """Where the leader serves, as far as we know ("" if unknown or the lease is free)."""
        if self.fence.leading():
            return self.address
        row = self.leader
        return row.address if row is not None and row.holder else ""

    async def campaign(self) -> int:
        """Waits until this scheduler holds the lease; returns its epoch."""
        while True:
            epoch = await self.try_once()
            if epoch:
                return epoch
            await asyncio.sleep(self.poll)

    async def try_once(self) -> int:
        """One try to take the lease: its epoch if we hold it now, else 0."""
        row = await self._try(self.ttl / 3)
        if row is None or row.holder != self.holder:
            return 0
        log.info(
            "sched.lease.acquired",
            extra={
                "epoch": row.epoch,
                "address": self.address,
                "at": time.time(),
                "lease_until": row.expires_at,
            },
        )
        return row.epoch

    async def hold(self) -> None:
        """Renews the lease every third of the ttl; returns once leadership is lost."""
        while True:
            left = self.fence.deadline - self._clock()
            if left <= 0:
                break
            await asyncio.sleep(min(self.ttl / 3, left))
            left = self.fence.deadline - self._clock()
            if left <= 0:
                break
            row = await self._try(min(self.ttl / 3, left))
            if row is not None and row.holder != self.holder:
                break  # the row is another's: our lease expired in the database
        self.lose("lease lost")

    def lose(self, reason: str) -> None:
        """Stops leading for good (idempotent, from any thread) and says so once."""
        with self._losing:
            first = not self.fence.lost
            self.fence.lose()
        if self.epoch and first:
            log.warning(
                "sched.lease.lost",
                extra={
                    "epoch": self.epoch,
                    "reason": reason,
                    "at": time.time(),
                    "lease_until": self.lease_until,
                },
            )

    def release(self) -> None:
        """Ends our lease at once (a graceful stop, after serving stopped); errors are logged."""
        try:
            self.lease.release(self.holder)
        except StoreUnavailable as exc:
            log.warning("sched.lease.release_failed", extra={"error": str(exc)})

    def watchdog(self, step_down: Callable[[], None]) -> threading.Event:
        """Starts a thread that calls ``step_down`` once the fence's deadline is past (it must
        not return: re-exec the process, or exit). Set the returned event to end the thread."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(WATCH_EVERY):
                if not self.fence.leading():
                    self.lose("deadline passed (watchdog)")
                    step_down()
                    return

        threading.Thread(target=watch, name="lease-watchdog", daemon=True).start()
        return done

    async def _try(self, timeout: float) -> LeaseRow | None:
        """One acquire or renew, bounded by ``timeout``; None when it failed."""
        sent = self._clock()
        try:
            row = await asyncio.wait_for(
                asyncio.to_thread(self.lease.acquire, self.holder, self.address, self.ttl), timeout
            )
        except (StoreUnavailable, TimeoutError) as exc:
            log.warning("sched.lease.try_failed", extra={"error": str(exc) or type(exc).__name__})
            return None
        if row.holder == self.holder:
            self.fence.renewed(sent)
            self.epoch = row.epoch
            self.lease_until = row.expires_at
        else:
            self.leader = row
        return row
