"""The daemon's end of a slot's stdout: length-prefixed msgpack frames, split as they arrive.

An asyncio protocol rather than a ``StreamReader``: whole frames wait in a queue, so a reply that
is already here is taken without waiting (:meth:`ReplyReader.take`). A chunk of short tasks
(:meth:`~truba.daemon.slot_process.SlotProcess.send`) has most of its replies read that way, with no
task, timer or wait of its own.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import final

from truba.daemon.slot_main import HEADER, LARGE_FRAME


@final
class ReplyReader(asyncio.Protocol):
    """Frames read from one slot process's stdout, in order; ends at EOF (the slot exited)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._large: list[bytes] = []
        """The chunks read so far of a large frame (:data:`LARGE_FRAME` or longer), joined once
        it is whole: one copy of it, not two (into the buffer, then out of it)."""
        self._missing = 0
        """Bytes of that large frame still to come (0: none is being read)."""
        self._frames: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.woken = False
        """A :meth:`read` waiting for a frame was woken (a frame came, or EOF): its task is about
        to take it (a watch that would cancel that task lets the reply win instead)."""
        self._ended = False
        self._transport: asyncio.BaseTransport | None = None

    def close(self) -> None:
        """Closes the pipe (for a slot that never started)."""
        if self._transport is not None:
            self._transport.close()

    # -- protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._missing:
            self._more(data)
            return
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            end = start + HEADER.size + size
            if len(buffer) < end:
                if size >= LARGE_FRAME:  # its chunks are kept as they come, joined once
                    with memoryview(buffer) as view:
                        self._large.append(bytes(view[start + HEADER.size :]))
                    self._missing = end - len(buffer)
                    buffer.clear()
                    start = 0
                break
            with memoryview(buffer) as view:  # one copy of the frame (a slice would be two)
                self._frames.append(bytes(view[start + HEADER.size : end]))
            start = end
        if start:
            del buffer[:start]
        if self._frames:
            self._wake()

    def _more(self, data: bytes) -> None:
        """The next chunk of a large frame (and perhaps what follows it)."""
        if len(data) < self._missing:
            self._large.append(data)
            self._missing -= len(data)
            return
        cut = self._missing
        self._large.append(data[:cut] if cut < len(data) else data)
        self._frames.append(b"".join(self._large))
        self._large, self._missing = [], 0
        if cut < len(data):
            self.data_received(data[cut:])
        self._wake()

    def eof_received(self) -> bool:
        self._end()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    # -- reading -----------------------------------------------------------------------------------

    def take(self) -> bytes | None:
        """The next frame if it is here already, else None (without waiting)."""
        return self._frames.popleft() if self._frames else None

    async def read(self) -> bytes:
        """The next frame, once it is here.

        Raises:
            asyncio.IncompleteReadError: the slot closed its stdout (exited) first; ``partial``
                holds what it wrote of an unfinished frame.
        """
        while not self._frames:
            if self._ended:
                raise asyncio.IncompleteReadError(b"".join([*self._large, self._buffer]), None)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
                self.woken = False
        return self._frames.popleft()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
            self.woken = True


async def reply_reader(fd: int) -> ReplyReader:
    """A :class:`ReplyReader` on ``fd``, the read end of a slot's stdout pipe (taken over)."""
    reader = ReplyReader()
    try:
        pipe = os.fdopen(fd, "rb", 0)
    except BaseException:
        os.close(fd)
        raise
    await asyncio.get_running_loop().connect_read_pipe(lambda: reader, pipe)
    return reader
