"""A job's dead letters from the client: list them (typed records) and send them again.

:func:`read_dead_letters` asks the scheduler (``ListDeadLetters``), which reads every broker's
dead-letter queue of the job without consuming it. Each :class:`DeadLetter` says why the task is
there (:class:`DeadReason`: given up after its attempts, poison, refused by the broker), its
error, attempts and broker; ``str()`` of a record (or of a :class:`DeadLetters` list) is one
printable line per record.

:class:`DeadRetry` sends the given-up and refused tasks of a job again, as *new* tasks of the same
job: each gets a fresh id, goes through the journal like any other task, and has its own outcome
in ``results()`` (the old id's outcome, a give-up, was already delivered). Only then are the
old letters removed (``RemoveDeadLetters``): a crash in between leaves them, so a second retry
may run a task twice. Poison letters (nothing readable to run) stay. The job must be open in
this client: a closed job's task count is final, and an ended job's outcomes went to its owner
already; the records' ``payload`` can be submitted into a new job instead.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, final

from truba.client.errors import FailedPrecondition, map_rpc_errors
from truba.client.lifecycle import JobStatus
from truba.pipes.errors import CodecError
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc
from truba.wire import ErrorInfo, TaskCodec, TaskMessage

RPC_TIMEOUT: Final = 60.0
"""Seconds one call to the scheduler about dead letters may take (it reads every broker)."""
MAX_ROUNDS: Final = 1000
"""Rounds of list, send, remove at most in one :meth:`DeadRetry.retry` (each up to 1000 per broker)."""


class DeadReason(enum.Enum):
    """Why a task is in its job's dead-letter queue."""

    GAVE_UP = "gave up"
    """Every attempt timed out, crashed its slot or lost its daemon (``max_attempts`` spent)."""
    POISON = "poison"
    """The message could not be decoded, or was a malformed frame: it never ran."""
    REFUSED = "refused"
    """The broker dead-lettered it: rejected without requeue, expired or over a queue limit."""


_REASONS: Final = {
    jobs_pb2.DEAD_LETTER_REASON_GAVE_UP: DeadReason.GAVE_UP,
    jobs_pb2.DEAD_LETTER_REASON_POISON: DeadReason.POISON,
    jobs_pb2.DEAD_LETTER_REASON_REFUSED: DeadReason.REFUSED,
}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter of a job: which task, why, its error, and where it is kept.

    ``task_id`` is empty for a message that cannot be read as a task. ``body`` is the task
    message as it was delivered (the raw bytes of a poison message), empty when it was not asked
    for or did not fit the answer; ``size`` is its length either way.
    """

    task_id: str
    reason: DeadReason
    error: ErrorInfo
    attempts: int
    broker: str
    daemon_id: str = ""
    body: bytes = b""
    size: int = 0

    @classmethod
    def from_pb(cls, letter: jobs_pb2.DeadLetter) -> DeadLetter:
        return cls(
            task_id=letter.task_id,
            reason=_REASONS.get(letter.reason, DeadReason.REFUSED),
            error=ErrorInfo(letter.error_type, letter.error_message, letter.traceback),
            attempts=letter.attempts,
            broker=letter.broker,
            daemon_id=letter.daemon_id,
            body=letter.body,
            size=letter.size,
        )

    @property
    def task(self) -> TaskMessage | None:
        """The task as it was sent (None: no body, or not a task)."""
        try:
            return TaskCodec().decode(self.body) if self.body else None
        except CodecError:
            return None

    @property
    def payload(self) -> object:
        """The task's payload (None also when :attr:`task` is None)."""
        task = self.task
        return None if task is None else task.payload

    def describe(self) -> str:
        """One line: task, reason, attempts, broker (and daemon), error."""
        attempts = (
            f" after {self.attempts} attempt{'s' if self.attempts != 1 else ''}" if self.attempts else ""
        )
        where = self.broker + (f", daemon {self.daemon_id}" if self.daemon_id else "")
        error = f"{self.error.type}: {self.error.message}" if self.error.type else self.error.message
        return f"{self.task_id or '-'}  {self.reason.value}{attempts} ({where}): {error}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class DeadLetters(Sequence[DeadLetter]):
    """A job's dead letters as the scheduler read them, broker by broker, oldest first.

    ``unreachable`` names the brokers that could not be read (with why); ``truncated`` says a
    broker holds more than were listed; ``kept_until`` is when an ended job's dead letters are
    deleted (None while the job runs).
    """

    letters: tuple[DeadLetter, ...]
    unreachable: tuple[str, ...] = ()
    truncated: bool = False
    kept_until: float | None = None

    @classmethod
    def from_pb(cls, answer: jobs_pb2.ListDeadLettersResponse) -> DeadLetters:
        return cls(
            tuple(DeadLetter.from_pb(letter) for letter in answer.dead_letters),
            tuple(answer.unreachable),
            answer.truncated,
            answer.kept_until or None,
        )

    def __getitem__(self, index: int) -> DeadLetter:  # type: ignore[override]
        return self.letters[index]

    def __len__(self) -> int:
        return len(self.letters)

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(self.letters)

    def describe(self) -> str:
        """One line per letter, then what is missing from the list and until when it is kept."""
        lines = [letter.describe() for letter in self.letters] or ["no dead letters"]
        lines += [f"not read: {broker}" for broker in self.unreachable]
        if self.truncated:
            lines.append("(more are kept than listed)")
        if self.kept_until is not None:
            at = datetime.fromtimestamp(self.kept_until, UTC).isoformat(timespec="seconds")
            lines.append(f"kept until {at}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


async def read_dead_letters(
    jobs: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, *, limit: int = 0, bodies: bool = False
) -> DeadLetters:
    """The job's dead letters (at most ``limit`` per broker, 0: the scheduler's default of 100);
    ``bodies`` brings each task's message too (2 MiB in all at most).

    Raises:
        NotFound: no such job.
        FailedPrecondition: the job ended and its dead letters are deleted.
        InvalidArgument: ``limit`` over 1000.
    """
    request = jobs_pb2.ListDeadLettersRequest(job_id=job_id, limit=limit, bodies=bodies)
    with map_rpc_errors():
        answer = await jobs.ListDeadLetters(request, timeout=RPC_TIMEOUT)
    return DeadLetters.from_pb(answer)


@final
class DeadRetry:
    """Sends a job's given-up and refused tasks again as new tasks of the job (see the module)."""

    def __init__(
        self,
        jobs: jobs_pb2_grpc.JobServiceAsyncStub,
        job_id: str,
        status: JobStatus,
        submit: Callable[[TaskMessage], Awaitable[str]],
    ) -> None:
        self._jobs = jobs
        self._job_id = job_id
        self._status = status
        self._submit = submit

    async def retry(self) -> dict[str, str]:
        """Sends every dead task that can run again; returns ``{old task id: new task id}``.

        Raises:
            FailedPrecondition: the job is closed or ended (nothing sent).
            NotFound: no such job.
        """
        if self._status.closed:
            raise FailedPrecondition(
                "FAILED_PRECONDITION",
                f"job {self._job_id!r} is closed: retry_dead() sends its dead tasks as new tasks of the"
                " job, which must be open; submit the dead letters' payloads into a new job instead",
            )
        sent: dict[str, str] = {}
        for _ in range(MAX_ROUNDS):
            letters = await read_dead_letters(self._jobs, self._job_id, limit=1000, bodies=True)
            due: dict[str, TaskMessage] = {}
            for letter in letters:
                task = letter.task
                if letter.reason is not DeadReason.POISON and task is not None and letter.task_id:
                    due.setdefault(letter.task_id, task)
            if not due:
                break
            for old_id, task in due.items():
                if old_id not in sent:
                    sent[old_id] = await self._submit(task)
            request = jobs_pb2.RemoveDeadLettersRequest(job_id=self._job_id, task_ids=list(due))
            with map_rpc_errors():
                removed = await self._jobs.RemoveDeadLetters(request, timeout=RPC_TIMEOUT)
            if not removed.removed:  # e.g. their broker went away: they stay, sent once here
                break
        return sent
