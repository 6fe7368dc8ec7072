"""A job by its id, from any process: ``client.job(job_id)`` to look at it, watch it, re-weight
or cancel it, without its journal.

The handle makes only scheduler calls (GetJob, WatchJob, ListRunning, SetImportance, CancelJob): outcomes
still flow only to the client that owns the job's journal (``Client.resume``). Cancelling from
here also removes the job's journal folder under this client's journal root when no live client
holds it (one that does removes it itself when it sees the job cancelled).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Final, final

from truba.client.errors import InvalidArgument
from truba.client.journal import Journal
from truba.client.lifecycle import JobCalls
from truba.client.reach import Reach
from truba.client.running import RunningTasks
from truba.pipes.spool_log import SpoolError
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger(__name__)

MAX_JOB_ID: Final = 64
_JOB_ID: Final = re.compile(r"[a-z0-9]+")


def check_job_id(job_id: str) -> str:
    """A job id as the scheduler makes them (``[a-z0-9]+``, at most 64 characters), checked
    before it is put into a path or a request.

    Raises:
        InvalidArgument: anything else (``"../etc"`` included).
    """
    if not isinstance(job_id, str) or len(job_id) > MAX_JOB_ID or not _JOB_ID.fullmatch(job_id):
        raise InvalidArgument(
            "INVALID_ARGUMENT",
            f"job_id: must match [a-z0-9]+ (at most {MAX_JOB_ID} characters), got {job_id!r}",
        )
    return job_id


@final
class JobHandle:
    """A job known by id; see the module. Every call raises NotFound for an unknown id."""

    def __init__(
        self, jobs: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, *, reach: Reach, journal: Path | None
    ) -> None:
        self._calls = JobCalls(jobs, jobs_pb2.Job(id=check_job_id(job_id)), reach=reach)
        self._journal = journal

    @property
    def id(self) -> str:
        """The job's id."""
        return self._calls.job_id

    async def info(self) -> jobs_pb2.Job:
        """The scheduler's current view of the job (state, slots, counts)."""
        return await self._calls.get()

    def watch(self) -> AsyncGenerator[jobs_pb2.JobEvent, None]:
        """The job now, then on every change until it ends (see Job.watch)."""
        return self._calls.watch()

    async def running(self) -> RunningTasks:
        """The job's tasks running now: daemon, slot, attempt, since when (truba.client.running)."""
        return await self._calls.running()

    async def set_importance(self, importance: float) -> jobs_pb2.Job:
        """Changes the job's weight in the fair share.

        Raises:
            InvalidArgument: not a number > 0. FailedPrecondition: the job ended.
        """
        return await self._calls.set_importance(importance)

    async def cancel(self) -> jobs_pb2.Job:
        """Cancels the job: the scheduler deletes its queues; its owner's ``results()`` ends with
        cancelled outcomes. Removes the job's journal here unless a live client holds it.

        Raises:
            FailedPrecondition: the job already ended.
        """
        info = await self._calls.cancel()
        drop_journal(self._journal)
        log.info("client.job.cancelled_by_id", extra={"job_id": self.id})
        return info


def drop_journal(folder: Path | None) -> None:
    """Removes a journal folder of an ended job, unless a live client holds it (that one removes
    it itself when it sees the job ended)."""
    if folder is None or not folder.is_dir():
        return
    try:
        Journal.open(folder).close_now()  # takes the lock: nobody else has it open
    except SpoolError as exc:  # SpoolLocked among them
        log.info("client.journal.kept", extra={"directory": str(folder), "error": str(exc)})
        return
    shutil.rmtree(folder, ignore_errors=True)
