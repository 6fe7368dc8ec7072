"""What travels through a job's pipes: task and result messages, and their msgpack codecs.

Both are msgpack arrays whose first element is a format version, so the format can evolve and
anything else is recognised as foreign. Payloads and results are msgpack values (None, bool,
int, float, str, bytes, lists, dicts) and truba's extension types (datetimes, dates, UUIDs,
Decimals, numpy arrays: :mod:`truba.codec`); anything else is refused with a CodecError that
says so.

Format 1 has a fixed head and an optional map of *extras* after it::

    task:   [1, task_id, payload]         + [{"attempts": n, "priority": p, "not_before": t, "expires": t,
                                                  "copy_id": c}]
    result: [1, task_id, ok, value | [type, message, tb], daemon, seconds]
                                                                   + [{"attempts": n, "gave_up": true}]

The job's result log also holds *hand-back records* (:class:`HandedBack`), a map
``{"kind": "handed_back", "task_id": ..., "original": c, "copy": c2}``: not format 1, so a result
reader refuses them as foreign.

An extra is written only when it differs from its default, so a fresh task or a first-attempt
result is byte-for-byte what readers without extras expect; readers ignore extras they do not
know and anything after the map (the next field goes there without a new format number).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import msgpack

from truba import codec
from truba.pipes.errors import CodecError

FORMAT: Final = 1


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One task: its id (unique within the job) and the handler's argument.

    ``attempts`` counts the attempts already spent on it without an outcome (the slot crashed,
    timed out or ran out of memory, or its daemon or broker connection died); a fresh task has 0.
    Attempts interrupted on purpose (preemption, draining) are not spent. ``priority`` (0-9,
    jobs created with priorities only) travels in the body too, so a task put back into its
    queue keeps it.
    """

    task_id: str
    payload: object
    attempts: int = 0
    priority: int = 0
    not_before: float = 0.0
    """A delayed task's due time (Unix time; 0: none): the brokers held it until then. In the
    body so that the client's journal knows it when the task is sent again."""
    expires: float = 0.0
    """A time (Unix; 0: never) after which the task is not run any more: a daemon that gets it
    later gives it up at once (``RunExpired``). A schedule's run carries one, so that runs sent
    while no daemon served the schedule do not all run when one comes back."""
    copy_id: int = 0
    """Which copy of the task this is: 0 as the client sent it; a random 63-bit number (never 0)
    on each copy a daemon puts back into the queue (a hand-back, a preemption, a retry, a recount).
    A hand-back record (:class:`HandedBack`) names the copy it replaced, so a redelivered frame
    skips that one and never the copy that replaced it."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a task failed: exception type, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class ResultMessage:
    """The outcome of one task as a daemon reports it: a value, an error, or a give-up.

    ``attempts`` is the number of attempts made, the one that produced this outcome included.
    ``gave_up`` marks a task that spent all its attempts without an outcome; ``error`` then says
    what ended the last one (e.g. ``TaskTimeout``).
    """

    task_id: str
    ok: bool
    value: object = None
    error: ErrorInfo | None = None
    daemon_id: str = ""
    seconds: float = 0.0
    attempts: int = 1
    gave_up: bool = False


M = TypeVar("M")
ResultMaker = Callable[[str, bool, object, "ErrorInfo | None", str, float, int, bool], M]
"""What :meth:`ResultCodec.decode_as` builds a decoded result with, from ``(task_id, ok, value,
error, daemon_id, seconds, attempts, gave_up)``: :class:`ResultMessage` itself, or the client's
``Outcome``."""


@dataclass(frozen=True, slots=True)
class GaveUpRecord:
    """What a daemon leaves in a job's dead-letter queue for a task it gave up on.

    ``body`` is the task message as it was delivered (encoded), so it can be inspected and
    resubmitted. Poison messages (undecodable) get a different record from the pipes, with
    ``kind == "poison"``; both are msgpack maps with ``kind``, ``error`` and ``body``.
    """

    task_id: str
    attempts: int
    error: ErrorInfo
    daemon_id: str
    body: bytes


def _pack(obj: object, what: str, task_id: str = "") -> bytes:
    """``obj`` as msgpack; CodecError naming ``what`` (with ``task_id`` in its ``{}``, formatted
    only then: every task and result passes here) if it cannot be sent."""
    try:
        return codec.packb(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        named = what.format(task_id) if task_id else what
        raise CodecError(f"{named} is not msgpack-serializable: {exc}") from exc


def _pack_fields(fields: list[object], large: object, what: str, task_id: str = "") -> bytes:
    """``_pack(fields)``; when ``large`` (one of the fields: a payload, a value) is a large
    ``bytes`` or pickled value, it is copied once into the message, not twice (see
    :func:`truba.codec.pack_parts`)."""
    if not codec.is_large(large):
        return _pack(fields, what, task_id)
    try:
        return b"".join(codec.pack_parts(fields))
    except (TypeError, ValueError, OverflowError) as exc:
        named = what.format(task_id) if task_id else what
        raise CodecError(f"{named} is not msgpack-serializable: {exc}") from exc


def _unpack(data: bytes, what: str) -> list[object]:
    try:
        obj = codec.unpackb(data)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CodecError(f"{what}: not msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, list) or not obj or obj[0] != FORMAT:
        raise CodecError(f"{what}: not a truba v{FORMAT} message")
    return obj


def _extras(obj: list[object], head: int, what: str) -> dict[object, object]:
    """The extras map after a message's ``head`` fields ({} when absent)."""
    if len(obj) <= head:
        return {}
    extras = obj[head]
    if not isinstance(extras, dict):
        raise CodecError(f"{what}: element {head} must be a map of extras")
    return extras


def _record(data: bytes, kind: str, what: str) -> dict[object, object]:
    """A record of the result log or the dead letters: a msgpack map whose "kind" is ``kind``."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CodecError(f"{what}: not msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise CodecError(f"{what}: not a {kind} record")
    return obj


def _count(extras: dict[object, object], key: str, default: int, what: str) -> int:
    value = extras.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CodecError(f"{what}: {key} must be an int >= 0, got {value!r:.40}")
    return value


def _time(extras: dict[object, object], key: str) -> float:
    value = extras.get(key, 0.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise CodecError(f"task: {key} must be a number, got {value!r:.40}")
    return float(value)


def encode_task(
    task_id: str,
    payload: object,
    *,
    attempts: int = 0,
    priority: int = 0,
    not_before: float = 0.0,
    expires: float = 0.0,
    copy_id: int = 0,
) -> bytes:
    """The bytes of ``TaskMessage(task_id, payload, ...)`` (see :class:`TaskCodec`), without the
    message object: the client's submit encodes each task once, straight from its fields."""
    fields: list[object] = [FORMAT, task_id, payload]
    extras: dict[str, object] = {}
    if attempts:
        extras["attempts"] = attempts
    if priority:
        extras["priority"] = priority
    if not_before:
        extras["not_before"] = not_before
    if expires:
        extras["expires"] = expires
    if copy_id:
        extras["copy_id"] = copy_id
    if extras:
        fields.append(extras)
    return _pack_fields(fields, payload, "task {} payload", task_id)


class TaskCodec:
    """``TaskMessage`` <-> ``[1, task_id, payload]`` (+ ``{"attempts": n, "priority": p,
    "not_before": t, "expires": t, "copy_id": c}``, each when not 0)."""

    def encode(self, message: TaskMessage) -> bytes:
        return encode_task(
            message.task_id,
            message.payload,
            attempts=message.attempts,
            priority=message.priority,
            not_before=message.not_before,
            expires=message.expires,
            copy_id=message.copy_id,
        )

    def decode(self, data: bytes) -> TaskMessage:
        obj = _unpack(data, "task")
        if len(obj) < 3 or not isinstance(obj[1], str):
            raise CodecError("task: expected [1, task_id: str, payload]")
        if len(obj) == 3:  # no extras (the common case, every task of a daemon: kept short)
            return TaskMessage(obj[1], obj[2])
        extras = _extras(obj, 3, "task")
        attempts = _count(extras, "attempts", 0, "task")
        priority = _count(extras, "priority", 0, "task")
        not_before = _time(extras, "not_before")
        expires = _time(extras, "expires")
        copy_id = _count(extras, "copy_id", 0, "task")
        return TaskMessage(obj[1], obj[2], attempts, priority, not_before, expires, copy_id)


class ResultCodec:
    """``ResultMessage`` <-> ``[1, task_id, ok, value | [type, message, traceback], daemon, seconds]``.

    Followed by ``{"attempts": n, "gave_up": true}`` when either differs from its default.

    ``unpickle``: the client's codec for a job with ``codec="pickle"``: a value is unpickled as it
    is decoded; one that cannot be is the task's error (``ResultNotUnpickled``), so the task still
    has its outcome.
    """

    def __init__(self, *, unpickle: bool = False) -> None:
        self.unpickle = unpickle

    def encode(self, message: ResultMessage) -> bytes:
        if message.ok:
            body: object = message.value
        else:
            error = message.error or ErrorInfo("UnknownError", "")
            body = [error.type, error.message, error.traceback]
        fields: list[object] = [
            FORMAT,
            message.task_id,
            message.ok,
            body,
            message.daemon_id,
            message.seconds,
        ]
        extras: dict[str, object] = {}
        if message.attempts != 1:
            extras["attempts"] = message.attempts
        if message.gave_up:
            extras["gave_up"] = True
        if extras:
            fields.append(extras)
        return _pack_fields(fields, body, "result of task {}", message.task_id)

    def decode(self, data: bytes) -> ResultMessage:
        return self.decode_as(data, ResultMessage)

    def decode_as(self, data: bytes, make: ResultMaker[M]) -> M:
        """Decodes straight into ``make``'s object (the client's ``Outcome``: no
        :class:`ResultMessage` on the way, one object per result on the client's hot path)."""
        obj = _unpack(data, "result")
        if len(obj) < 6 or not isinstance(obj[1], str) or not isinstance(obj[2], bool):
            raise CodecError("result: expected [1, task_id, ok, body, daemon_id, seconds]")
        _, task_id, ok, body, daemon_id, seconds = obj[:6]
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise CodecError("result: seconds must be a number")
        extras = _extras(obj, 6, "result")
        attempts = _count(extras, "attempts", 1, "result")
        gave_up = extras.get("gave_up", False)
        if not isinstance(gave_up, bool):
            raise CodecError("result: gave_up must be a bool")
        if ok and self.unpickle:
            try:
                body = codec.unpickled(body)
            except Exception as exc:  # whatever unpickling raises: the outcome says it
                ok, body = False, ["ResultNotUnpickled", f"{type(exc).__name__}: {exc}", ""]
        if ok:
            return make(task_id, True, body, None, str(daemon_id), float(seconds), attempts, gave_up)  # type: ignore[arg-type]
        if not (isinstance(body, list) and len(body) == 3 and all(isinstance(x, str) for x in body)):
            raise CodecError("result: error body must be [type, message, traceback]")
        error = ErrorInfo(body[0], body[1], body[2])
        return make(task_id, False, None, error, str(daemon_id), float(seconds), attempts, gave_up)  # type: ignore[arg-type]


class GaveUpCodec:
    """``GaveUpRecord`` <-> a msgpack map: kind "gave_up", task_id, attempts, error, daemon_id, body."""

    def encode(self, record: GaveUpRecord) -> bytes:
        error = record.error
        return _pack(
            {
                "kind": "gave_up",
                "task_id": record.task_id,
                "attempts": record.attempts,
                "error": [error.type, error.message, error.traceback],
                "daemon_id": record.daemon_id,
                "body": record.body,
            },
            f"dead-letter record of task {record.task_id}",
        )

    def decode(self, data: bytes) -> GaveUpRecord:
        obj = _record(data, "gave_up", "dead-letter record")
        error = obj.get("error")
        if not (isinstance(error, list) and len(error) == 3 and all(isinstance(x, str) for x in error)):
            raise CodecError("dead-letter record: error must be [type, message, traceback]")
        task_id, body = obj.get("task_id"), obj.get("body")
        if not isinstance(task_id, str) or not isinstance(body, bytes):
            raise CodecError("dead-letter record: task_id must be a str and body bytes")
        attempts = _count(obj, "attempts", 0, "dead-letter record")
        return GaveUpRecord(task_id, attempts, ErrorInfo(*error), str(obj.get("daemon_id", "")), body)


COPY_ID_BITS: Final = 63
"""A copy id fits a msgpack int64 (and a signed 64-bit column, should anyone store it)."""


def new_copy_id() -> int:
    """A random copy id for a task put back into its queue (never 0: the client's own copy)."""
    return secrets.randbits(COPY_ID_BITS) or 1


@dataclass(frozen=True, slots=True)
class HandedBack:
    """A daemon put copy ``original`` of task ``task_id`` back into its queue as copy ``copy``,
    and that copy is confirmed: a redelivered frame holding copy ``original`` need not run it (see
    :mod:`truba.pipes.result_log`); copy ``copy`` itself still runs."""

    task_id: str
    original: int
    copy: int


class HandedBackCodec:
    """``HandedBack`` <-> a msgpack map: kind "handed_back", task_id, original, copy."""

    def encode(self, record: HandedBack) -> bytes:
        return _pack(
            {
                "kind": "handed_back",
                "task_id": record.task_id,
                "original": record.original,
                "copy": record.copy,
            },
            f"hand-back record of task {record.task_id}",
        )

    def decode(self, data: bytes) -> HandedBack:
        obj = _record(data, "handed_back", "hand-back record")
        task_id = obj.get("task_id")
        if not isinstance(task_id, str):
            raise CodecError("hand-back record: task_id must be a str")
        original = _count(obj, "original", 0, "hand-back record")
        return HandedBack(task_id, original, _count(obj, "copy", 0, "hand-back record"))
