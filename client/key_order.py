"""Sending a job's keyed tasks in order: a key's next task goes out once the outcome of the one
before it came.

:class:`KeyOrder` keeps the job's :class:`~truba.client.keys.KeyChains`. A keyed ``submit``
chains its task; the head of a chain is sent by the submit itself, every other task is *held*
(in the journal, not sent). When the head's outcome comes (a result, an error, a give-up:
whatever ends the task for the client; the result stream tells :meth:`KeyOrder.arrived` for every
outcome of a task still in the journal, before any consumer, call or group sees it), the key's
next task is *released*: one background task sends the released tasks in the order they were
released. The outcome need not be taken first: a consumer that is slow, or an outcome parked
for the next consumer, holds no key back. The task whose outcome came stays in the journal until
its outcome is taken, as every task does; it is never sent again (:meth:`KeyOrder.holds`).

After a crash, :meth:`Client.resume` rebuilds the chains from the journal
(:meth:`KeyChains.rebuild`): since a task is sent only once the one before it had its outcome,
the newest task of a key that a broker confirmed is its head, the older ones had their outcomes
(their results come again), and the newer ones are held. A head no broker confirmed is sent
again; a held task is never sent early.

A send that fails (every broker away beyond the pipes' retries, the client's patience spent) is
tried again after a backoff until the job ends here.

Memory: a held task's encoded message stays in memory until it is sent (the journal on disk
cannot read one record back without reading its whole segment), plus its id in its chain.
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
    task: the result stream must tell :meth:`arrived` and :meth:`settled` from then on (nothing
    is asked of it before, so a job without keys pays nothing per outcome).
    """

    def __init__(
        self, job_id: str, send: Callable[[EncodedTask], Awaitable[None]], on_change: Callable[[], None]
    ) -> None:
        self._job_id = job_id
        self._send = send
        self._on_change = on_change
        self.chains = KeyChains()
        self.on_active: Callable[[], None] = lambda: None
        self._active = False
        self._came: set[str] = set()
        """Keyed tasks whose outcome came and is not taken yet: never to be sent again."""
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

    def holds(self, task_id: str) -> bool:
        """True if ``task_id`` must not be sent (again) now: held, released and about to be
        sent, or its outcome came already."""
        return self.chains.is_held(task_id) or task_id in self._released or task_id in self._came

    def add(self, key: str, task: EncodedTask) -> bool:
        """Chains a new keyed task (already in the journal); True if it is its key's head: the
        caller sends it."""
        self._activate()
        if self.chains.add(key, task.task_id):
            return True
        self._bodies[task.task_id] = task
        return False

    def rebuild(self, tasks: Iterable[tuple[str, str, bytes]], confirmed: set[str]) -> None:
        """Chains a resumed job's keyed tasks, ``(task id, key, encoded message)`` oldest first,
        given which of them a broker ``confirmed``; the heads are sent by the caller (or left to
        the brokers that confirmed them)."""
        tasks = list(tasks)
        if not tasks:
            return
        self._activate()
        self._came.update(self.chains.rebuild(((task_id, key) for task_id, key, _ in tasks), confirmed))
        codec = EncodedTaskCodec()
        for task_id, _, data in tasks:
            if self.chains.is_held(task_id):
                self._bodies[task_id] = codec.decode(data)

    def _activate(self) -> None:
        if not self._active:
            self._active = True
            self.on_active()

    def arrived(self, task_id: str) -> None:
        """An outcome of ``task_id`` came (again, maybe: then nothing happens): its key's next
        task goes out."""
        if task_id not in self.chains:
            return
        self._came.add(task_id)
        self._bodies.pop(task_id, None)  # a task held after a resume that had in fact been sent
        self._release(self.chains.end(task_id))

    def settled(self, task_id: str) -> None:
        """``task_id``'s outcome was taken (the journal forgot it)."""
        self._came.discard(task_id)

    def withdrawn(self, task_id: str) -> None:
        """``task_id``'s submit gave up before any broker took it: its key's next task goes out."""
        self._release(self.chains.end(task_id))

    def _release(self, successor: str | None) -> None:
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
                except TrubaError as exc:  # PipeError, Unavailable: try again later
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
            await self._send(self._bodies[task_id])
            del self._bodies[task_id]
            self._released.popleft()
            log.debug("client.key.released", extra={"job_id": self._job_id, "task_id": task_id})

    async def stop(self) -> None:
        """Sends no more (the job ended here, or was detached: the journal keeps the chains)."""
        self._stopped = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
