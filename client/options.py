"""Job options as the SDK spells them, and their ``truba.v1.JobSettings`` form."""

from __future__ import annotations

import os
from typing import Final, Literal, TypedDict, Unpack

from truba.pipes.broker import BrokerFactory
from truba.pipes.fsync import FsyncPolicy
from truba.proto.v1 import common_pb2, jobs_pb2_grpc

Preemption = Literal["graceful", "immediate"]
"""How the job's slots are taken when the scheduler gives them to a more important job:
``"graceful"`` at the end of the running task, ``"immediate"`` by interrupting it (the task goes
back to its queue and runs again later, without counting an attempt)."""

QueueType = Literal["quorum", "classic"]
"""RabbitMQ queue type of the job's task and result queues: ``"quorum"`` (replicated, fsynced
before the broker confirms) or ``"classic"`` (faster, not replicated)."""

_PREEMPTION: Final = {
    "graceful": common_pb2.PREEMPTION_GRACEFUL,
    "immediate": common_pb2.PREEMPTION_IMMEDIATE,
}
_QUEUE_TYPE: Final = {"quorum": common_pb2.QUEUE_TYPE_QUORUM, "classic": common_pb2.QUEUE_TYPE_CLASSIC}


class JobOptions(TypedDict, total=False):
    """A job's settings, as keyword arguments of ``create_job`` (each optional).

    Attributes:
        min_slots, max_slots: bounds on the job's slots (``max_slots`` None: no upper bound).
        preemption: see :data:`Preemption` (default ``"graceful"``).
        task_timeout: seconds an attempt may run before its slot is killed (None: no limit; at
            most the brokers' consumer_timeout).
        max_attempts: attempts before a task is given up (None: the scheduler's default, 3).
        queue_type: see :data:`QueueType` (default ``"quorum"``).
        priorities: tasks may carry a priority 0-9 (``submit(..., priority=p)``), higher ones
            taken first; needs ``queue_type="classic"`` (RabbitMQ 3.x).
        frames: pack small tasks and results into frames under load (default True); False sends
            each in its own AMQP message.
    """

    min_slots: int
    max_slots: int | None
    preemption: Preemption
    task_timeout: float | None
    max_attempts: int | None
    queue_type: QueueType
    priorities: bool
    frames: bool


def settings_pb(**options: Unpack[JobOptions]) -> common_pb2.JobSettings:
    """The settings message of ``options``; None means the scheduler's default.

    Raises:
        ValueError: an unknown ``preemption`` or ``queue_type``, a negative number (the
            scheduler checks ranges too and names the field), or a ``frames`` that is not a bool.
    """
    min_slots = options.get("min_slots", 0)
    max_slots = options.get("max_slots")
    preemption = options.get("preemption", "graceful")
    task_timeout = options.get("task_timeout")
    max_attempts = options.get("max_attempts")
    queue_type = options.get("queue_type", "quorum")
    priorities = options.get("priorities", False)
    frames = options.get("frames", True)
    if preemption not in _PREEMPTION:
        raise ValueError(f"preemption: must be one of {sorted(_PREEMPTION)}, got {preemption!r}")
    if queue_type not in _QUEUE_TYPE:
        raise ValueError(f"queue_type: must be one of {sorted(_QUEUE_TYPE)}, got {queue_type!r}")
    for name, value in (("min_slots", min_slots), ("max_slots", max_slots), ("max_attempts", max_attempts)):
        if value is not None and value < 0:
            raise ValueError(f"{name}: must be >= 0, got {value}")
    if priorities and queue_type != "classic":
        raise ValueError('priorities: need queue_type="classic" (quorum queues of RabbitMQ 3.x have none)')
    if not isinstance(frames, bool):
        raise ValueError(f"frames: must be True or False, got {frames!r}")
    if task_timeout is not None and not task_timeout > 0:
        raise ValueError(f"task_timeout: must be > 0 seconds (or None for no limit), got {task_timeout}")
    return common_pb2.JobSettings(
        min_slots=min_slots,
        max_slots=max_slots or 0,
        preemption=_PREEMPTION[preemption],
        task_timeout=task_timeout or 0.0,
        max_attempts=max_attempts or 0,
        queue_type=_QUEUE_TYPE[queue_type],
        priorities=priorities,
        no_frames=not frames,
    )


class ClientOptions(TypedDict, total=False):
    """Keyword arguments of :class:`~truba.client.Client` (and :func:`~truba.client.connect`);
    see ``Client.__init__`` for each."""

    max_unconfirmed: int
    result_prefetch: int
    max_payload: int
    broker_heartbeat: float
    journal: str | os.PathLike[str] | Literal[False] | None
    journal_fsync: FsyncPolicy
    token: str | None
    tls_ca: str | os.PathLike[str] | None
    unavailable_after: float
    brokers: BrokerFactory | None
    scheduler: jobs_pb2_grpc.JobServiceAsyncStub | None
