"""Checks on request fields; each failure is an :class:`InvalidArgument` naming the field first.

The checks return the cleaned value, so a caller reads ``handler = check_handler(request.handler)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

from truba.proto.v1 import common_pb2
from truba.scheduler.errors import InvalidArgument
from truba.scheduler.model import DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, JobSettings, Preemption, QueueType

MAX_HANDLER: Final = 512
MAX_NAME: Final = 200
MAX_ID: Final = 64
MAX_SUBMITTED: Final = 2**63 - 1
"""SQLite integers are signed 64-bit."""

_JOB_ID: Final = re.compile(r"[a-z0-9]+")


def check_handler(handler: str) -> str:
    """``package.module:function``: dotted identifiers, a colon, a dotted attribute path.

    Raises:
        InvalidArgument: empty, too long, or not of that shape.
    """
    if not handler:
        raise InvalidArgument("handler", "required")
    if len(handler) > MAX_HANDLER:
        raise InvalidArgument("handler", f"must be at most {MAX_HANDLER} characters, got {len(handler)}")
    module, colon, function = handler.partition(":")
    if not (colon and _dotted(module) and _dotted(function)):
        raise InvalidArgument("handler", f"must look like 'package.module:function', got {handler!r}")
    return handler


def _dotted(path: str) -> bool:
    return all(part.isidentifier() for part in path.split("."))


def check_importance(importance: float) -> float:
    """A finite number > 0: the job's weight in the fair share.

    Raises:
        InvalidArgument: zero (also what an unset field reads as), negative, NaN or infinite.
    """
    if importance == 0:  # also what an unset field reads as
        raise InvalidArgument("importance", "required: a finite number > 0 (got 0 or none)")
    if not (math.isfinite(importance) and importance > 0):
        raise InvalidArgument("importance", f"must be a finite number > 0, got {importance:g}")
    return importance


def check_name(name: str) -> str:
    """An optional display name, at most :data:`MAX_NAME` characters, surrounding blanks removed.

    Raises:
        InvalidArgument: too long.
    """
    name = name.strip()
    if len(name) > MAX_NAME:
        raise InvalidArgument("name", f"must be at most {MAX_NAME} characters, got {len(name)}")
    return name


def check_job_id(job_id: str) -> str:
    """A job id as the scheduler makes them: ``[a-z0-9]+``.

    Raises:
        InvalidArgument: empty or malformed (a well-formed unknown id is NotFound, elsewhere).
    """
    if not job_id:
        raise InvalidArgument("job_id", "required")
    if len(job_id) > MAX_ID or not _JOB_ID.fullmatch(job_id):
        raise InvalidArgument("job_id", f"must match [a-z0-9]+ (at most {MAX_ID} characters), got {job_id!r}")
    return job_id


def check_submitted(submitted: int, *, field: str = "submitted") -> int:
    """A task count a client reports (``field`` names it in the error).

    Raises:
        InvalidArgument: above what the store can hold.
    """
    if submitted > MAX_SUBMITTED:
        raise InvalidArgument(field, f"must be at most {MAX_SUBMITTED}, got {submitted}")
    return submitted


def check_daemon_id(daemon_id: str) -> str:
    """A daemon's self-chosen id: non-empty, printable, at most :data:`MAX_NAME` characters.

    Raises:
        InvalidArgument: empty, too long or with control characters.
    """
    if not daemon_id:
        raise InvalidArgument("daemon_id", "required")
    if len(daemon_id) > MAX_NAME or not daemon_id.isprintable():
        raise InvalidArgument(
            "daemon_id", f"must be printable and at most {MAX_NAME} characters, got {daemon_id!r}"
        )
    return daemon_id


def check_slots(slots: int) -> int:
    """A daemon's slot count: at least 1.

    Raises:
        InvalidArgument: zero.
    """
    if slots < 1:
        raise InvalidArgument("slots", f"must be at least 1, got {slots}")
    return slots


MAX_SLOTS_SETTING: Final = 1_000_000
MAX_ATTEMPTS: Final = 1000
MAX_RETRY_ON: Final = 64
MAX_BACKOFF: Final = 24 * 3600.0
_CODECS: Final = {"": "msgpack", "msgpack": "msgpack", "pickle": "pickle"}

_PREEMPTION: Final = {
    common_pb2.PREEMPTION_UNSPECIFIED: Preemption.GRACEFUL,
    common_pb2.PREEMPTION_GRACEFUL: Preemption.GRACEFUL,
    common_pb2.PREEMPTION_IMMEDIATE: Preemption.IMMEDIATE,
}
_QUEUE_TYPE: Final = {
    common_pb2.QUEUE_TYPE_UNSPECIFIED: QueueType.QUORUM,
    common_pb2.QUEUE_TYPE_QUORUM: QueueType.QUORUM,
    common_pb2.QUEUE_TYPE_CLASSIC: QueueType.CLASSIC,
}


def check_settings(settings: common_pb2.JobSettings, *, consumer_timeout: float) -> JobSettings:
    """A job's settings with defaults filled in; each error names its field (``settings.x``).

    ``consumer_timeout`` is the brokers' delivery-ack timeout in seconds: daemons ack a task only
    after its result is confirmed, so a task allowed to run longer would be redelivered by the
    broker while it still runs (RabbitMQ's ``consumer_timeout``: see docs/scheduler.md).

    Raises:
        InvalidArgument: a value out of range, an unknown enum value, or a setting not supported.
    """
    if settings.min_slots > MAX_SLOTS_SETTING:
        raise InvalidArgument(
            "settings.min_slots", f"must be at most {MAX_SLOTS_SETTING}, got {settings.min_slots}"
        )
    if settings.HasField("max_slots") and settings.max_slots == 0:
        raise InvalidArgument("settings.max_slots", "must be at least 1 (leave it unset for no limit), got 0")
    if settings.HasField("max_attempts") and settings.max_attempts == 0:
        raise InvalidArgument(
            "settings.max_attempts", "must be at least 1 (leave it unset for the default), got 0"
        )
    if settings.max_slots > MAX_SLOTS_SETTING:
        raise InvalidArgument(
            "settings.max_slots", f"must be at most {MAX_SLOTS_SETTING}, got {settings.max_slots}"
        )
    if settings.max_slots and settings.max_slots < settings.min_slots:
        raise InvalidArgument(
            "settings.max_slots",
            f"must be 0 (no limit) or at least min_slots={settings.min_slots}, got {settings.max_slots}",
        )
    preemption = _PREEMPTION.get(settings.preemption)
    if preemption is None:
        raise InvalidArgument("settings.preemption", f"unknown value {settings.preemption}")
    queue_type = _QUEUE_TYPE.get(settings.queue_type)
    if queue_type is None:
        raise InvalidArgument("settings.queue_type", f"unknown value {settings.queue_type}")
    timeout = settings.task_timeout
    if not (math.isfinite(timeout) and timeout >= 0):
        raise InvalidArgument("settings.task_timeout", f"must be a finite number >= 0, got {timeout:g}")
    if timeout > consumer_timeout:
        raise InvalidArgument(
            "settings.task_timeout",
            f"{timeout:g}s exceeds the brokers' consumer_timeout of {consumer_timeout:g}s: the broker would"
            " redeliver a task still running; raise consumer_timeout in rabbitmq.conf and the scheduler's"
            " --consumer-timeout, or lower the task timeout",
        )
    if settings.max_attempts > MAX_ATTEMPTS:
        raise InvalidArgument(
            "settings.max_attempts", f"must be at most {MAX_ATTEMPTS}, got {settings.max_attempts}"
        )
    if settings.priorities and queue_type is not QueueType.CLASSIC:
        raise InvalidArgument(
            "settings.priorities",
            "needs queue_type classic: quorum queues of RabbitMQ 3.x have no priorities",
        )
    codec = _CODECS.get(settings.codec)
    if codec is None:
        raise InvalidArgument("settings.codec", f"must be one of 'msgpack', 'pickle', got {settings.codec!r}")
    grace = settings.preemption_grace
    if not (math.isfinite(grace) and grace >= 0):
        raise InvalidArgument("settings.preemption_grace", f"must be a finite number >= 0, got {grace:g}")
    if grace > 0 and preemption is Preemption.IMMEDIATE:
        raise InvalidArgument(
            "settings.preemption_grace",
            "bounds graceful preemption; with immediate preemption tasks are interrupted at once",
        )
    backoff_initial, backoff_max = check_backoff(settings.backoff_initial, settings.backoff_max)
    if settings.retry_on and backoff_max + timeout > consumer_timeout:
        raise InvalidArgument(
            "settings.backoff_max",
            f"{backoff_max:g}s (+ task_timeout {timeout:g}s) exceeds the brokers' consumer_timeout of"
            f" {consumer_timeout:g}s: a task waits out its retry backoff holding its delivery; lower it",
        )
    return JobSettings(
        min_slots=settings.min_slots,
        max_slots=settings.max_slots,
        preemption=preemption,
        task_timeout=timeout,
        max_attempts=settings.max_attempts or DEFAULT_MAX_ATTEMPTS,
        queue_type=queue_type,
        priorities=settings.priorities,
        frames=not settings.no_frames,
        retry_on=check_retry_on(settings.retry_on),
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
        codec=codec,
        preemption_grace=grace,
    )


def check_retry_on(names: Sequence[str]) -> tuple[str, ...]:
    """Exception names as ``retry_on`` lists them: dotted identifiers, at most :data:`MAX_RETRY_ON`.

    Raises:
        InvalidArgument: too many, or one that is not a dotted name.
    """
    if len(names) > MAX_RETRY_ON:
        raise InvalidArgument("settings.retry_on", f"at most {MAX_RETRY_ON} names, got {len(names)}")
    for name in names:
        if not (0 < len(name) <= MAX_HANDLER and _dotted(name)):
            raise InvalidArgument(
                "settings.retry_on", f"must list names like 'package.module.Error', got {name!r}"
            )
    return tuple(dict.fromkeys(names))


def check_backoff(initial: float, longest: float) -> tuple[float, float]:
    """A retry backoff's first and longest wait in seconds, 0 meaning the default of each.

    Raises:
        InvalidArgument: negative, not finite, above a day, or a longest below the first.
    """
    for field, value in (("backoff_initial", initial), ("backoff_max", longest)):
        if not (math.isfinite(value) and 0 <= value <= MAX_BACKOFF):
            raise InvalidArgument(
                f"settings.{field}", f"must be 0 (default) to {MAX_BACKOFF:g} seconds, got {value:g}"
            )
    initial = initial or DEFAULT_BACKOFF[0]
    longest = longest or max(DEFAULT_BACKOFF[1], initial)
    if longest < initial:
        raise InvalidArgument(
            "settings.backoff_max", f"must be at least backoff_initial={initial:g}, got {longest:g}"
        )
    return initial, longest
