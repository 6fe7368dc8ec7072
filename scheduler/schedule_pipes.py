"""The data path of a schedule: its runs go into its job's task queue, their outcomes come back
from the job's result queue, through the same pipe stacks a client uses.

The scheduler is the client of a schedule's job: :class:`BrokerSchedulePipes` opens, per job, a
send stack (``serialize → retry → log → balance[reopen → leaf, ...]``, no frames: one run is one
message) and a listen stack on its results, over links the composition root opens
(:func:`truba.scheduler.wiring.pipe_brokers`). A run's task is ``[1, task_id, payload]`` with the
payload the client encoded (msgpack bytes, spliced in as they are: the scheduler never decodes
what it does not run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, Protocol, final

from truba import codec
from truba.pipes.base import Delivery, Listener, Sender, close_all
from truba.pipes.broker import Broker, BrokerFactory
from truba.pipes.prefetch import Window
from truba.pipes.stacks import SendOptions, listen_stack, send_stack
from truba.queues import JobQueues
from truba.wire import FORMAT, ResultCodec, ResultMessage

CONFIRM_TIMEOUT: Final = 5.0
"""Seconds a run's task waits for its broker's confirm (then the run counts as an error)."""
RESULT_PREFETCH: Final = 16


def task_bytes(task_id: str, payload: bytes, expires: float = 0.0) -> bytes:
    """The task message ``[1, task_id, payload, {"expires": t}]`` with ``payload`` already msgpack
    (empty: None); without the extras when ``expires`` is 0 (see :class:`truba.wire.TaskMessage`)."""
    head = codec.packb(FORMAT) + codec.packb(task_id) + (payload or codec.packb(None))
    if not expires:
        return b"\x93" + head
    return b"\x94" + head + codec.packb({"expires": expires})


class RunPipe(Protocol):
    """One schedule job's pipes."""

    async def fire(self, task_id: str, payload: bytes, expires: float) -> None:
        """Sends one run's task (not to be run after ``expires``, Unix time) and waits for its
        confirm.

        Raises:
            PipeError, TimeoutError: it was not confirmed within :data:`CONFIRM_TIMEOUT`.
        """

    async def outcome(self, timeout: float) -> Delivery[ResultMessage] | None:
        """The next result of the job (ack it once recorded), or None after ``timeout`` seconds."""

    async def close(self) -> None: ...


class SchedulePipes(Protocol):
    """Opens the pipes of schedule jobs."""

    def open(self, queues: JobQueues) -> RunPipe: ...

    async def close(self) -> None: ...


@final
class _BytesCodec:
    def encode(self, message: bytes) -> bytes:
        return message

    def decode(self, data: bytes) -> bytes:
        return data


@final
class BrokerRunPipe:
    """:class:`RunPipe` over a send and a listen stack."""

    def __init__(self, tasks: Sender[bytes], results: Listener[ResultMessage]) -> None:
        self._tasks = tasks
        self._results = results

    async def fire(self, task_id: str, payload: bytes, expires: float) -> None:
        message = task_bytes(task_id, payload, expires)
        confirmation = await asyncio.wait_for(self._tasks.send(message), CONFIRM_TIMEOUT)
        await asyncio.wait_for(confirmation, CONFIRM_TIMEOUT)

    async def outcome(self, timeout: float) -> Delivery[ResultMessage] | None:
        return await self._results.get(timeout)

    async def close(self) -> None:
        await close_all(self._tasks.close(), self._results.close())


@final
class BrokerSchedulePipes:
    """:class:`SchedulePipes` over one link per broker URL, shared by every schedule job."""

    def __init__(self, urls: Sequence[str], open_link: BrokerFactory) -> None:
        self._links: list[Broker] = [open_link(url) for url in urls]

    def open(self, queues: JobQueues) -> RunPipe:
        options = SendOptions(confirm_timeout=CONFIRM_TIMEOUT, max_unconfirmed=16)
        tasks = send_stack(
            _BytesCodec(), self._links, queues.spec(queues.tasks), role="schedule-tasks", options=options
        )
        results = listen_stack(
            ResultCodec(),
            self._links,
            queues.spec(queues.results),
            Window(RESULT_PREFETCH),
            role="schedule-results",
        )
        return BrokerRunPipe(tasks.sender, results.listener)

    async def close(self) -> None:
        await close_all(*(link.close() for link in self._links))
