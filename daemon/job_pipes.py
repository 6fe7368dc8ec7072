"""A job's pipes on the daemon: what it runs (from the scheduler's assignment) and the stacks over
the brokers that carry its tasks, results, requeues and dead letters (see truba.pipes.stacks)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from truba.daemon.settings import JobSettings
from truba.pipes.base import Listener, Sender
from truba.pipes.broker import Broker, QueueSpec
from truba.pipes.errors import CodecError, PipeError
from truba.pipes.frame import FrameLimits
from truba.pipes.frame_listener import FrameListener
from truba.pipes.prefetch import Window
from truba.pipes.result_log import ResultLog
from truba.pipes.route import RouteSender
from truba.pipes.stacks import SendOptions, listen_stack, send_stack
from truba.wire import FORMAT, GaveUpCodec, GaveUpRecord, ResultCodec, ResultMessage, TaskCodec, TaskMessage

__all__ = ["JobPipes", "Wanted", "open_job_pipes", "task_key"]


@dataclass
class JobPipes:
    """A job's pipes on one daemon: its tasks in; results, requeued tasks and dead letters out."""

    tasks: Listener[TaskMessage]
    results: Sender[ResultMessage]
    requeue: Sender[TaskMessage]
    dead: Sender[GaveUpRecord]
    result_frames: FrameLimits | None = None
    """The limits of the results' frames (None: results go one per message)."""
    task_frames: FrameListener | None = None
    """The task listener's unframe layer: members of frames at hand (None: not a framing stack)."""

    async def close(self) -> None:
        """Closes all four (the senders wait, bounded, for outstanding confirms)."""
        for pipe in (self.tasks, self.results, self.requeue, self.dead):
            with contextlib.suppress(PipeError):
                await pipe.close()


@dataclass(frozen=True)
class Wanted:
    """One job of the scheduler's assignment."""

    handler: str
    slots: int
    tasks_queue: str | QueueSpec
    """A spec, so that a broker that lost the queue (its data wiped) gets it declared again."""
    results_queue: str | QueueSpec
    dead_queue: str | QueueSpec
    settings: JobSettings = JobSettings()
    result_log: QueueSpec | None = None
    """The stream results are copied to, read for redelivered tasks (see truba.pipes.result_log)."""


def open_job_pipes(brokers: Sequence[Broker], job: Wanted, window: Window) -> JobPipes:
    """The job's pipes (see truba.pipes.stacks); they connect lazily.

    Results are copied to the job's result log, which a redelivered task (a frame a dead daemon
    had half done, or a task whose result was confirmed but not acked) is looked up in.
    """
    done = None
    if job.result_log is not None:
        done = ResultLog(
            brokers, job.result_log.name, result_key=_task_id_of_result, member_key=_task_id_of_task
        )
    result_frames = FrameLimits() if job.settings.frames else None
    tasks = listen_stack(
        TaskCodec(),
        brokers,
        job.tasks_queue,
        window,
        role="tasks",
        dead_letter_queue=job.dead_queue,
        done=done,
        member_key=task_key,  # a frame with a task id twice is malformed: none of it runs
    )
    return JobPipes(
        tasks=tasks.listener,
        results=send_stack(
            ResultCodec(),
            brokers,
            job.results_queue,
            role="results",
            options=SendOptions(copy_to=job.result_log),
            frames=result_frames,
        ).sender,
        requeue=RouteSender(lambda task: task.priority, functools.partial(_requeue_stack, brokers, job)),
        dead=send_stack(GaveUpCodec(), brokers, job.dead_queue, role="dead").sender,
        result_frames=result_frames,
        task_frames=tasks.frames,
    )


def _requeue_stack(brokers: Sequence[Broker], job: Wanted, priority: int) -> Sender[TaskMessage]:
    """Puts tasks back into their queue, each priority level through its own stack (RabbitMQ
    reads the priority from the AMQP properties; the body keeps it too)."""
    options = SendOptions(priority=priority if job.settings.priorities else None)
    # A preempted runner hands back many at once; not with priorities (see the client's tasks).
    frames = FrameLimits() if job.settings.frames and not job.settings.priorities else None
    return send_stack(
        TaskCodec(), brokers, job.tasks_queue, role="requeue", options=options, frames=frames
    ).sender


def _task_id_of_result(data: bytes) -> str | None:
    """The task id of a recorded result (None: not a result message)."""
    try:
        return ResultCodec().decode(data).task_id
    except CodecError:
        return None


def task_key(data: bytes) -> str | None:
    """The task id of a frame member, read from its first bytes (None: not a task message).

    Every member of every task frame goes through here, so the common form (a fixarray, format
    1, a task id of up to 31 bytes) is read without decoding the payload, which the deserialize
    layer decodes once anyway; anything else is decoded in full.
    """
    if len(data) > 3 and data[0] in (0x93, 0x94) and data[1] == FORMAT and 0xA0 <= data[2] <= 0xBF:
        end = 3 + data[2] - 0xA0
        if len(data) > end:
            try:
                return data[3:end].decode()
            except UnicodeDecodeError:
                return None
    return _task_id_of_task(data)


def _task_id_of_task(data: bytes) -> str | None:
    """The task id of a task message (None: not one; the deserialize layer dead-letters it)."""
    try:
        return TaskCodec().decode(data).task_id
    except CodecError:
        return None
