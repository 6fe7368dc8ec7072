"""What travels through a job's pipes: task and result messages, and their msgpack codecs.

Both are msgpack arrays whose first element is a format version, so the format can evolve and
anything else is recognised as foreign. Payloads and results are msgpack values (None, bool,
int, float, str, bytes, lists, dicts); anything else is refused with a CodecError that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgpack

from truba.pipes.errors import CodecError

FORMAT: Final = 1


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One task: its id (unique within the job) and the handler's argument."""

    task_id: str
    payload: object


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a task failed: exception type, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class ResultMessage:
    """The outcome of one task as a daemon reports it: a value, or an error."""

    task_id: str
    ok: bool
    value: object = None
    error: ErrorInfo | None = None
    daemon_id: str = ""
    seconds: float = 0.0


def _pack(obj: object, what: str) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"{what} is not msgpack-serializable: {exc}") from exc


def _unpack(data: bytes, what: str) -> list[object]:
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CodecError(f"{what}: not msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, list) or not obj or obj[0] != FORMAT:
        raise CodecError(f"{what}: not a truba v{FORMAT} message")
    return obj


class TaskCodec:
    """``TaskMessage`` <-> ``[1, task_id, payload]``."""

    def encode(self, message: TaskMessage) -> bytes:
        return _pack([FORMAT, message.task_id, message.payload], f"task {message.task_id} payload")

    def decode(self, data: bytes) -> TaskMessage:
        obj = _unpack(data, "task")
        if len(obj) != 3 or not isinstance(obj[1], str):
            raise CodecError("task: expected [1, task_id: str, payload]")
        return TaskMessage(obj[1], obj[2])


class ResultCodec:
    """``ResultMessage`` <-> ``[1, task_id, ok, value | [type, message, traceback], daemon, seconds]``."""

    def encode(self, message: ResultMessage) -> bytes:
        if message.ok:
            body: object = message.value
        else:
            error = message.error or ErrorInfo("UnknownError", "")
            body = [error.type, error.message, error.traceback]
        return _pack(
            [FORMAT, message.task_id, message.ok, body, message.daemon_id, message.seconds],
            f"result of task {message.task_id}",
        )

    def decode(self, data: bytes) -> ResultMessage:
        obj = _unpack(data, "result")
        if len(obj) != 6 or not isinstance(obj[1], str) or not isinstance(obj[2], bool):
            raise CodecError("result: expected [1, task_id, ok, body, daemon_id, seconds]")
        _, task_id, ok, body, daemon_id, seconds = obj
        if ok:
            return ResultMessage(task_id, True, body, None, str(daemon_id), float(seconds))  # type: ignore[arg-type]
        if not (isinstance(body, list) and len(body) == 3 and all(isinstance(x, str) for x in body)):
            raise CodecError("result: error body must be [type, message, traceback]")
        error = ErrorInfo(body[0], body[1], body[2])
        return ResultMessage(task_id, False, None, error, str(daemon_id), float(seconds))  # type: ignore[arg-type]
