"""Job options as the SDK spells them, checked strictly, and their ``truba.v1.JobSettings`` form.

Every option is checked before anything is sent: an unknown name is a ``TypeError`` naming the
nearest valid one (a misspelt ``task_timout=1`` must not run silently with no timeout), a bad
value an :class:`~truba.client.errors.InvalidArgument` naming the option. The scheduler checks
the same limits again for other clients.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal, TypedDict, Unpack

from truba.client.errors import InvalidArgument
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

Codec = Literal["msgpack", "pickle"]
"""How payloads and results travel: ``"msgpack"`` (with truba's extension types for datetimes,
dates, UUIDs, Decimals and numpy arrays, see :mod:`truba.codec`) or ``"pickle"`` (any picklable
object; run only by daemons started with ``--allow-pickle``: unpickling is code execution)."""

RetryOn = Sequence[type[BaseException] | str]
"""Exception classes, or their dotted names (``"mypkg.errors.Busy"``), to retry a task on."""

_PREEMPTION: Final = {
    "graceful": common_pb2.PREEMPTION_GRACEFUL,
    "immediate": common_pb2.PREEMPTION_IMMEDIATE,
}
_QUEUE_TYPE: Final = {"quorum": common_pb2.QUEUE_TYPE_QUORUM, "classic": common_pb2.QUEUE_TYPE_CLASSIC}
_CODEC: Final = {"msgpack": "", "pickle": "pickle"}
MAX_RETRY_ON: Final = 64
"""Exception names ``retry_on`` may list (the scheduler's limit too)."""


class JobOptions(TypedDict, total=False):
    """A job's settings, as keyword arguments of ``create_job`` (each optional).

    Attributes:
        min_slots: slots the job gets whenever the cluster has them (default 0). More than the
            connected daemons have is accepted (daemons may join later); the job's ``problem``
            says so meanwhile. Above ``max_slots`` it is refused.
        max_slots: the most slots the job gets (None, the default: no upper bound; at least 1).
        preemption: see :data:`Preemption` (default ``"graceful"``).
        preemption_grace: with graceful preemption, seconds a task may still run on a slot taken
            from the job before it is interrupted and goes back to its queue unspent (None, the
            default: it finishes however long it takes).
        task_timeout: seconds an attempt may run before its slot is killed (None: no limit; at
            most the brokers' consumer_timeout).
        max_attempts: attempts per task, at least 1 (None: the scheduler's default, 3). Counts
            the attempts that ended without an outcome and the retries of ``retry_on``.
        queue_type: see :data:`QueueType` (default ``"quorum"``).
        priorities: tasks may carry a priority 0-9 (``submit(..., priority=p)``), higher ones
            taken first; needs ``queue_type="classic"`` (RabbitMQ 3.x).
        frames: pack small tasks and results into frames under load (default True); False sends
            each in its own AMQP message.
        retry_on: exceptions (classes or dotted names; subclasses match) after which a task is
            tried again, up to ``max_attempts``, after a backoff; any other exception is the
            task's outcome at once (default: none).
        backoff: ``(initial, max)`` seconds between a task's retries: ``initial`` before the
            first, doubled for each one after, capped at ``max``, with jitter (default (1, 60)).
        codec: see :data:`Codec` (default ``"msgpack"``).
    """

    min_slots: int
    max_slots: int | None
    preemption: Preemption
    preemption_grace: float | None
    task_timeout: float | None
    max_attempts: int | None
    queue_type: QueueType
    priorities: bool
    frames: bool
    retry_on: RetryOn
    backoff: tuple[float, float]
    codec: Codec


JOB_OPTIONS: Final = frozenset(JobOptions.__annotations__)


def check_names(given: Iterable[str], valid: Iterable[str]) -> None:
    """Refuses a keyword that is not a valid option, naming the nearest one.

    Raises:
        TypeError: ``unknown option 'task_timout'; did you mean 'task_timeout'?``.
    """
    names = sorted(set(valid))
    for name in given:
        if name in names:
            continue
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid options: {', '.join(names)}"
        raise TypeError(f"unknown option {name!r}; {hint}")


def _invalid(option: str, problem: str) -> InvalidArgument:
    return InvalidArgument("INVALID_ARGUMENT", f"{option}: {problem}")


def _count(option: str, value: object, *, least: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):  # numpy ints too
        raise _invalid(option, f"must be an int, got {value!r}")
    if value < least:
        raise _invalid(option, f"must be at least {least}, got {value}")
    return int(value)


def _seconds(option: str, value: object) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise _invalid(option, f"must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise _invalid(option, f"must be a finite number > 0, got {value!r}")
    return seconds


def check_importance(importance: object) -> float:
    """A finite number > 0.

    Raises:
        InvalidArgument: anything else (None, a string, zero, NaN, ...), named as given.
    """
    if isinstance(importance, bool) or not isinstance(importance, numbers.Real):
        raise _invalid("importance", f"must be a finite number > 0, got {importance!r}")
    weight = float(importance)
    if not (math.isfinite(weight) and weight > 0):
        raise _invalid("importance", f"must be a finite number > 0, got {importance!r}")
    return weight


def exception_name(kind: type[BaseException] | str) -> str:
    """How ``retry_on`` names an exception on the wire: ``module.Qualname``, or the bare name of
    a builtin (as the slot reports the names of a raised exception's classes).

    Raises:
        InvalidArgument: not an exception class, or a string that is not a dotted name.
    """
    if isinstance(kind, str):
        if not kind or not all(part.isidentifier() for part in kind.split(".")):
            raise _invalid("retry_on", f"a name must look like 'package.module.Error', got {kind!r}")
        return kind.removeprefix("builtins.")
    if isinstance(kind, type) and issubclass(kind, BaseException):
        if "<locals>" in kind.__qualname__:
            raise _invalid(
                "retry_on", f"{kind.__qualname__} is defined in a function: daemons cannot name it"
            )
        return (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
    raise _invalid("retry_on", f"must list exception classes or their dotted names, got {kind!r}")


def _retry_on(value: object) -> list[str]:
    if isinstance(value, str | type) or not isinstance(value, Sequence):
        raise _invalid("retry_on", f"must be a sequence of exception classes or names, got {value!r}")
    if len(value) > MAX_RETRY_ON:
        raise _invalid("retry_on", f"at most {MAX_RETRY_ON} exceptions, got {len(value)}")
    return list(dict.fromkeys(exception_name(kind) for kind in value))


def _backoff(value: object) -> tuple[float, float]:
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise _invalid("backoff", f"must be (initial, max) seconds, got {value!r}")
    initial, longest = _seconds("backoff", value[0]), _seconds("backoff", value[1])
    if longest < initial:
        raise _invalid("backoff", f"max must be at least initial, got {value!r}")
    return initial, longest


def settings_pb(**options: Unpack[JobOptions]) -> common_pb2.JobSettings:
    """The settings message of ``options``; an option left out takes the scheduler's default.

    Raises:
        TypeError: an unknown option (the message names the nearest valid one).
        InvalidArgument: a value of the wrong kind or out of range (the message names the
            option); the scheduler checks ranges too.
    """
    check_names(options, JOB_OPTIONS)
    given: Mapping[str, object] = options
    min_slots = _count("min_slots", given.get("min_slots", 0), least=0)
    max_slots = given.get("max_slots")
    if max_slots is not None:
        max_slots = _count("max_slots", max_slots, least=1)
        if max_slots < min_slots:
            raise _invalid("max_slots", f"must be at least min_slots={min_slots}, got {max_slots}")
    max_attempts = given.get("max_attempts")
    if max_attempts is not None:
        max_attempts = _count("max_attempts", max_attempts, least=1)
    preemption = given.get("preemption", "graceful")
    if preemption not in _PREEMPTION:
        raise _invalid("preemption", f"must be one of {sorted(_PREEMPTION)}, got {preemption!r}")
    queue_type = given.get("queue_type", "quorum")
    if queue_type not in _QUEUE_TYPE:
        raise _invalid("queue_type", f"must be one of {sorted(_QUEUE_TYPE)}, got {queue_type!r}")
    codec = given.get("codec", "msgpack")
    if codec not in _CODEC:
        raise _invalid("codec", f"must be one of {sorted(_CODEC)}, got {codec!r}")
    priorities, frames = given.get("priorities", False), given.get("frames", True)
    for name, flag in (("priorities", priorities), ("frames", frames)):
        if not isinstance(flag, bool):
            raise _invalid(name, f"must be True or False, got {flag!r}")
    if priorities and queue_type != "classic":
        raise _invalid("priorities", 'needs queue_type="classic" (quorum queues of RabbitMQ 3.x have none)')
    task_timeout = given.get("task_timeout")
    if task_timeout is not None:
        task_timeout = _seconds("task_timeout", task_timeout)
    grace = given.get("preemption_grace")
    if grace is not None:
        grace = _seconds("preemption_grace", grace)
        if preemption != "graceful":
            raise _invalid("preemption_grace", 'bounds graceful preemption; not with preemption="immediate"')
    retry_on = _retry_on(given.get("retry_on", ()))
    backoff = _backoff(given["backoff"]) if "backoff" in given else (0.0, 0.0)
    return common_pb2.JobSettings(
        min_slots=min_slots,
        max_slots=max_slots,
        preemption=_PREEMPTION[str(preemption)],
        task_timeout=task_timeout or 0.0,
        max_attempts=max_attempts,
        queue_type=_QUEUE_TYPE[str(queue_type)],
        priorities=bool(priorities),
        no_frames=not frames,
        retry_on=retry_on,
        backoff_initial=backoff[0],
        backoff_max=backoff[1],
        codec=_CODEC[str(codec)],
        preemption_grace=grace or 0.0,
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
