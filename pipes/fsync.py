"""When appended log records become durable: the fsync policies shared by the spool and the journal.

A :class:`Committer` is told after each :meth:`~truba.pipes.spool_log.SpoolLog.append` and
returns once the record is as durable as its policy promises:

- ``"always"``: fdatasync on the event loop, for every record. Survives power loss.
- ``"batch"`` (group commit): wait for the next fdatasync, run in a worker thread while the loop
  goes on; every record appended during an fsync shares the following one. Survives power loss.
- ``"interval"``: return at once and fdatasync in a worker thread within :data:`SYNC_INTERVAL`.
  Survives a crash of this process; a power loss can lose what was written in the last interval.
- ``"never"``: write only (OS page cache). Survives a crash of this process, not of the machine.
"""

from __future__ import annotations

import asyncio
from typing import Final, Literal, final, get_args

from truba.pipes.errors import SpoolError
from truba.pipes.spool_files import fdatasync_and_close
from truba.pipes.spool_log import SpoolLog

__all__ = ["SYNC_INTERVAL", "Committer", "FsyncPolicy", "check_policy"]

SYNC_INTERVAL: Final = 0.01
"""Seconds within which the ``interval`` policy makes a written record durable."""

FsyncPolicy = Literal["always", "batch", "interval", "never"]


def check_policy(policy: str) -> FsyncPolicy:
    """``policy`` if it names a policy, else ValueError."""
    for known in get_args(FsyncPolicy):
        if policy == known:
            return known  # type: ignore[no-any-return]
    raise ValueError(f"fsync policy must be one of {get_args(FsyncPolicy)}, not {policy!r}")


@final
class Committer:
    """Makes the records of one :class:`SpoolLog` durable per its fsync policy.

    Raises (from :meth:`commit`):
        SpoolError: an fsync failed (now or earlier: the log then refuses every later write).
    """

    def __init__(self, log: SpoolLog, policy: FsyncPolicy) -> None:
        self.policy = check_policy(policy)
        self._log = log
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        """``interval``: the sync to come (a timer, not a task: a task per sync would be one
        per task submitted one at a time, each a few turns of the event loop)."""
        self._syncing: asyncio.Future[None] | None = None
        """``interval``: the fsync under way in a worker thread."""

    async def commit(self) -> None:
        """Returns when the records appended so far are as durable as the policy says."""
        if self.policy == "always":
            self._log.sync()
        elif self.policy == "batch":
            await self._group_commit()
        elif self.policy == "interval":
            self._sync_soon()

    async def drain(self) -> None:
        """Waits for the fsync under way, if any (before closing the log); a sync still to come
        (``interval``) runs now."""
        if self._task is not None:
            await asyncio.shield(self._task)
        if self._timer is not None:
            self._timer.cancel()
            self._sync_now()
        if self._syncing is not None:
            await asyncio.wait((self._syncing,))  # its outcome is the callback's (_synced)

    async def _group_commit(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit_groups())
        await waiter

    def _sync_soon(self) -> None:
        if self._log.sync_error is not None:
            raise self._log.sync_error
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SYNC_INTERVAL, self._sync_now)

    def _sync_now(self) -> None:
        """``interval``'s fsync, in a worker thread; writes from now on schedule the next one."""
        self._timer = None
        try:
            fd = self._log.sync_fd()
        except SpoolError:
            return  # recorded in the log's sync_error: the next commit raises it
        if fd is None:
            return
        syncing = self._syncing = asyncio.get_running_loop().run_in_executor(None, fdatasync_and_close, fd)
        syncing.add_done_callback(self._synced)

    def _synced(self, syncing: asyncio.Future[None]) -> None:
        if self._syncing is syncing:
            self._syncing = None
        error = None if syncing.cancelled() else syncing.exception()
        if isinstance(error, OSError):
            self._log.sync_failed(error)

    async def _commit_groups(self) -> None:
        """One fdatasync per group: whatever was appended while the previous fsync ran."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                group, self._waiters = self._waiters, []
                error: SpoolError | None = None
                try:
                    fd = self._log.sync_fd()
                    if fd is not None:
                        await loop.run_in_executor(None, fdatasync_and_close, fd)
                except SpoolError as exc:
                    error = exc
                except OSError as exc:
                    error = self._log.sync_failed(exc)
                error = error or self._log.sync_error  # a seal during the fsync may have failed
                for waiter in group:
                    if waiter.done():
                        continue
                    if error is None:
                        waiter.set_result(None)
                    else:
                        waiter.set_exception(error)
        finally:
            self._task = None
