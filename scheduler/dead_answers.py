"""A job's dead letters for the HTTP API and the dashboard: read through the brokers at most
once every few seconds per job, however many pages ask.

Listing dead letters browses the job's dead-letter queue on every broker
(:class:`~truba.scheduler.dead_letters.DeadLetterReader`); a dashboard polls, and several may be
open. So an answer is reused for :data:`FRESH` seconds, and askers of the same job meanwhile wait
for the one read under way rather than starting their own. Every wait is bounded by :data:`WAIT`
(the read goes on in the background and its answer is kept for the next asker).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final, final

from google.protobuf import json_format

from truba.scheduler.dead_letters import DeadLetterReader
from truba.scheduler.model import Job

FRESH: Final = 5.0
"""Seconds an answer is reused."""
WAIT: Final = 15.0
"""Seconds one ask waits for a read at most (each broker's look is bounded by the admin timeout)."""

Answer = dict[str, Any]


@final
class DeadLetterAnswers:
    """Answers "the dead letters of job X" as JSON; see the module.

    ``job`` looks a job up by id (raising the scheduler's NotFound or InvalidArgument).
    """

    def __init__(
        self,
        job: Callable[[str], Job],
        reader: DeadLetterReader,
        *,
        fresh: float = FRESH,
        wait: float = WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._job = job
        self._reader = reader
        self._fresh = fresh
        self._wait = wait
        self._clock = clock
        self._answers: dict[tuple[str, int], tuple[float, Answer]] = {}
        self._reading: dict[tuple[str, int], asyncio.Future[Answer]] = {}

    async def answer(self, job_id: str, limit: int) -> Answer:
        """``{"job_id", "dead_letters": [...], "unreachable", "truncated", "kept_until"}`` (the
        letters without their bodies).

        Raises:
            SchedulerError: an unknown job or bad limit (InvalidArgument, NotFound), or an ended
                job whose dead letters are gone (FailedPrecondition).
            TimeoutError: no answer within :data:`WAIT` seconds.
        """
        job = self._job(job_id)
        key = (job.id, limit)
        now = self._clock()
        for old in [k for k, (at, _) in self._answers.items() if now - at >= self._fresh]:
            del self._answers[old]
        kept = self._answers.get(key)
        if kept is not None:
            return kept[1]
        reading = self._reading.get(key)
        if reading is None:
            reading = self._reading[key] = asyncio.ensure_future(self._read(job, limit))
            reading.add_done_callback(lambda done: self._read_ended(key, done))
        async with asyncio.timeout(self._wait):
            return await asyncio.shield(reading)

    async def _read(self, job: Job, limit: int) -> Answer:
        read = await self._reader.read(job, limit, bodies=False)
        answer: Answer = {"job_id": job.id}
        answer.update(json_format.MessageToDict(read, preserving_proto_field_name=True))
        answer.setdefault("dead_letters", [])
        return answer

    def _read_ended(self, key: tuple[str, int], done: asyncio.Future[Answer]) -> None:
        self._reading.pop(key, None)
        with contextlib.suppress(BaseException):  # an asker saw the error, or none waits any more
            self._answers[key] = (self._clock(), done.result())
