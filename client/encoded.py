"""Tasks encoded once: the journal stores the bytes the brokers get, and the task stack sends them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from truba.wire import TaskCodec, TaskMessage


@dataclass(frozen=True, slots=True)
class EncodedTask:
    """A task's id and priority (the transport needs them) and its encoded :class:`TaskMessage`."""

    task_id: str
    priority: int
    data: bytes

    @classmethod
    def of(cls, message: TaskMessage) -> EncodedTask:
        return cls(message.task_id, message.priority, TaskCodec().encode(message))


@final
class EncodedTaskCodec:
    """The codec of the client's task stack: the bytes are already there."""

    def encode(self, message: EncodedTask) -> bytes:
        return message.data

    def decode(self, data: bytes) -> EncodedTask:
        task = TaskCodec().decode(data)
        return EncodedTask(task.task_id, task.priority, data)
