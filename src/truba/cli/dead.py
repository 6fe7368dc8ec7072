"""``truba job ID --dead``: a job's dead letters, as a table or ``--json``.

The scheduler reads every broker's dead-letter queue of the job without consuming it
(``ListDeadLetters``, as :meth:`truba.client.Job.dead_letters` does; the answer is read here as
it comes, so that every command does not pay for importing the client). ``--limit N`` shows the
first N (the scheduler reads at most N per broker); a list cut short says so under the table and
as ``"truncated": true``.
"""

from __future__ import annotations

from typing import Final

from truba.cli.exits import OK, USAGE, CliError
from truba.cli.render import Row, iso_time, print_json, print_table
from truba.cli.session import Session
from truba.proto.v1 import jobs_pb2, jobs_pb2_grpc

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
"""The most the scheduler lists per broker in one answer."""
ERROR_WIDTH: Final = 80
"""Characters of an error's message a table row shows (``--json`` has all of it)."""


def check_limit(limit: int) -> None:
    """Raises:
    CliError: ``limit`` is not 1 to :data:`MAX_LIMIT` (:data:`~truba.cli.exits.USAGE`).
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise CliError(f"--limit must be 1 to {MAX_LIMIT}, not {limit}", USAGE)


def show_dead_letters(s: Session, job_id: str, *, limit: int, as_json: bool) -> int:
    """Prints the first ``limit`` dead letters of ``job_id``."""
    check_limit(limit)
    stub = jobs_pb2_grpc.JobServiceStub(s.channel)
    answer = s.call(stub.ListDeadLetters, jobs_pb2.ListDeadLettersRequest(job_id=job_id, limit=limit))
    shown = answer.dead_letters[:limit]
    truncated = answer.truncated or len(answer.dead_letters) > limit
    if as_json:
        print_json(
            {
                "job_id": job_id,
                "dead_letters": [letter_dict(letter) for letter in shown],
                "unreachable": list(answer.unreachable),
                "truncated": truncated,
                "kept_until": iso_time(answer.kept_until),
            }
        )
        return OK
    if not shown:
        print(f"job {job_id}: no dead letters")
    else:
        rows = [
            [letter.task_id or "-", _reason(letter), letter.attempts or "-", _where(letter)]
            + [_error(letter)]
            for letter in shown
        ]
        print_table(["TASK", "REASON", "ATTEMPTS", "BROKER", "ERROR"], rows, right=frozenset({2}))
    for broker in answer.unreachable:
        print(f"not read: {broker}")
    if truncated:
        print(f"(more are kept than the {limit} shown: --limit up to {MAX_LIMIT})")
    if answer.kept_until:
        print(f"kept until {iso_time(answer.kept_until)}")
    return OK


def letter_dict(letter: jobs_pb2.DeadLetter) -> Row:
    """One dead letter as ``--json`` prints it."""
    return {
        "task_id": letter.task_id,
        "reason": _reason(letter),
        "error_type": letter.error_type,
        "error_message": letter.error_message,
        "traceback": letter.traceback,
        "attempts": letter.attempts,
        "broker": letter.broker,
        "daemon_id": letter.daemon_id,
        "size": letter.size,
    }


def _reason(letter: jobs_pb2.DeadLetter) -> str:
    """``gave_up``, ``poison`` or ``refused`` (what the client calls :class:`~truba.client.DeadReason`)."""
    return jobs_pb2.DeadLetterReason.Name(letter.reason).removeprefix("DEAD_LETTER_REASON_").lower()


def _where(letter: jobs_pb2.DeadLetter) -> str:
    return letter.broker + (f" ({letter.daemon_id})" if letter.daemon_id else "")


def _error(letter: jobs_pb2.DeadLetter) -> str:
    message = " ".join(letter.error_message.split())  # one row, whatever the message holds
    if len(message) > ERROR_WIDTH:
        message = message[: ERROR_WIDTH - 1] + "…"
    return f"{letter.error_type}: {message}" if letter.error_type else message or "-"
