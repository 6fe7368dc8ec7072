"""A job's pipes on the daemon: what it runs (from the scheduler's assignment) and the stacks over
the brokers that carry its tasks, results, requeues, hand-back records and dead letters (see
truba.pipes.stacks)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from truba.daemon.hand_back_records import JobRecords, records_sender
from truba.daemon.settings import JobSettings
from truba.pipes.base import Delivery, Listener, Sender
from truba.pipes.broker import Broker, QueueSpec
from truba.pipes.errors import CodecError, PipeError
from truba.pipes.frame import FrameLimits
from truba.pipes.frame_listener import FrameListener
from truba.pipes.prefetch import Window
from truba.pipes.result_log import ResultLog
from truba.pipes.route import RouteSender
from truba.pipes.stacks import SendOptions, listen_stack, send_stack
from truba.wire import (
    FORMAT,
    GaveUpCodec,
    GaveUpRecord,
    HandedBackCodec,
    ResultCodec,
    ResultMessage,
    TaskCodec,
    TaskMessage,
)

__all__ = ["JobPipes", "Wanted", "open_job_pipes", "copy_key", "task_key"]


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
    handed_back: JobRecords | None = None
    """Hand-back records into the job's result log, for frame members put back once their copy
    is confirmed (None: the job has no result log). Shared by the job's runners on a daemon (see
    truba.daemon.hand_back_records)."""
    owns_records: bool = False
    """True when ``handed_back`` is these pipes' own (closed with them), not the daemon's."""
    lone_results: Sender[ResultMessage] | None = None
    """The results of tasks delivered alone, not copied into the job's result log (None: every
    result goes through ``results``). The log is read only for a redelivered *frame* (a lone
    message runs again when redelivered, as any AMQP message would), so copying a lone task's
    result there was pure cost: a 1 MB result stored twice by the broker."""

    def results_for(self, delivery: Delivery[TaskMessage]) -> Sender[ResultMessage]:
        """The sender of ``delivery``'s result: through the result log for a frame member."""
        lone = self.lone_results
        return self.results if lone is None or delivery.framed else lone

    async def close(self) -> None:
        """Closes them all (the senders wait, bounded, for outstanding confirms); records the
        daemon shares outlive them."""
        pipes: list[Sender[Any] | Listener[Any]] = [self.tasks, self.results, self.requeue, self.dead]
        if self.lone_results is not None:
            pipes.append(self.lone_results)
        for pipe in pipes:
            with contextlib.suppress(PipeError):
                await pipe.close()
        if self.owns_records and self.handed_back is not None:
            await self.handed_back.close()


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


def open_job_pipes(
    brokers: Sequence[Broker], job: Wanted, window: Window, records: JobRecords | None = None
) -> JobPipes:
    """The job's pipes (see truba.pipes.stacks); they connect lazily.

    Results are copied to the job's result log, which a redelivered task (a frame a dead daemon
    had half done, or a task whose result was confirmed but not acked) is looked up in; a task
    put back into its queue out of a frame gets a hand-back record there once its copy is
    confirmed, so that a redelivered frame does not run the copy it replaced (see
    truba.pipes.result_log). ``records``: the daemon's sender of the job's records, shared by its
    runners (None: these pipes open their own, on their first record, and close it with them).
    """
    done = None
    handed_back = None
    owns_records = False
    if job.result_log is not None:
        done = ResultLog(
            brokers,
            job.result_log.name,
            result_key=_key_of_record,
            member_key=_task_id_of_task,
            copy_key=copy_key,
        )
        handed_back = records
        if handed_back is None:
            handed_back = JobRecords(job.result_log.name, records_sender(brokers, job.result_log))
            owns_records = True
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
    results = send_stack(
        ResultCodec(),
        brokers,
        job.results_queue,
        role="results",
        options=SendOptions(copy_to=job.result_log),
        frames=result_frames,
        # The acker awaits every result's confirmation and logs a failed one with its task
        # (``daemon.task.unconfirmed``): no log callback (and loop turn) per result.
        log_confirms=False,
    )
    lone = None
    if job.result_log is not None:  # results of tasks delivered alone skip the log
        lone = send_stack(
            ResultCodec(),
            brokers,
            job.results_queue,
            role="results",
            frames=result_frames,
            log_confirms=False,
        )
        lone.connect_ahead()
    # Results follow the job's first tasks at once: their channels open meanwhile, not at the
    # first result (a channel open and the declares of the results queue and the result log).
    results.connect_ahead()
    return JobPipes(
        tasks=tasks.listener,
        results=results.sender,
        requeue=RouteSender(lambda task: task.priority, functools.partial(_requeue_stack, brokers, job)),
        dead=send_stack(GaveUpCodec(), brokers, job.dead_queue, role="dead").sender,
        result_frames=result_frames,
        task_frames=tasks.frames,
        handed_back=handed_back,
        owns_records=owns_records,
        lone_results=None if lone is None else lone.sender,
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


def _key_of_record(data: bytes) -> Hashable | None:
    """The key of a message of the result log: a result's task id, or the :func:`copy_key` of
    the copy a hand-back record says was replaced (None: neither)."""
    try:
        return ResultCodec().decode(data).task_id
    except CodecError:
        pass
    try:
        record = HandedBackCodec().decode(data)
    except CodecError:
        return None
    return _copy(record.task_id, record.original)


def copy_key(data: bytes) -> Hashable | None:
    """The key a hand-back record of this copy of a task is found under (its id and copy id;
    None: not a task message). Never equal to a task id: a result's key."""
    try:
        task = TaskCodec().decode(data)
    except CodecError:
        return None
    return _copy(task.task_id, task.copy_id)


def _copy(task_id: str, copy_id: int) -> Hashable:
    return ("handed_back", task_id, copy_id)


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
