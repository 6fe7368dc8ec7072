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

    async def commit(self) -> None:
        """Returns when the records appended so far are as durable as the policy says."""
        if self.policy == "always":
            self._log.sync()
        elif self.policy == "batch":
            await self._group_commit()
        elif self.policy == "interval":
            self._sync_soon()

    async def drain(self) -> None:
        """Waits for the fsync under way, if any (before closing the log)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _group_commit(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit_groups())
        await waiter

    def _sync_soon(self) -> None:
        if self._log.sync_error is not None:
            raise self._log.sync_error
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit_later())

    async def _commit_later(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(SYNC_INTERVAL)
            self._task = None  # writes from now on schedule the next sync
            fd = self._log.sync_fd()
            if fd is not None:
                await loop.run_in_executor(None, fdatasync_and_close, fd)
        except SpoolError:
            pass  # recorded in the log's sync_error: the next commit raises it
        except OSError as exc:
            self._log.sync_failed(exc)
        finally:
            if self._task is asyncio.current_task():
                self._task = None

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
