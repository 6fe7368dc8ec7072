"""Outcomes: what the client gets back for each task, exactly once."""

from __future__ import annotations

from dataclasses import dataclass

from truba.pipes.errors import TrubaError
from truba.wire import ErrorInfo, ResultMessage


class TaskFailed(TrubaError):
    """Raised by :meth:`Outcome.result` when the task's handler raised."""

    def __init__(self, task_id: str, error: ErrorInfo) -> None:
        super().__init__(f"task {task_id} failed: {error.type}: {error.message}")
        self.task_id = task_id
        self.error = error


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one task: ``ok`` with its ``value``, or not ok with its ``error``."""

    task_id: str
    ok: bool
    value: object = None
    error: ErrorInfo | None = None
    daemon_id: str = ""
    seconds: float = 0.0

    @classmethod
    def from_message(cls, message: ResultMessage) -> Outcome:
        return cls(
            message.task_id, message.ok, message.value, message.error, message.daemon_id, message.seconds
        )

    def result(self) -> object:
        """The value, or raises :class:`TaskFailed` carrying the remote error."""
        if not self.ok:
            raise TaskFailed(self.task_id, self.error or ErrorInfo("UnknownError", ""))
        return self.value
