"""Slot subprocesses, seen from the daemon: start, run a task or a batch, notice death, kill, measure.

A slot is a process running :mod:`truba.daemon.slot_main`, speaking length-prefixed msgpack frames
over its stdin/stdout; a :class:`~truba.daemon.launch.Launcher` starts it (spawned, or forked
from a template that preloaded the handlers: :mod:`truba.daemon.forkserver`). The process
boundary protects the daemon from the handler's crashes, leaks and hangs: a task that must stop
*now* (timeout, memory limit, preemption) is stopped by killing its slot, which is then started
afresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

from truba import codec, trace
from truba.daemon.launch import Launcher, SlotHandle, Spawn
from truba.daemon.memory import private_bytes
from truba.daemon.slot_main import HEADER, LARGE_FRAME, PING_REQUEST
from truba.handlers import BatchSpec
from truba.wire import ErrorInfo

log = logging.getLogger(__name__)
STARTUP_TIMEOUT: Final = 30.0
"""Seconds a slot process may take to answer its first ping (see :meth:`SlotProcess.warm`)."""
PING: Final = HEADER.pack(len(PING_REQUEST)) + PING_REQUEST


class SlotDied(Exception):
    """The slot process exited while running a task."""


@dataclass(slots=True)
class SlotReply:
    """What a slot reports for one task."""

    task_id: str
    ok: bool
    value: object
    error: ErrorInfo | None
    seconds: float
    kinds: tuple[str, ...] = ()
    """The names of the error's classes, its MRO (``module.Qualname``, builtins bare)."""


@final
class SlotProcess:
    """One slot process at a time; runs one task at a time. ``launcher`` starts its processes
    (default: :class:`~truba.daemon.launch.Spawn`)."""

    def __init__(self, index: int, launcher: Launcher | None = None) -> None:
        self.index = index
        self.launcher: Launcher = launcher or Spawn()
        self._process: SlotHandle | None = None
        self.tasks_run = 0
        """Tasks this process has answered (reset when the process is replaced)."""
        self.cold = True
        """Not known to be up: no process yet, or one started (or found dead) and not answered
        since. :func:`~truba.daemon.supervise.supervised` warms a cold slot (:meth:`warm`)
        before it starts an attempt's clock."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def preloaded(self) -> frozenset[str]:
        """Handlers whose modules the current process had imported before it started."""
        return self._process.preloaded if self._process is not None else frozenset()

    @property
    def reply_here(self) -> bool:
        """A reply came while a request waited for it: the waiting task is about to take it."""
        return self._process is not None and self._process.stdout.woken

    async def start(self) -> None:
        """Starts a fresh process (returns once it runs, not necessarily once Python is up: see
        :meth:`warm`)."""
        self.tasks_run = 0
        self.cold = True
        self._process = await self.launcher.launch()
        fields = {"slot": self.index, "pid": self._process.pid, "preloaded": len(self._process.preloaded)}
        log.info("daemon.slot.started", extra=fields)

    async def warm(self) -> None:
        """Starts the process if it is not running, then waits until it answers a ping, for at
        most :data:`STARTUP_TIMEOUT` seconds.

        So a task's timeout counts the task, not the interpreter's start: a slot spawned afresh
        after a kill takes 0.1-1 s to come up on a loaded machine, and a task sent to it at once
        spent that against its limit (a 0.3 s limit failed a 10 ms task). A process that exits
        first, or does not answer in time (killed), is left for the next request, which starts
        another and meets its fate under that request's own limits, as before.
        """
        if not self.alive:
            await self.start()
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                await self._write(PING, "a ping")
                await self._read("a ping")
        except SlotDied:  # logged as it was found; the next request starts another
            return
        except TimeoutError:  # _read killed it as its wait was cut short
            log.warning("daemon.slot.start_timed_out", extra={"slot": self.index, "timeout": STARTUP_TIMEOUT})
            return
        self.cold = False

    async def prepare(self, handler: str) -> None:
        """Replaces an idle process that lacks ``handler`` preloaded when a new one would have it."""
        if self._process is not None and self.launcher.outdated(self._process, handler):
            log.debug("daemon.slot.refreshed", extra={"slot": self.index, "handler": handler})
            await self.stop()
            await self.start()

    async def run(self, handler: str, task_id: str, payload: object) -> SlotReply:
        """Runs one task; raises SlotDied if the process exits first (it starts afresh next time).

        Cancelling ``run`` kills the process: a slot in the middle of a task cannot be reused.
        """
        if trace.enabled:
            trace.mark("slot.write", task_id)
        body = await self._exchange([handler, task_id, payload], f"task {task_id}")
        if trace.enabled:
            trace.mark("slot.reply", task_id)
        self.tasks_run += 1
        return _reply(codec.unpackb(body))

    async def send(self, handler: str, tasks: Sequence[tuple[str, object]]) -> None:
        """Hands the slot several tasks (id, payload) in one write; it runs them in order and
        replies to each as it ends: read the replies with :meth:`reply`, one per task, in order.

        One write (one wake-up of the slot) for many short tasks instead of one each. The reply
        still comes per task, so the task running when the slot dies or is killed is the first
        one without a reply; the ones after it never started.

        Raises:
            SlotDied: the process exited (while running the first task, as far as anyone knows).
        """
        frames = [codec.packb([handler, task_id, payload]) for task_id, payload in tasks]
        parts = [part for frame in frames for part in (HEADER.pack(len(frame)), frame)]
        await self._write(b"".join(parts), f"task {tasks[0][0]}")  # one copy of each frame

    async def reply(self, task_id: str) -> SlotReply:
        """The reply to the next task handed over by :meth:`send` (``task_id``); dies and
        cancels like :meth:`run`."""
        body = await self._read(f"task {task_id}")
        self.tasks_run += 1
        return _reply(codec.unpackb(body))

    def reply_at_hand(self) -> SlotReply | None:
        """The reply to the next task handed over by :meth:`send` if the slot has sent it
        already (None: not yet; then wait for it with :meth:`reply`)."""
        process = self._process
        body = process.stdout.take() if process is not None else None
        if body is None:
            return None
        self.tasks_run += 1
        return _reply(codec.unpackb(body))

    async def run_batch(self, handler: str, tasks: list[tuple[str, object]]) -> list[SlotReply]:
        """Runs a batch handler once over ``tasks`` (id, payload); one reply per task, in order.

        Dies and cancels like :meth:`run`; the batch counts as one task towards ``max_tasks``.
        """
        body = await self._exchange([handler, [list(task) for task in tasks]], f"a batch of {len(tasks)}")
        self.tasks_run += 1
        replies = codec.unpackb(body)
        if not (isinstance(replies, list) and len(replies) == len(tasks)):
            raise SlotDied(f"slot {self.index} answered a batch of {len(tasks)} with {replies!r:.200}")
        return [_reply(reply) for reply in replies]

    async def describe(self, handler: str) -> BatchSpec | None:
        """Imports ``handler`` in the slot: its batch spec, or None for a one-task handler (or one
        that cannot be imported: its tasks report that). Dies and cancels like :meth:`run`."""
        body = await self._exchange([handler], f"describe {handler}")
        spec = codec.unpackb(body)
        if spec is None:
            return None
        try:
            return BatchSpec(int(spec[0]), float(spec[1]))
        except (TypeError, ValueError, IndexError) as exc:  # a bad mark: run it one task at a time
            log.warning("daemon.slot.bad_batch_spec", extra={"handler": handler, "error": repr(exc)})
            return None

    async def _exchange(self, request: list[object], what: str) -> bytes:
        """Sends one request frame and reads its reply frame (starting the process if needed).

        A request holding a large payload (:func:`truba.codec.is_large`) is written in parts,
        the payload as it is: packing it would copy it twice (msgpack's buffer, its bytes)."""
        if any(map(codec.is_large, request)):
            parts = codec.pack_parts(request)
            size = sum(map(len, parts))
            await self._write(HEADER.pack(size) + parts[0], what, *parts[1:])
        else:
            frame = codec.packb(request)
            if len(frame) < LARGE_FRAME:
                await self._write(HEADER.pack(len(frame)) + frame, what)
            else:  # two writes, not a copy of a large payload
                await self._write(HEADER.pack(len(frame)), what, frame)
        return await self._read(what)

    async def _write(self, data: bytes, what: str, *more: bytes) -> None:
        """Writes request frames (``data``, then each of ``more``), starting the process if
        needed; see :meth:`_read` for errors."""
        if not self.alive:
            await self.start()
        process = self._process
        assert process is not None
        try:
            process.stdin.write(data)
            for part in more:
                process.stdin.write(part)
            await process.stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            raise await self._died(what) from exc
        except asyncio.CancelledError:
            await asyncio.shield(self.kill())
            raise

    async def _read(self, what: str) -> bytes:
        """Reads one reply frame. SlotDied if the process is gone; cancelled, kills it."""
        process = self._process
        if process is None:
            raise SlotDied(f"slot {self.index} is not running ({what})")
        try:
            body = await process.stdout.read()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise await self._died(what) from exc
        except asyncio.CancelledError:  # a slot in the middle of a task cannot be reused
            await asyncio.shield(self.kill())
            raise
        return body

    async def _died(self, what: str) -> SlotDied:
        code = await self._reap()
        return SlotDied(f"slot {self.index} exited with {code} while running {what}")

    def private_memory(self) -> int | None:
        """Bytes the process holds privately (USS), None if it is not running."""
        pid = self.pid
        return private_bytes(pid) if pid is not None and self.alive else None

    async def kill(self) -> None:
        """SIGKILL now and reap; idempotent. The next ``run`` (or ``start``) starts afresh."""
        process = self._process
        self.cold = True
        if process is None or process.returncode is not None:
            return
        process.kill()
        await process.wait()
        log.debug("daemon.slot.killed", extra={"slot": self.index, "pid": process.pid})

    async def _reap(self) -> int | None:
        self.cold = True
        if self._process is None:
            return None
        self._process.kill()
        code = await self._process.wait()
        log.warning("daemon.slot.died", extra={"slot": self.index, "returncode": code})
        return code

    async def stop(self) -> None:
        """Stops the slot: EOF on stdin, then SIGKILL if it does not exit within 2 s."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.stdin.close()
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), 2.0)
        except TimeoutError:
            process.kill()
            await process.wait()


def _reply(frame: list[object]) -> SlotReply:
    task_id, ok, value, seconds = frame
    if ok:
        return SlotReply(str(task_id), True, value, None, float(seconds))  # type: ignore[arg-type]
    assert isinstance(value, list)
    error = ErrorInfo(str(value[0]), str(value[1]), str(value[2]))
    kinds = tuple(str(kind) for kind in value[3]) if len(value) > 3 and isinstance(value[3], list) else ()
    return SlotReply(str(task_id), False, None, error, float(seconds), kinds)  # type: ignore[arg-type]
