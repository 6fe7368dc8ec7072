"""Tasks encoded once: the journal stores the bytes the brokers get, and the task stack sends them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from truba.pipes.delay import split_due, with_due
from truba.wire import TaskCodec, TaskMessage, encode_task

_CODEC = TaskCodec()
"""Stateless: one for every task (``of`` is on the submit path)."""


@dataclass(frozen=True, slots=True)
class EncodedTask:
    """A task's id, priority and due time (the transport needs them) and its encoded
    :class:`TaskMessage`."""

    task_id: str
    priority: int
    data: bytes
    not_before: float = 0.0
    """A delayed task's due time (Unix time); 0: none."""

    @classmethod
    def of(cls, message: TaskMessage) -> EncodedTask:
        return cls(message.task_id, message.priority, _CODEC.encode(message), message.not_before)

    @classmethod
    def new(cls, task_id: str, payload: object, priority: int = 0, not_before: float = 0.0) -> EncodedTask:
        """A new task (no :class:`TaskMessage` made on the way: submit is the hot path)."""
        data = encode_task(task_id, payload, priority=priority, not_before=not_before)
        return cls(task_id, priority, data, not_before)


@final
class EncodedTaskCodec:
    """The codec of the client's task stack: the bytes are already there."""

    def encode(self, message: EncodedTask) -> bytes:
        return message.data

    def decode(self, data: bytes) -> EncodedTask:
        task = _CODEC.decode(data)
        return EncodedTask(task.task_id, task.priority, data, task.not_before)


@final
class DelayedTaskCodec:
    """The codec of the client's delayed-task stack: the due time in front of the task's bytes
    (:func:`truba.pipes.delay.with_due`), which the brokers' delay levels read."""

    def encode(self, message: EncodedTask) -> bytes:
        return with_due(message.data, message.not_before)

    def decode(self, data: bytes) -> EncodedTask:
        _, body = split_due(data)
        return EncodedTaskCodec().decode(body)
