"""A :class:`~truba.local.proxy.FaultProxy` on an event loop of its own, driven by blocking calls.

For sync tests and benchmarks, and for async tests that want the proxy to keep forwarding while their
own loop is blocked. Every method hops onto the proxy's loop and waits for the result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Final, TypeVar, final

from truba.local.proxy import Direction, FaultProxy

T = TypeVar("T")
_CALL_TIMEOUT_S: Final = 30.0


@final
class ThreadedFaultProxy:
    """Same faults as :class:`FaultProxy`, with a blocking API; the proxy runs in a daemon thread."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        connect_timeout: float = 10.0,
    ) -> None:
        self.proxy = FaultProxy(
            target_host, target_port, listen_host, listen_port, connect_timeout=connect_timeout
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port the proxy listens on (after :meth:`start`)."""
        return self.proxy.port

    @property
    def host(self) -> str:
        """The address the proxy listens on."""
        return self.proxy.host

    @property
    def connection_count(self) -> int:
        """Client connections currently proxied."""
        return self.proxy.connection_count

    def start(self) -> None:
        """Starts the loop thread and the proxy; returns once it listens.

        Raises:
            OSError: the listen address is unavailable (the thread is stopped again).
        """
        if self._thread is not None:
            raise RuntimeError("ThreadedFaultProxy already started")
        ready: Future[asyncio.AbstractEventLoop] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"truba-proxy-{self.proxy.target_port}", daemon=True
        )
        self._thread.start()
        self._loop = ready.result(_CALL_TIMEOUT_S)
        try:
            self._call(self.proxy.start)
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, ready: Future[asyncio.AbstractEventLoop]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        ready.set_result(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _call(self, func: Callable[[], Awaitable[T]]) -> T:
        if self._loop is None:
            raise RuntimeError("ThreadedFaultProxy.start() was not called")

        async def run() -> T:
            return await func()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(_CALL_TIMEOUT_S)

    def _call_sync(self, func: Callable[[], None]) -> None:
        async def run() -> None:
            func()

        self._call(run)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(_CALL_TIMEOUT_S)

    def close(self) -> None:
        """Closes the proxy (resetting its connections) and stops the thread. Idempotent."""
        if self._loop is None:
            return
        try:
            self._call(self.proxy.close)
        finally:
            self._stop_loop()

    def pass_(self) -> None:
        """See :meth:`FaultProxy.pass_`."""
        self._call_sync(self.proxy.pass_)

    def stall(self, direction: Direction = "both") -> None:
        """See :meth:`FaultProxy.stall`."""
        self._call_sync(lambda: self.proxy.stall(direction))

    def latency(self, ms: float, jitter_ms: float = 0.0, direction: Direction = "both") -> None:
        """See :meth:`FaultProxy.latency`."""
        self._call_sync(lambda: self.proxy.latency(ms, jitter_ms, direction))

    def bandwidth(self, bytes_per_s: float | None, direction: Direction = "both") -> None:
        """See :meth:`FaultProxy.bandwidth`."""
        self._call_sync(lambda: self.proxy.bandwidth(bytes_per_s, direction))

    def refuse(self, on: bool = True) -> None:
        """See :meth:`FaultProxy.refuse`."""
        self._call_sync(lambda: self.proxy.refuse(on))

    def cut(self) -> int:
        """See :meth:`FaultProxy.cut`."""
        return self._call(self.proxy.cut)

    def close_all(self) -> int:
        """See :meth:`FaultProxy.close_all`."""
        return self._call(self.proxy.close_all)

    def __enter__(self) -> ThreadedFaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
