"""A job's dead letters as ``truba.v1.DeadLetter``s: read from every broker, consumed for none.

A job's dead-letter queue holds three kinds of message (see :mod:`truba.wire` and
:mod:`truba.pipes.serialize`): a daemon's record of a task it *gave up* on (its error and the
task), a *poison* record (a message that could not be decoded, or a malformed frame, with why),
and anything the broker dead-lettered on its own (*refused*: rejected without requeue, expired,
over a limit; the ``x-death`` header says which). A refused frame is listed member by member.

Reading is bounded: at most ``limit`` messages per broker, each broker's look bounded by the
admin timeout, bodies 2 MiB in all per answer. A broker that fails is named in the answer, and
the others are listed. An ended job's dead letters can be read until their keep time is past
(FAILED_PRECONDITION after that, or when they were not kept).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Final, final

import msgpack

from truba.pipes.broker import Browsed, QueuedMessage
from truba.pipes.errors import CodecError, PipeError
from truba.pipes.frame_format import unpack
from truba.proto.v1 import jobs_pb2
from truba.scheduler.brokers import BrokerAdmin, Brokers
from truba.scheduler.errors import FailedPrecondition, InvalidArgument
from truba.scheduler.model import Job
from truba.scheduler.store import JobStore
from truba.wire import GaveUpCodec, ResultCodec, TaskCodec

log = logging.getLogger(__name__)

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
"""Messages read per broker at most, by default and at most."""
MAX_BODY_BYTES: Final = 2 * 1024 * 1024
"""Bodies in one answer at most (gRPC's default message limit is 4 MiB); the rest come without."""

_REFUSED: Final = {
    "rejected": "rejected without requeue by a consumer",
    "expired": "its time to live expired",
    "maxlen": "its queue was over its length limit",
    "delivery_limit": "it was delivered more times than its queue allows",
}


@final
class DeadLetterReader:
    """Lists and removes a job's dead letters on every broker.

    Raises (from each method): FailedPrecondition when the job ended and its dead letters are
    gone; InvalidArgument for a bad limit.
    """

    def __init__(self, brokers: Brokers, store: JobStore, *, clock: Callable[[], float] = time.time) -> None:
        self._brokers = brokers
        self._store = store
        self._clock = clock

    def kept_until(self, job: Job) -> float:
        """Until when ``job``'s dead letters are kept (0.0: the job runs).

        Raises:
            FailedPrecondition: the job ended and its dead letters were deleted (or are due).
        """
        if job.runnable:
            return 0.0
        until = self._store.dead_until(job.id)
        state = job.state.value.lower()
        if until is None:
            raise FailedPrecondition(
                f"job {job.id!r} is {state}: its dead letters are deleted (they are kept for the"
                " scheduler's --keep-dead time after a job ends)"
            )
        if until <= self._clock():
            at = datetime.fromtimestamp(until, UTC).isoformat(timespec="seconds")
            raise FailedPrecondition(
                f"job {job.id!r} is {state}: its dead letters were kept until {at} and are deleted"
            )
        return until

    async def read(
        self, job: Job, limit: int = 0, *, bodies: bool = False
    ) -> jobs_pb2.ListDeadLettersResponse:
        """Up to ``limit`` dead letters per broker (0: :data:`DEFAULT_LIMIT`), none consumed."""
        if not 0 <= limit <= MAX_LIMIT:
            raise InvalidArgument("limit", f"must be 0..{MAX_LIMIT}, got {limit}")
        answer = jobs_pb2.ListDeadLettersResponse(kept_until=self.kept_until(job))
        seen = await self._each(
            job, lambda broker: broker.browse(job.queues.dead, limit or DEFAULT_LIMIT), answer
        )
        budget = MAX_BODY_BYTES if bodies else 0
        for broker, browsed in seen:
            answer.truncated |= browsed.total > len(browsed.messages)
            for message in browsed.messages:
                for letter in dead_letters_of(message, broker.info.name):
                    if letter.size <= budget:
                        budget -= letter.size
                    else:
                        letter.body = b""
                    answer.dead_letters.append(letter)
        return answer

    async def remove(self, job: Job, task_ids: Collection[str]) -> jobs_pb2.RemoveDeadLettersResponse:
        """Deletes the given- up and refused tasks ``task_ids`` from the job's dead letters (looking
        at :data:`MAX_LIMIT` messages per broker at most)."""
        self.kept_until(job)
        wanted = set(task_ids)

        def take(body: bytes) -> bool:
            letters = dead_letters_of(QueuedMessage(body, {}), "")
            return len(letters) == 1 and bool(letters[0].task_id) and letters[0].task_id in wanted

        answer = jobs_pb2.RemoveDeadLettersResponse()
        if not wanted:
            return answer
        seen = await self._each(job, lambda broker: broker.browse(job.queues.dead, MAX_LIMIT, take), answer)
        answer.removed = sum(message.taken for _, browsed in seen for message in browsed.messages)
        log.info(
            "sched.dead.removed", extra={"job_id": job.id, "asked": len(wanted), "removed": answer.removed}
        )
        return answer

    async def _each(
        self,
        job: Job,
        look: Callable[[BrokerAdmin], Awaitable[Browsed]],
        answer: jobs_pb2.ListDeadLettersResponse | jobs_pb2.RemoveDeadLettersResponse,
    ) -> list[tuple[BrokerAdmin, Browsed]]:
        results = await asyncio.gather(
            *(look(broker) for broker in self._brokers.all), return_exceptions=True
        )
        seen = []
        for broker, result in zip(self._brokers.all, results, strict=True):
            if isinstance(result, PipeError):
                log.warning(
                    "sched.dead.unreachable",
                    extra={"job_id": job.id, "broker": broker.info.name, "error": str(result)},
                )
                answer.unreachable.append(f"{broker.info.name}: {type(result).__name__}: {result}")
            elif isinstance(result, BaseException):
                raise result
            else:
                seen.append((broker, result))
        return seen


def dead_letters_of(message: QueuedMessage, broker: str) -> list[jobs_pb2.DeadLetter]:
    """What one message of a dead-letter queue says (a refused frame: one per member)."""
    body = message.body
    try:
        gave_up = GaveUpCodec().decode(body)
    except CodecError:
        pass
    else:
        return [
            jobs_pb2.DeadLetter(
                task_id=gave_up.task_id,
                reason=jobs_pb2.DEAD_LETTER_REASON_GAVE_UP,
                error_type=gave_up.error.type,
                error_message=gave_up.error.message,
                traceback=gave_up.error.traceback,
                attempts=gave_up.attempts,
                broker=broker,
                daemon_id=gave_up.daemon_id,
                body=gave_up.body,
                size=len(gave_up.body),
            )
        ]
    poison = _poison(body)
    if poison is not None:
        error, original = poison
        task_id, attempts = _task_of(original)
        return [
            jobs_pb2.DeadLetter(
                task_id=task_id,
                reason=jobs_pb2.DEAD_LETTER_REASON_POISON,
                error_type="MalformedFrame" if error.startswith("malformed frame") else "CodecError",
                error_message=error,
                attempts=attempts,
                broker=broker,
                body=original,
                size=len(original),
            )
        ]
    why = _refused(message.headers)
    letters = []
    for member in unpack(body) or [body]:
        task_id, attempts = _task_of(member)
        letters.append(
            jobs_pb2.DeadLetter(
                task_id=task_id,
                reason=jobs_pb2.DEAD_LETTER_REASON_REFUSED,
                error_type="Refused",
                error_message=why,
                attempts=attempts,
                broker=broker,
                body=member,
                size=len(member),
            )
        )
    return letters


def _poison(body: bytes) -> tuple[str, bytes] | None:
    """``(error, original bytes)`` of a poison record, or None."""
    try:
        record = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    if isinstance(record, dict) and record.get("kind") == "poison" and isinstance(record.get("body"), bytes):
        return str(record.get("error", "")), record["body"]
    return None


def _task_of(data: bytes) -> tuple[str, int]:
    """The task id and attempts of a task (or result) message; ``("", 0)`` when it is neither."""
    try:
        task = TaskCodec().decode(data)
    except CodecError:
        pass
    else:
        return task.task_id, task.attempts
    try:
        result = ResultCodec().decode(data)
    except CodecError:
        return "", 0
    return result.task_id, result.attempts


def _refused(headers: dict[str, object]) -> str:
    """Why the broker dead-lettered a message, from its ``x-death`` header."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        reason = _text(deaths[0].get("reason"))
        queue = _text(deaths[0].get("queue"))
        return f"the broker dead-lettered it from {queue}: {_REFUSED.get(reason, reason)}"
    return "the broker dead-lettered it (no x-death header)"


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "?")
