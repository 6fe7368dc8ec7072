"""Sending a job's keyed tasks in order: a key's next task goes out once the outcome of the one
before it was taken.

:class:`KeyOrder` keeps the job's :class:`~truba.client.keys.KeyChains`. A keyed ``submit``
chains its task; the head of a chain is sent by the submit itself, every other task is *held*
(in the journal, not sent). When the application has taken a head's outcome (a result, an
error, a give-up: whatever ends the task for the client; the result stream tells
:meth:`KeyOrder.ended` right after the journal forgot the task), the key's next task is
*released*: one background task sends the released tasks in the order they were released.

Memory: a held task's encoded message stays in memory until it is sent (besides the journal on
disk, which cannot read one record back without reading its whole segment), plus its id in its
chain.

Before it sends, it writes the journal's pending forget marks (no fsync: a process crash keeps
them), so that after a crash the oldest task of a key in the journal is the one that was sent
last: :meth:`Client.resume` rebuilds the chains from the journal and sends heads only (those no
broker confirmed), never a held task. A send that fails (every broker away beyond the pipes'
retries, the client's patience spent) is tried again after a backoff until the job ends here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, final

from truba.backoff import Backoff
from truba.client.encoded import EncodedTask, EncodedTaskCodec
from truba.client.journal import TaskJournal
from truba.client.keys import KeyChains
from truba.errors import TrubaError

log = logging.getLogger(__name__)

RELEASE_BACKOFF: Final = Backoff(attempts=None, base=0.2, cap=5.0)
"""Waits between tries of sending released tasks when a send failed."""


@final
class KeyOrder:
    """Holds a job's keyed tasks back until their turn and sends each once it comes; see the module.

    ``send`` sends one task and watches its confirm (the submission's); ``on_change`` is called
    when the held count changes (progress). ``on_active`` is called once, at the first keyed
    task: the result stream must tell :meth:`ended` from then on (nothing is asked of it before,
    so a job without keys pays nothing per outcome).
    """

    def __init__(
        self,
        job_id: str,
        journal: TaskJournal,
        send: Callable[[EncodedTask], Awaitable[None]],
        on_change: Callable[[], None],
    ) -> None:
        self._job_id = job_id
        self._journal = journal
        self._send = send
        self._on_change = on_change
        self.chains = KeyChains()
        self.on_active: Callable[[], None] = lambda: None
        self._active = False
        self._released: collections.deque[str] = collections.deque()
        """Heads to send, in the order their turn came."""
        self._bodies: dict[str, EncodedTask] = {}
        """The held and released tasks' messages, until sent."""
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def held(self) -> int:
        """Tasks waiting for an earlier task of their key (no demand for slots yet)."""
        return self.chains.held

    def is_held(self, task_id: str) -> bool:
        """True if ``task_id`` must not be sent now: held, or released and about to be sent."""
        return self.chains.is_held(task_id) or task_id in self._released

    def add(self, key: str, task: EncodedTask) -> bool:
        """Chains a new keyed task (already in the journal); True if it is its key's head: the
        caller sends it."""
        self._activate()
        if self.chains.add(key, task.task_id):
            return True
        self._bodies[task.task_id] = task
        return False

    def rebuild(self, tasks: Iterable[tuple[str, str, bytes]]) -> None:
        """Chains a resumed job's keyed tasks, ``(task id, key, encoded message)`` oldest first;
        the heads are sent by the caller (or left to the brokers that confirmed them)."""
        codec = EncodedTaskCodec()
        for task_id, key, data in tasks:
            self._activate()
            if not self.chains.add(key, task_id):
                self._bodies[task_id] = codec.decode(data)

    def _activate(self) -> None:
        if not self._active:
            self._active = True
            self.on_active()

    def ended(self, task_id: str) -> None:
        """``task_id``'s outcome was taken, or its submit withdrew it: its key's next task goes out."""
        successor = self.chains.end(task_id)
        self._bodies.pop(task_id, None)  # a held task ended: the job was cancelled
        if successor is None or self._stopped:
            return
        self._released.append(successor)
        self._on_change()
        self._wake.set()
        if self._sender is None:
            self._sender = asyncio.create_task(self._run(), name=f"key-order-{self._job_id}")

    async def _run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._released:
                try:
                    await self._send_released()
                    failures = 0
                except TrubaError as exc:  # PipeError, Unavailable, SpoolError: try again later
                    log.warning(
                        "client.key.release_failed",
                        extra={"job_id": self._job_id, "waiting": len(self._released), "error": repr(exc)},
                    )
                    await asyncio.sleep(RELEASE_BACKOFF.delay(failures))
                    failures += 1

    async def _send_released(self) -> None:
        """Sends the released tasks, oldest first; each leaves :attr:`_released` once sent."""
        while self._released:
            task_id = self._released[0]
            task = self._bodies.get(task_id)
            if task is not None:  # else cancelled meanwhile
                # Forget marks first: after a crash, a key's oldest task on disk is the one sent last.
                self._journal.flush()
                await self._send(task)
                del self._bodies[task_id]
                log.debug("client.key.released", extra={"job_id": self._job_id, "task_id": task_id})
            self._released.popleft()

    async def stop(self) -> None:
        """Sends no more (the job ended here, or was detached: the journal keeps the chains)."""
        self._stopped = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
