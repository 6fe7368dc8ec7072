"""Slot subprocesses, seen from the daemon: start, run a task or a batch, notice death, kill, measure.

A slot is a ``python -m truba.daemon.slot`` child speaking length-prefixed msgpack frames over
its stdin/stdout (see :mod:`truba.daemon.slot`). The process boundary protects the daemon from
the handler's crashes, leaks and hangs: a task that must stop *now* (timeout, memory limit,
preemption) is stopped by killing its slot, which is then started afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import warnings
from dataclasses import dataclass
from typing import final

import msgpack

from truba.daemon.memory import private_bytes
from truba.daemon.slot import HEADER
from truba.handlers import BatchSpec
from truba.wire import ErrorInfo

log = logging.getLogger(__name__)


def _use_pidfd_child_watcher() -> None:
    """On Python 3.11, watch children with pidfds (the 3.12 default) instead of a thread each.

    The thread-per-child watcher races with ``subprocess``'s own reaping of abandoned Popen
    objects and then reports a crashed slot's exit status as 255; pidfds cannot be confused.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        watcher = policy.get_child_watcher()
        if not isinstance(watcher, asyncio.PidfdChildWatcher):
            watcher = asyncio.PidfdChildWatcher()
            policy.set_child_watcher(watcher)
        loop = asyncio.get_running_loop()
        # Re-attaching drops the watches of running children: only attach to a new loop.
        if getattr(watcher, "_loop", None) is not loop:
            watcher.attach_loop(loop)


class SlotDied(Exception):
    """The slot process exited while running a task."""


@dataclass(frozen=True, slots=True)
class SlotReply:
    """What a slot reports for one task."""

    task_id: str
    ok: bool
    value: object
    error: ErrorInfo | None
    seconds: float


@final
class SlotProcess:
    """One slot subprocess; runs one task at a time."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._process: asyncio.subprocess.Process | None = None
        self.tasks_run = 0
        """Tasks this process has answered (reset when the process is replaced)."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        """Starts a fresh process (returns once it is spawned, not once Python is up)."""
        _use_pidfd_child_watcher()
        self.tasks_run = 0
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "truba.daemon.slot",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=os.environ.copy(),
        )
        log.info("daemon.slot.started", extra={"slot": self.index, "pid": self._process.pid})

    async def run(self, handler: str, task_id: str, payload: object) -> SlotReply:
        """Runs one task; raises SlotDied if the process exits first (it starts afresh next time).

        Cancelling ``run`` kills the process: a slot in the middle of a task cannot be reused.
        """
        body = await self._exchange([handler, task_id, payload], f"task {task_id}")
        self.tasks_run += 1
        return _reply(msgpack.unpackb(body, raw=False, strict_map_key=False))

    async def run_batch(self, handler: str, tasks: list[tuple[str, object]]) -> list[SlotReply]:
        """Runs a batch handler once over ``tasks`` (id, payload); one reply per task, in order.

        Dies and cancels like :meth:`run`; the batch counts as one task towards ``max_tasks``.
        """
        body = await self._exchange([handler, [list(task) for task in tasks]], f"a batch of {len(tasks)}")
        self.tasks_run += 1
        replies = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if not (isinstance(replies, list) and len(replies) == len(tasks)):
            raise SlotDied(f"slot {self.index} answered a batch of {len(tasks)} with {replies!r:.200}")
        return [_reply(reply) for reply in replies]

    async def describe(self, handler: str) -> BatchSpec | None:
        """Imports ``handler`` in the slot: its batch spec, or None for a one-task handler (or one
        that cannot be imported: its tasks report that). Dies and cancels like :meth:`run`."""
        body = await self._exchange([handler], f"describe {handler}")
        spec = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if spec is None:
            return None
        try:
            return BatchSpec(int(spec[0]), float(spec[1]))
        except (TypeError, ValueError, IndexError) as exc:  # a bad mark: run it one task at a time
            log.warning("daemon.slot.bad_batch_spec", extra={"handler": handler, "error": repr(exc)})
            return None

    async def _exchange(self, request: object, what: str) -> bytes:
        """Sends one request frame and reads its reply frame (starting the process if needed)."""
        if not self.alive:
            await self.start()
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        frame = msgpack.packb(request, use_bin_type=True)
        try:
            process.stdin.write(HEADER.pack(len(frame)) + frame)
            await process.stdin.drain()
            header = await process.stdout.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            body: bytes = await process.stdout.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            code = await self._reap()
            raise SlotDied(f"slot {self.index} exited with {code} while running {what}") from exc
        except asyncio.CancelledError:
            await asyncio.shield(self.kill())
            raise
        return body

    def private_memory(self) -> int | None:
        """Bytes the process holds privately (USS), None if it is not running."""
        pid = self.pid
        return private_bytes(pid) if pid is not None and self.alive else None

    async def kill(self) -> None:
        """SIGKILL now and reap; idempotent. The next ``run`` (or ``start``) starts afresh."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        log.debug("daemon.slot.killed", extra={"slot": self.index, "pid": process.pid})

    async def _reap(self) -> int | None:
        if self._process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        code = await self._process.wait()
        log.warning("daemon.slot.died", extra={"slot": self.index, "returncode": code})
        return code

    async def stop(self) -> None:
        """Stops the slot: EOF on stdin, then SIGKILL if it does not exit within 2 s."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 2.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            await process.wait()


def _reply(frame: list[object]) -> SlotReply:
    task_id, ok, value, seconds = frame
    if ok:
        return SlotReply(str(task_id), True, value, None, float(seconds))  # type: ignore[arg-type]
    assert isinstance(value, list)
    error = ErrorInfo(str(value[0]), str(value[1]), str(value[2]))
    return SlotReply(str(task_id), False, None, error, float(seconds))  # type: ignore[arg-type]
