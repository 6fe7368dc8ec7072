"""Outcomes: what the client gets back for each task, exactly once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from truba.errors import TrubaError
from truba.wire import ErrorInfo, ResultMessage


class TaskFailed(TrubaError):
    """Raised by :meth:`Outcome.result` when the task's handler raised."""

    def __init__(self, task_id: str, error: ErrorInfo) -> None:
        super().__init__(f"task {task_id} failed: {error.type}: {error.message}")
        self.task_id = task_id
        self.error = error


class TaskGaveUp(TaskFailed):
    """Raised by :meth:`Outcome.result` when every attempt of the task ended without an outcome.

    A subclass of :class:`TaskFailed`, so code that handles failures handles give-ups too;
    ``error`` says what ended the last attempt (``TaskTimeout``, ``SlotDied``, ...).
    """

    def __init__(self, task_id: str, error: ErrorInfo, attempts: int) -> None:
        TrubaError.__init__(
            self, f"task {task_id} gave up after {attempts} attempts: {error.type}: {error.message}"
        )
        self.task_id = task_id
        self.error = error
        self.attempts = attempts


class TaskCancelled(TaskFailed):
    """Raised by :meth:`Outcome.result` for a task whose job was cancelled before it finished."""

    def __init__(self, task_id: str) -> None:
        TrubaError.__init__(self, f"task {task_id} was cancelled with its job")
        self.task_id = task_id
        self.error = CANCELLED


CANCELLED = ErrorInfo("JobCancelled", "the job was cancelled before this task had an outcome")

R = TypeVar("R", default=Any)
"""What the job's handler returns: ``Outcome[R].result()`` is an R (Any for a handler given by name)."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    """The outcome of one task: ``ok`` with its ``value``, or not ok with its ``error``.

    ``gave_up`` marks a task whose every attempt ended without an outcome (timed out, crashed
    its slot, ran out of memory, or lost its daemon), ``max_attempts`` times; ``error`` then
    says what ended the last one. ``attempts`` counts the attempts made, this one included.
    ``cancelled`` marks a task whose job was cancelled before it had an outcome. ``R`` is what
    the handler returns (see ``Client.create_job``).
    """

    task_id: str
    ok: bool
    value: R | None = None
    error: ErrorInfo | None = None
    daemon_id: str = ""
    seconds: float = 0.0
    attempts: int = 1
    gave_up: bool = False
    cancelled: bool = False

    @classmethod
    def cancelled_task(cls, task_id: str) -> Outcome:
        """The outcome of a task cancelled with its job."""
        return cls(task_id, ok=False, error=CANCELLED, attempts=0, cancelled=True)

    @classmethod
    def from_message(cls, message: ResultMessage) -> Outcome:
        return cls(
            message.task_id,
            message.ok,
            cast(Any, message.value),  # the handler's R, as far as the type checker is told
            message.error,
            message.daemon_id,
            message.seconds,
            message.attempts,
            message.gave_up,
        )

    def result(self) -> R:
        """The value, or raises :class:`TaskFailed` (:class:`TaskGaveUp` for a give-up,
        :class:`TaskCancelled` for a cancelled task)."""
        if not self.ok:
            error = self.error or ErrorInfo("UnknownError", "")
            if self.cancelled:
                raise TaskCancelled(self.task_id)
            if self.gave_up:
                raise TaskGaveUp(self.task_id, error, self.attempts)
            raise TaskFailed(self.task_id, error)
        return cast(R, self.value)
