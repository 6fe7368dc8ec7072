"""How a job's life ends on this client: finished, cancelled (here or elsewhere), or detached.

Each end stops the job's parts in an order that loses nothing: the progress reporter and the
loss watch first (the marker queue must not come back after FinishJob deletes it), the pipes
next (no pipe may declare a queue again after the scheduler deleted it), then the call to the
scheduler, and the journal last: it is deleted only once every task has its outcome or the job
is cancelled, and kept on a detach for :meth:`Client.resume`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from typing import Final, final

from truba.client.errors import Unavailable
from truba.client.group import Groups
from truba.client.interrupt import DETACH_SECONDS, left_running
from truba.client.journal import TaskJournal
from truba.client.lifecycle import JobCalls, JobStatus
from truba.client.progress import ProgressReporter
from truba.client.result_stream import ResultStream
from truba.client.submission import Submission
from truba.pipes.errors import PipeError
from truba.proto.v1 import jobs_pb2

log = logging.getLogger(__name__)

DETACH_PATIENCE: Final = 10.0
"""Seconds :meth:`JobEnding.detach` waits for outstanding confirms and acks, at most."""


@final
class JobEnding:
    """The end sequences of one job's parts on this client (see the module docstring)."""

    def __init__(
        self,
        job_id: str,
        journal: TaskJournal,
        status: JobStatus,
        progress: ProgressReporter,
        submission: Submission,
        stream: ResultStream,
        calls: JobCalls,
        groups: Groups,
    ) -> None:
        self._job_id = job_id
        self._journal = journal
        self._status = status
        self._progress = progress
        self._submission = submission
        self._stream = stream
        self._calls = calls
        self._groups = groups
        self.finished = False
        self.detached = False

    @property
    def ended(self) -> bool:
        """Finished, cancelled or detached: the job has no more work to do here."""
        return self.finished or self._status.cancelled or self.detached

    async def leave_block(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        """The job's ``async with`` block ended: ``close`` it, cancel it after an Exception, or
        detach it (KeyboardInterrupt, cancellation, Unavailable); see :meth:`Job.__aexit__`."""
        if self.ended:
            return
        if exc_type is None:
            await close()
        elif issubclass(exc_type, Exception) and not issubclass(exc_type, Unavailable):
            await self.cancel_quietly(exc)
        else:
            await self.detach(DETACH_SECONDS)
            left_running(self._job_id, resumable=self._journal.directory is not None)

    async def check_state(self) -> None:
        """No result for a while: was the job cancelled elsewhere, or has it a problem?"""
        try:
            info = await self._calls.get(patience=False)
        except Unavailable as exc:
            # The data plane does not need the scheduler: keep taking outcomes while it is away
            # (the client tells the outage once).
            log.debug("client.job.poll_failed", extra={"job_id": self._job_id, "error": str(exc)})
            return
        if info.state == jobs_pb2.JOB_STATE_CANCELLED:
            log.info("client.job.cancelled_elsewhere", extra={"job_id": self._job_id})
            await self.stop_local()
            await self.drop_journal()
        if info.problem:
            log.warning("client.job.problem", extra={"job_id": self._job_id, "problem": info.problem})

    async def finish(self) -> None:
        """Every outcome is taken: stop here, and have the scheduler delete the job's queues."""
        if self.finished:
            return
        self.finished = True
        await self._progress.stop()
        await self._submission.watch.stop()  # before FinishJob deletes the marker: it must not come back
        # Stop consuming first: the scheduler is about to delete the queue under the consumer.
        await self._stream.close()
        await self._submission.close()
        await self._calls.finish()
        await self._groups.settled()  # a group callback still running must not lose its mark
        await self.drop_journal()
        received = self._journal.recorded - len(self._journal)
        log.info("client.job.finished", extra={"job_id": self._job_id, "outcomes": received})

    async def drop_journal(self) -> None:
        """Every task has its outcome (or the job is cancelled): the journal has no more use."""
        await self._journal.close()
        if self._journal.directory is not None:
            shutil.rmtree(self._journal.directory, ignore_errors=True)

    async def cancel(self) -> None:
        """Stops here, tells the scheduler (raises if it cannot be told: the journal is kept),
        then deletes the journal."""
        await self.stop_local()
        await self._calls.cancel()
        await self.drop_journal()
        log.info("client.job.cancelled", extra={"job_id": self._job_id, "pending": len(self._journal)})

    async def cancel_quietly(self, cause: BaseException | None) -> None:
        """Cancels because of ``cause``; a cancel that fails is logged and the job detached, left
        running and resumable, so that ``cause`` is what the caller sees."""
        try:
            await self.cancel()
        except Exception as exc:
            log.warning("client.job.cancel_failed", extra={"job_id": self._job_id, "error": repr(exc)})
            await self.detach(DETACH_SECONDS)
            left_running(self._job_id, resumable=self._journal.directory is not None)
            return
        log.info("client.job.cancelled_on_error", extra={"job_id": self._job_id, "error": repr(cause)})

    async def stop_local(self) -> None:
        """No more work on the job here: reporter, loss watch and pipes stop; outcomes still
        missing become cancelled ones."""
        self._status.cancelled = True
        self._status.closed = True
        await self._progress.stop()
        await self._submission.watch.stop()
        await self._submission.close()
        with contextlib.suppress(PipeError):
            await self._stream.close()

    async def detach(self, patience: float = DETACH_PATIENCE) -> None:
        """Leaves the job to :meth:`Client.resume` (idempotent): acks what was taken and waits
        for confirms, ``patience`` seconds at most, then closes the pipes and the journal."""
        if self.detached:
            return
        self.detached = True
        await self._progress.stop()
        await self._submission.watch.stop()
        try:
            async with asyncio.timeout(patience):
                await self._stream.ack_taken()
                await self._submission.settle_confirms()
        except (TimeoutError, Unavailable) as exc:
            log.info("client.job.detach_unsettled", extra={"job_id": self._job_id, "error": repr(exc)})
        await self._submission.close()
        with contextlib.suppress(PipeError):
            await self._stream.close()
        await self._journal.close()
