"""An asyncio TCP proxy that injects network faults between clients and one target (a broker).

The vocabulary is Toxiproxy's. *Toxics* hold until changed and apply to every connection, per direction
(``upstream`` = client → target, ``downstream`` = target → client, or ``both``):

- :meth:`FaultProxy.stall`: stop forwarding; sockets stay open, nothing (not even a FIN) passes, so only
  heartbeats can notice. Unread bytes back up into the peers' TCP buffers.
- :meth:`FaultProxy.latency`: delay every chunk by ``ms`` ± ``jitter_ms``, keeping order and throughput.
- :meth:`FaultProxy.bandwidth`: cap throughput in bytes per second.
- :meth:`FaultProxy.refuse`: reset new connections as soon as they are accepted.
- :meth:`FaultProxy.pass_`: clear all of the above.

*Actions* hit the connections open right now: :meth:`FaultProxy.cut` resets both sides (SO_LINGER 0 →
RST), :meth:`FaultProxy.close_all` closes them with a FIN.

A half-close (EOF) on one side is passed on as an EOF to the other; a reset is passed on as a reset.
Expected network errors are logged at debug level only. The proxy runs in the caller's event loop; see
:class:`truba.local.proxy_thread.ThreadedFaultProxy` for a blocking API on a loop of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import struct
from dataclasses import dataclass, field
from typing import Final, Literal, final

log = logging.getLogger(__name__)

Direction = Literal["upstream", "downstream", "both"]
_DIRECTIONS: Final = ("upstream", "downstream")
_CHUNK: Final = 65536
_QUEUE_CHUNKS: Final = 16
_BANDWIDTH_SLICE_S: Final = 0.05
_LINGER_RST: Final = struct.pack("ii", 1, 0)
_NETWORK_ERRORS: Final = (ConnectionError, OSError)  # TimeoutError is an OSError too


@dataclass
class _Toxics:
    """The faults applied to one direction of every connection."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    rate: float | None = None
    flowing: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.flowing.set()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes with RST: SO_LINGER 0 makes close() drop buffered data and send a reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        except OSError:
            pass
    writer.transport.abort()


@final
class _Connection:
    """One proxied client connection: two sockets and the four pump tasks between them."""

    def __init__(
        self,
        cid: int,
        handler: asyncio.Task[None],
        client: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter,
    ) -> None:
        self.cid = cid
        self.handler = handler
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []
        self.eof_sent: set[str] = set()
        self.closed = False

    def terminate(self, rst: bool) -> None:
        """Stops the pumps and closes both sockets, with RST or FIN. Idempotent."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for writer in (self.client, self.upstream):
            if rst:
                _reset(writer)
            else:
                writer.close()


@final
class FaultProxy:
    """Forwards TCP connections from ``listen_host:listen_port`` to the target, with injectable faults.

    ``listen_port=0`` picks a free port; read it from :attr:`port` after :meth:`start`. Toxic setters
    must be called from the proxy's event loop thread.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        connect_timeout: float = 10.0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._toxics: dict[str, _Toxics] = {}
        self._refusing = False
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._rng = random.Random()

    @property
    def port(self) -> int:
        """The port the proxy listens on (after :meth:`start`)."""
        return self._listen_port

    @property
    def host(self) -> str:
        """The address the proxy listens on."""
        return self.listen_host

    @property
    def connection_count(self) -> int:
        """Client connections currently proxied."""
        return len(self._connections)

    @property
    def refusing(self) -> bool:
        """True while new connections are reset at once."""
        return self._refusing

    async def start(self) -> None:
        """Starts listening.

        Raises:
            OSError: the listen address is unavailable.
        """
        self._toxics = {direction: _Toxics() for direction in _DIRECTIONS}
        self._server = await asyncio.start_server(self._handle, self.listen_host, self._listen_port)
        self._listen_port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "local.proxy.started",
            extra={"listen": f"{self.listen_host}:{self._listen_port}", "target": self._target},
        )

    @property
    def _target(self) -> str:
        return f"{self.target_host}:{self.target_port}"

    async def close(self) -> None:
        """Stops listening, resets every connection and waits for all tasks. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.terminate(rst=True)
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers)
        if server is not None:
            await server.wait_closed()  # on 3.12+ this waits for the connections closed above
            log.info("local.proxy.closed", extra={"listen": f"{self.listen_host}:{self._listen_port}"})

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- toxics ---------------------------------------------------------------------------------------

    def _select(self, direction: Direction) -> list[_Toxics]:
        if not self._toxics:
            raise RuntimeError("FaultProxy.start() was not called")
        return list(self._toxics.values()) if direction == "both" else [self._toxics[direction]]

    def pass_(self) -> None:
        """Clears every toxic: forward everything, immediately, at full speed, and accept connections."""
        for toxics in self._select("both"):
            toxics.latency_s = toxics.jitter_s = 0.0
            toxics.rate = None
            toxics.flowing.set()
        self._refusing = False
        log.info("local.proxy.pass", extra={"listen": self._listen_port})

    def stall(self, direction: Direction = "both") -> None:
        """Stops forwarding bytes (and EOFs) in ``direction``; sockets stay open. :meth:`pass_` undoes it."""
        for toxics in self._select(direction):
            toxics.flowing.clear()
        log.info("local.proxy.stall", extra={"listen": self._listen_port, "direction": direction})

    def latency(self, ms: float, jitter_ms: float = 0.0, direction: Direction = "both") -> None:
        """Delays each chunk by ``ms`` ± ``jitter_ms`` milliseconds (order is kept); 0 clears it."""
        for toxics in self._select(direction):
            toxics.latency_s, toxics.jitter_s = ms / 1000, jitter_ms / 1000
        log.info("local.proxy.latency", extra={"listen": self._listen_port, "ms": ms, "jitter_ms": jitter_ms})

    def bandwidth(self, bytes_per_s: float | None, direction: Direction = "both") -> None:
        """Caps throughput at ``bytes_per_s`` per connection and direction; ``None`` lifts the cap."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError("bytes_per_s must be positive; use stall() to stop traffic")
        for toxics in self._select(direction):
            toxics.rate = bytes_per_s
        log.info("local.proxy.bandwidth", extra={"listen": self._listen_port, "bytes_per_s": bytes_per_s})

    def refuse(self, on: bool = True) -> None:
        """While on, new connections are reset as soon as they are accepted; open ones are untouched."""
        self._refusing = on
        log.info("local.proxy.refuse", extra={"listen": self._listen_port, "on": on})

    # -- actions --------------------------------------------------------------------------------------

    async def cut(self) -> int:
        """Resets (RST) both sides of every open connection; returns how many there were."""
        return await self._terminate_all(rst=True)

    async def close_all(self) -> int:
        """Closes (FIN) both sides of every open connection; returns how many there were."""
        return await self._terminate_all(rst=False)

    async def _terminate_all(self, rst: bool) -> int:
        conns = list(self._connections)
        for conn in conns:
            conn.terminate(rst)
        # Wait for the handlers, so that on return connection_count is 0 and the sockets are closed.
        if conns:
            await asyncio.wait([conn.handler for conn in conns])
        await asyncio.sleep(0)
        log.info("local.proxy.cut" if rst else "local.proxy.close_all", extra={"connections": len(conns)})
        return len(conns)

    # -- forwarding -----------------------------------------------------------------------------------

    async def _handle(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(client_reader, client)
        except asyncio.CancelledError:
            # Only close() cancels a handler. asyncio's stream callback logs a handler that ends
            # cancelled as an error, so it ends normally; the sockets were closed on the way out.
            pass
        finally:
            self._handlers.discard(task)

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        if self._refusing:
            _reset(client)
            log.debug("local.proxy.refused", extra={"listen": self._listen_port})
            return
        try:
            upstream_reader, upstream = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port), self._connect_timeout
            )
        except _NETWORK_ERRORS as exc:
            _reset(client)
            log.info("local.proxy.upstream_unreachable", extra={"target": self._target, "error": repr(exc)})
            return
        except asyncio.CancelledError:
            _reset(client)
            raise
        handler = asyncio.current_task()
        assert handler is not None
        conn = _Connection(next(self._ids), handler, client, upstream)
        self._connections.add(conn)
        log.debug("local.proxy.connection.opened", extra={"listen": self._listen_port, "conn": conn.cid})
        try:
            for direction, reader, writer in (
                ("upstream", client_reader, upstream),
                ("downstream", upstream_reader, client),
            ):
                queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
                toxics = self._toxics[direction]
                conn.tasks.append(asyncio.create_task(self._read(conn, toxics, reader, queue)))
                conn.tasks.append(asyncio.create_task(self._write(conn, direction, toxics, writer, queue)))
            await asyncio.wait(conn.tasks)
        finally:
            conn.terminate(rst=True)  # no-op after an orderly close; resets if we were cancelled
            if conn.tasks:
                await asyncio.wait(conn.tasks)
            self._connections.discard(conn)
            log.debug("local.proxy.connection.closed", extra={"listen": self._listen_port, "conn": conn.cid})

    async def _read(
        self,
        conn: _Connection,
        toxics: _Toxics,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await toxics.flowing.wait()  # a stalled direction reads nothing, so the peer backs up
            try:
                data = await reader.read(_CHUNK)
            except _NETWORK_ERRORS as exc:
                log.debug("local.proxy.peer_reset", extra={"conn": conn.cid, "error": repr(exc)})
                conn.terminate(rst=True)
                return
            if not data:
                await queue.put(None)
                return
            delay = max(0.0, toxics.latency_s + self._rng.uniform(-toxics.jitter_s, toxics.jitter_s))
            await queue.put((loop.time() + delay, data))

    async def _write(
        self,
        conn: _Connection,
        direction: str,
        toxics: _Toxics,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        next_at = 0.0  # bandwidth: when the next slice may go
        try:
            while True:
                item = await queue.get()
                if item is None:
                    await toxics.flowing.wait()
                    self._forward_eof(conn, direction, writer)
                    return
                due, data = item
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                view = memoryview(data)
                while view:
                    await toxics.flowing.wait()
                    rate = toxics.rate
                    size = len(view) if rate is None else max(1, int(rate * _BANDWIDTH_SLICE_S))
                    if rate is not None and next_at > loop.time():
                        await asyncio.sleep(next_at - loop.time())
                    piece, view = view[:size], view[size:]
                    if writer.is_closing():
                        raise ConnectionResetError("peer socket closed")
                    writer.write(piece)
                    await writer.drain()
                    if rate is not None:
                        next_at = max(next_at, loop.time()) + len(piece) / rate
        except _NETWORK_ERRORS as exc:
            log.debug("local.proxy.write_failed", extra={"conn": conn.cid, "error": repr(exc)})
            conn.terminate(rst=True)

    def _forward_eof(self, conn: _Connection, direction: str, writer: asyncio.StreamWriter) -> None:
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
        conn.eof_sent.add(direction)
        if len(conn.eof_sent) == len(_DIRECTIONS):
            conn.terminate(rst=False)
