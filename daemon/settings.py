"""A job's settings as the daemon applies them, read from each assignment's ``JobSlots.settings``.

Zero values in the message mean the documented default, so a scheduler that sends no settings
(older, or a job created without any) gets graceful preemption, no timeout and 3 attempts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from truba.proto.v1 import common_pb2

DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_BACKOFF: Final = (1.0, 60.0)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What the daemon needs of a job's settings.

    ``immediate``: a slot taken away interrupts its running task (else the task finishes first).
    ``task_timeout``: seconds one attempt may run before its slot is killed (None: no limit).
    ``max_attempts``: attempts without an outcome before the task is given up (>= 1).
    ``priorities``: tasks put back into the queue are published with their own priority.
    ``frames``: small tasks and results are packed into frames under load (see truba.pipes.frame);
    False sends each in its own AMQP message (``no_frames`` in the message).
    ``retry_on``: names of exceptions after which a task that raised is tried again, after a
    backoff from ``backoff[0]`` doubling up to ``backoff[1]`` seconds (see
    :mod:`truba.daemon.retries`).
    ``pickle``: payloads and results are pickled (``codec`` "pickle"): run only with
    ``--allow-pickle``.
    ``preemption_grace``: seconds a task may still run on a slot taken from a graceful job before
    it is interrupted (None: no bound).
    """

    immediate: bool = False
    task_timeout: float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    priorities: bool = False
    frames: bool = True
    retry_on: frozenset[str] = frozenset()
    backoff: tuple[float, float] = DEFAULT_BACKOFF
    pickle: bool = False
    preemption_grace: float | None = None

    @classmethod
    def from_proto(cls, settings: common_pb2.JobSettings) -> JobSettings:
        return cls(
            immediate=settings.preemption == common_pb2.PREEMPTION_IMMEDIATE,
            task_timeout=settings.task_timeout if settings.task_timeout > 0 else None,
            max_attempts=settings.max_attempts or DEFAULT_MAX_ATTEMPTS,
            priorities=settings.priorities,
            frames=not settings.no_frames,
            retry_on=frozenset(settings.retry_on),
            backoff=(
                settings.backoff_initial or DEFAULT_BACKOFF[0],
                settings.backoff_max or max(DEFAULT_BACKOFF[1], settings.backoff_initial),
            ),
            pickle=settings.codec == "pickle",
            preemption_grace=settings.preemption_grace if settings.preemption_grace > 0 else None,
        )

    def to_proto(self) -> common_pb2.JobSettings:
        """The message form (what the daemon reports it runs with)."""
        return common_pb2.JobSettings(
            preemption=common_pb2.PREEMPTION_IMMEDIATE if self.immediate else common_pb2.PREEMPTION_GRACEFUL,
            task_timeout=self.task_timeout or 0.0,
            max_attempts=self.max_attempts,
            priorities=self.priorities,
            no_frames=not self.frames,
            retry_on=sorted(self.retry_on),
            backoff_initial=self.backoff[0],
            backoff_max=self.backoff[1],
            codec="pickle" if self.pickle else "",
            preemption_grace=self.preemption_grace or 0.0,
        )
