"""FaultProxy against a local asyncio echo server: each toxic and action, and clean shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from truba.local import FaultProxy, ThreadedFaultProxy

BOUND = 5.0  # every wait in these tests is bounded


class EchoServer:
    """Echoes every byte back; records how each server-side connection ended."""

    def __init__(self) -> None:
        self.endings: list[str] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            self.endings.append("eof")
        except ConnectionResetError:
            self.endings.append("reset")
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture(autouse=True)
def no_error_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Expected closes and resets must not be logged as warnings or errors (asyncio's included)."""
    caplog.set_level(logging.DEBUG)
    yield
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [f"{r.name}: {r.getMessage()}" for r in loud]


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = EchoServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def proxy(echo: EchoServer) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy("127.0.0.1", echo.port)
    await proxy.start()
    yield proxy
    await proxy.close()


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await wait_until(lambda: proxy.connection_count >= 1)
    return reader, writer


async def wait_until(predicate: object, timeout: float = BOUND) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes, timeout: float = BOUND
) -> bytes:
    writer.write(payload)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)


async def test_pass_forwards_bytes_both_ways(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer, b"hello") == b"hello"
    big = bytes(range(256)) * 8192  # 2 MiB, more than any socket buffer
    assert await roundtrip(reader, writer, big) == big
    assert proxy.connection_count == 1
    writer.close()
    await writer.wait_closed()
    await wait_until(lambda: proxy.connection_count == 0)


async def test_stall_stops_bytes_but_keeps_the_connection_open(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    # Given a stalled proxy, when the client sends, then nothing comes back and nothing closes.
    proxy.stall()
    writer.write(b"ping")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.3)
    assert proxy.connection_count == 1
    assert not reader.at_eof()
    # When the stall is lifted, the held bytes flow.
    proxy.pass_()
    assert await asyncio.wait_for(reader.readexactly(4), BOUND) == b"ping"
    writer.close()


async def test_stall_holds_back_eof_too(proxy: FaultProxy, echo: EchoServer) -> None:
    reader, writer = await connect(proxy)
    proxy.stall("upstream")
    writer.write_eof()
    await asyncio.sleep(0.2)
    assert echo.endings == []
    proxy.pass_()
    assert await asyncio.wait_for(reader.read(), BOUND) == b""
    await wait_until(lambda: echo.endings == ["eof"])
    writer.close()


async def test_cut_resets_the_client_and_the_server(proxy: FaultProxy, echo: EchoServer) -> None:
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer, b"x") == b"x"
    assert await proxy.cut() == 1
    assert proxy.connection_count == 0
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), BOUND)
    await wait_until(lambda: echo.endings == ["reset"])
    writer.close()


async def test_cut_works_while_stalled(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.stall()
    assert await proxy.cut() == 1
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), BOUND)
    writer.close()


async def test_close_all_sends_fin(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    assert await proxy.close_all() == 1
    assert await asyncio.wait_for(reader.read(), BOUND) == b""
    assert proxy.connection_count == 0
    writer.close()


async def test_client_eof_is_passed_on_and_closes_the_connection(proxy: FaultProxy, echo: EchoServer) -> None:
    reader, writer = await connect(proxy)
    writer.write(b"last words")
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), BOUND) == b"last words"
    await wait_until(lambda: echo.endings == ["eof"] and proxy.connection_count == 0)
    writer.close()


async def test_refuse_resets_new_connections_only(proxy: FaultProxy) -> None:
    old_reader, old_writer = await connect(proxy)
    proxy.refuse(True)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), BOUND)
    writer.close()
    assert await roundtrip(old_reader, old_writer, b"still here") == b"still here"
    proxy.refuse(False)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert await roundtrip(reader, writer, b"welcome back") == b"welcome back"
    writer.close()
    old_writer.close()


async def test_unreachable_target_resets_the_client() -> None:
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]
    async with FaultProxy("127.0.0.1", dead_port, connect_timeout=1.0) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), BOUND)
        writer.close()
        assert proxy.connection_count == 0


async def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.latency(150)
    started = time.monotonic()
    assert await roundtrip(reader, writer, b"slow") == b"slow"
    elapsed = time.monotonic() - started
    assert 0.28 <= elapsed < 2.0  # 150 ms up + 150 ms down
    proxy.latency(0)
    started = time.monotonic()
    await roundtrip(reader, writer, b"fast")
    assert time.monotonic() - started < 0.15
    writer.close()


async def test_latency_keeps_throughput(proxy: FaultProxy) -> None:
    # Ten chunks sent 20 ms apart arrive ~latency later, not ten latencies later.
    reader, writer = await connect(proxy)
    proxy.latency(200, direction="upstream")
    started = time.monotonic()
    for i in range(10):
        writer.write(bytes([i]) * 10)
        await asyncio.sleep(0.02)
    await asyncio.wait_for(reader.readexactly(100), BOUND)
    assert 0.2 <= time.monotonic() - started < 1.0
    writer.close()


async def test_bandwidth_caps_throughput(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.bandwidth(20_000, direction="upstream")
    started = time.monotonic()
    assert await roundtrip(reader, writer, b"b" * 10_000) == b"b" * 10_000
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 3.0  # 10 kB at 20 kB/s
    proxy.pass_()
    started = time.monotonic()
    await roundtrip(reader, writer, b"b" * 100_000)
    assert time.monotonic() - started < 0.5
    writer.close()


async def test_bandwidth_rejects_non_positive_rates(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.bandwidth(0)


async def test_close_resets_connections_and_leaves_no_tasks(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port)
    await proxy.start()
    clients = [await connect(proxy) for _ in range(3)]
    await wait_until(lambda: proxy.connection_count == 3)
    proxy.stall()
    await proxy.close()
    await proxy.close()  # idempotent
    assert proxy.connection_count == 0
    for reader, writer in clients:
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), BOUND)
        writer.close()
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not [t for t in leftover if "FaultProxy" in repr(t.get_coro())]
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)


def test_threaded_proxy_serves_sync_callers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with ThreadedFaultProxy("127.0.0.1", listener.getsockname()[1]) as proxy:
            client = socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND)
            server, _ = listener.accept()
            server.settimeout(BOUND)
            client.sendall(b"one")
            assert server.recv(3) == b"one"
            proxy.stall()
            client.sendall(b"two")
            server.settimeout(0.3)
            with pytest.raises(TimeoutError):
                server.recv(3)
            proxy.pass_()
            server.settimeout(BOUND)
            assert server.recv(3) == b"two"
            assert proxy.connection_count == 1
            assert proxy.cut() == 1
            with pytest.raises(ConnectionResetError):
                client.recv(1)
            client.close()
            server.close()
        proxy.close()  # idempotent after __exit__
