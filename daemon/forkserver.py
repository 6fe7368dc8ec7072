"""Slots forked from a warm template that preloaded the handlers (see :mod:`truba.daemon.template`).

:class:`ForkServer` is a :class:`~truba.daemon.launch.Launcher`. It keeps one template process
per handler set: :meth:`ForkServer.preload` adds the handlers of newly assigned jobs, and the
next launch starts a template for the larger set (the old one stays until its last slot exits,
since its slots die with it). Runners replace idle slots that lack their handler
(:meth:`ForkServer.outdated`), so slots end up sharing the preloaded modules.

A forked slot is the template's child, not the daemon's: the daemon watches it with a pidfd
(death noticed at once, SIGKILL without any pid-reuse race), measures it by pid like any slot,
and learns its exit code from the template's report. A template that dies is started again at
the next launch. A template that cannot start (or Linux without pidfds) makes the server spawn
slots as before (:class:`~truba.daemon.launch.Spawn`), with a warning, and try again later.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Final, final

from truba.daemon.launch import Launcher, SlotHandle, Spawn, spawn_python
from truba.daemon.pipe_size import SLOT_PIPE_BYTES, widen
from truba.daemon.replies import ReplyReader, reply_reader
from truba.daemon.template import MESSAGE

log = logging.getLogger(__name__)
PROGRAM: Final = ("-m", "truba.daemon.template")
MAX_CODES: Final = 1024
UNKNOWN_EXIT: Final = -255
"""A forked slot's exit code when its template died before reporting it."""


class TemplateDied(Exception):
    """The template process is gone (or never became ready)."""


@final
class ForkedSlot:
    """A slot forked by a template: watched by pidfd, its exit code reported by the template."""

    def __init__(
        self, pid: int, template: Template, stdin: asyncio.StreamWriter, stdout: ReplyReader
    ) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.preloaded = template.handlers
        self._template = template
        self._exited = asyncio.Event()
        self._code: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # it exited and was reaped already
            self._pidfd = -1
            self._exited.set()
        else:
            asyncio.get_running_loop().add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        # Let go of everything now: a slot found dead while idle is replaced without a wait().
        asyncio.get_running_loop().remove_reader(self._pidfd)
        self._reap_if_orphaned()
        os.close(self._pidfd)
        self._pidfd = -1
        self.stdin.close()
        self._exited.set()

    def _reap_if_orphaned(self) -> None:
        """Reaps the slot if it became the daemon's child: its template died first and the
        daemon is PID 1 (a container without an init) or a subreaper, where an orphan goes. The
        template reaps its own children; an orphan nobody reaps stays a zombie for the daemon's
        life. By pidfd (``P_PIDFD``), so no other process can be reaped by mistake."""
        try:
            info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:  # the template's child, as usual: the template reaps it
            return
        if info is not None and self._code is None:
            killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            self._code = -info.si_status if killed else info.si_status
            log.info("daemon.forkserver.orphan_reaped", extra={"pid": self.pid, "code": self._code})

    @property
    def returncode(self) -> int | None:
        if not self._exited.is_set():
            return None
        if self._code is None:
            self._code = self._template.codes.pop(self.pid, None)
        return UNKNOWN_EXIT if self._code is None else self._code

    def kill(self) -> None:
        if not self._exited.is_set() and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self) -> int | None:
        await self._exited.wait()
        if self._code is None:
            self._code = await self._template.exit_code(self.pid, 2.0)
        return self._code


@final
class Template:
    """One template process and the daemon's end of its control socket."""

    def __init__(
        self, handlers: frozenset[str], program: Sequence[str], pipe_bytes: int = SLOT_PIPE_BYTES
    ) -> None:
        self.handlers = handlers
        self.program = tuple(program)
        self.pipe_bytes = pipe_bytes
        """The capacity of each pipe of a slot forked from here (see truba.daemon.pipe_size)."""
        self.codes: dict[int, int] = {}
        """Exit codes the template reported, by pid (taken by :meth:`exit_code`)."""
        self.children: set[int] = set()
        self.retired = False
        self.pid: int | None = None
        self.loaded = 0
        self._process: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._forks: collections.deque[asyncio.Future[int]] = collections.deque()
        self._lock = asyncio.Lock()
        self._reported = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._dead = False

    @property
    def alive(self) -> bool:
        return not self._dead and self._process is not None and self._process.returncode is None

    async def start(self, timeout: float) -> None:
        """Starts the template and waits until it preloaded. Raises TemplateDied or OSError."""
        if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
            raise TemplateDied("pidfds are not available here")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = await spawn_python(
                *self.program,
                str(theirs.fileno()),
                *sorted(self.handlers),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                env=os.environ.copy(),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        try:
            ready = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(ours, MESSAGE.size), timeout)
        except (TimeoutError, OSError) as exc:
            await self.close()
            raise TemplateDied(f"the template did not become ready: {type(exc).__name__} {exc}") from exc
        if len(ready) != MESSAGE.size or ready[:1] != b"R":
            await self.close()
            code = self._process.returncode
            raise TemplateDied(f"the template exited before it was ready (exit code {code})")
        _, self.pid, self.loaded = MESSAGE.unpack(ready)
        self._reader = asyncio.create_task(self._read(), name=f"template-{self.pid}")

    async def fork(self) -> ForkedSlot:
        """A new slot from this template. Raises TemplateDied."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            if not self.alive or self._sock is None:
                raise TemplateDied("the template is gone")
            stdin_r, stdin_w = os.pipe()
            stdout_r, stdout_w = os.pipe()
            widen(stdin_w, self.pipe_bytes)
            widen(stdout_w, self.pipe_bytes)
            future: asyncio.Future[int] = loop.create_future()
            try:
                socket.send_fds(self._sock, [MESSAGE.pack(b"F", 0, 0)], [stdin_r, stdout_w])
                self._forks.append(future)
            except OSError as exc:
                for fd in (stdin_w, stdout_r):
                    os.close(fd)
                raise TemplateDied(f"cannot reach the template: {exc}") from exc
            finally:
                os.close(stdin_r)
                os.close(stdout_w)
            try:
                pid = await asyncio.wait_for(future, 5.0)
            except BaseException:
                os.close(stdin_w)
                os.close(stdout_r)
                raise
        reader = await reply_reader(stdout_r)
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
        transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(stdin_w, "wb", 0))
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return ForkedSlot(pid, self, writer, reader)

    async def exit_code(self, pid: int, timeout: float) -> int | None:
        """The exit code the template reports for ``pid``; None if it cannot (it died)."""
        deadline = time.monotonic() + timeout
        while pid not in self.codes and self.alive:
            self._reported.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reported.wait(), max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        return self.codes.pop(pid, None)

    def retire(self) -> None:
        """No more forks from this one; it closes once its last slot has exited."""
        self.retired = True
        if not self.children and self._closing is None:
            self._closing = asyncio.create_task(self.close())

    async def _read(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(self._sock, MESSAGE.size)
                if len(data) != MESSAGE.size:
                    break
                kind, pid, value = MESSAGE.unpack(data)
                if kind == b"P" and self._forks:
                    # A child from now on, before its fork() resumes: a retire() in between
                    # must not close the template under it (its slot would die with it).
                    self.children.add(pid)
                    self._forks.popleft().set_result(pid)
                elif kind == b"X":
                    if len(self.codes) >= MAX_CODES:  # of slots nobody waited for (replaced)
                        self.codes.pop(next(iter(self.codes)))
                    self.codes[pid] = value
                    self.children.discard(pid)
                    self._reported.set()
                    if self.retired and not self.children:
                        break
        except OSError:
            pass
        finally:
            if not self._dead and not self.retired:
                log.warning("daemon.forkserver.template_died", extra={"pid": self.pid})
            await self.close()

    async def close(self) -> None:
        """Closes the socket (the template exits on EOF, SIGKILL after 2 s); idempotent."""
        self._dead = True
        self._reported.set()
        while self._forks:
            future = self._forks.popleft()
            if not future.done():
                future.set_exception(TemplateDied("the template died"))
        if self._sock is not None:
            # Unwatched before it is closed: the reader's wait on it would leave the loop holding
            # its number as watched, and a pidfd opened next under that number (a slot forked
            # meanwhile) would never be watched: its exit never seen, a kill waited on forever.
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        process = self._process
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), 2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        reader = self._reader
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()


@final
class ForkServer:
    """Forks slots from a template holding ``handlers`` preloaded; see the module docstring.

    ``program`` is the template's command after ``python`` (replaceable in tests);
    ``start_timeout`` bounds a template's preload; after a failed start slots are spawned for
    ``retry_after`` seconds before a template is tried again.
    """

    def __init__(
        self,
        handlers: Iterable[str] = (),
        *,
        program: Sequence[str] = PROGRAM,
        start_timeout: float = 10.0,
        retry_after: float = 60.0,
        fallback: Launcher | None = None,
        pipe_bytes: int = SLOT_PIPE_BYTES,
    ) -> None:
        self.handlers = frozenset(handlers)
        self.pipe_bytes = pipe_bytes
        self.program = tuple(program)
        self.start_timeout = start_timeout
        self.retry_after = retry_after
        self.fallback = fallback or Spawn(pipe_bytes)
        self._current: Template | None = None
        self._templates: set[Template] = set()
        self._retry_at = 0.0
        self._starting = asyncio.Lock()

    @property
    def template(self) -> Template | None:
        """The template slots are forked from now, if one runs."""
        current = self._current
        return current if current is not None and current.alive else None

    def preload(self, handlers: Iterable[str]) -> None:
        """Adds handlers; the next launch forks from a template that preloaded them too."""
        wanted = self.handlers | frozenset(handlers)
        if wanted != self.handlers:
            self.handlers = wanted
            self._retry_at = 0.0  # the new handler may be what broke the last start
            log.info("daemon.forkserver.preload", extra={"handlers": sorted(wanted)})

    def outdated(self, handle: SlotHandle, handler: str) -> bool:
        return (
            handler in self.handlers
            and handler not in handle.preloaded
            and time.monotonic() >= self._retry_at
        )

    async def launch(self) -> SlotHandle:
        for _ in range(2):  # a template that died since the last launch is replaced once
            template = await self._template()
            if template is None:
                break
            try:
                return await template.fork()
            except TemplateDied as exc:
                log.warning("daemon.forkserver.fork_failed", extra={"error": str(exc)})
        return await self.fallback.launch()

    async def _template(self) -> Template | None:
        async with self._starting:
            current = self._current
            if current is not None and current.alive and current.handlers == self.handlers:
                return current
            if current is not None:
                self._current = None
                current.retire()
            if time.monotonic() < self._retry_at:
                return None
            template = Template(self.handlers, self.program, self.pipe_bytes)
            began = time.perf_counter()
            try:
                await template.start(self.start_timeout)
            except (TemplateDied, OSError) as exc:
                self._retry_at = time.monotonic() + self.retry_after
                log.warning(
                    "daemon.forkserver.unavailable",
                    extra={"error": f"{type(exc).__name__}: {exc}", "fallback": "spawn"},
                )
                return None
            self._templates = {t for t in self._templates if t.alive}
            self._templates.add(template)
            self._current = template
            log.info(
                "daemon.forkserver.started",
                extra={
                    "pid": template.pid,
                    "handlers": sorted(template.handlers),
                    "preloaded": template.loaded,
                    "seconds": round(time.perf_counter() - began, 3),
                },
            )
            return template

    async def close(self) -> None:
        """Closes every template (their remaining slots die with them)."""
        self._current = None
        await asyncio.gather(*(t.close() for t in self._templates), return_exceptions=True)
        self._templates.clear()
        await self.fallback.close()
