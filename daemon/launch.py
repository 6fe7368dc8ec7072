"""How a slot process comes to be: the :class:`Launcher` seam, and spawning (the fallback).

A launcher hands out :class:`SlotHandle` objects: a running slot's pid, its frame pipes, and a
way to kill and wait for it. :class:`Spawn` starts each slot as a fresh interpreter
(``python -m truba.daemon.slot_main``); :class:`~truba.daemon.forkserver.ForkServer` forks it from a
warm template that preloaded the handlers' modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import warnings
from typing import Protocol, final

from truba.daemon.pipe_size import SLOT_PIPE_BYTES, widen
from truba.daemon.replies import ReplyReader, reply_reader


class SlotHandle(Protocol):
    """One running slot process, whoever started it."""

    @property
    def pid(self) -> int: ...

    @property
    def stdin(self) -> asyncio.StreamWriter: ...

    @property
    def stdout(self) -> ReplyReader: ...

    @property
    def returncode(self) -> int | None:
        """None while it runs (as far as the daemon has noticed); its exit code after."""

    @property
    def preloaded(self) -> frozenset[str]:
        """Handlers whose modules were imported before this slot started."""

    def kill(self) -> None:
        """SIGKILL, now; does nothing once it has exited."""

    async def wait(self) -> int | None:
        """Waits until it exits; its exit code (None if nobody could tell, see ForkServer)."""


class Launcher(Protocol):
    """Starts slot processes. ``close`` ends what the launcher itself keeps running."""

    async def launch(self) -> SlotHandle:
        """A new running slot. Raises OSError if no process could be started."""

    def outdated(self, handle: SlotHandle, handler: str) -> bool:
        """True if a slot started now would have ``handler`` preloaded and ``handle`` has not."""

    async def close(self) -> None: ...


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


async def spawn_python(*args: str, **kwargs: object) -> asyncio.subprocess.Process:
    """``python *args`` as a child of the daemon, watched by pidfd (see above)."""
    _use_pidfd_child_watcher()
    return await asyncio.create_subprocess_exec(sys.executable, *args, **kwargs)  # type: ignore[arg-type]


@final
class SpawnedSlot:
    """A slot that is the daemon's own child (``asyncio.subprocess.Process``)."""

    preloaded: frozenset[str] = frozenset()

    def __init__(self, process: asyncio.subprocess.Process, stdout: ReplyReader) -> None:
        assert process.stdin is not None
        self._process = process
        self.stdin: asyncio.StreamWriter = process.stdin
        self.stdout = stdout

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def kill(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    async def wait(self) -> int | None:
        return await self._process.wait()


@final
class Spawn:
    """A fresh interpreter per slot: nothing preloaded, nothing shared (but simple and robust).

    ``pipe_bytes``: the capacity of each slot pipe (see :mod:`truba.daemon.pipe_size`)."""

    def __init__(self, pipe_bytes: int = SLOT_PIPE_BYTES) -> None:
        self.pipe_bytes = pipe_bytes

    async def launch(self) -> SlotHandle:
        stdout_r, stdout_w = os.pipe()
        widen(stdout_w, self.pipe_bytes)
        try:
            # The pipe is watched before the process starts: no await may come after that,
            # lest a cancellation leave a slot process nobody knows of.
            stdout = await reply_reader(stdout_r)
            try:
                process = await spawn_python(
                    "-m",
                    "truba.daemon.slot_main",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=stdout_w,
                    env=os.environ.copy(),
                )
            except BaseException:
                stdout.close()
                raise
        finally:
            os.close(stdout_w)
        stdin = process.stdin.transport.get_extra_info("pipe") if process.stdin is not None else None
        if stdin is not None:
            widen(stdin.fileno(), self.pipe_bytes)
        return SpawnedSlot(process, stdout)

    def outdated(self, handle: SlotHandle, handler: str) -> bool:
        return False

    async def close(self) -> None:
        return None
