"""Serving an aiohttp application on ``HOST:PORT``: the scheduler's HTTP face and a daemon's
``/metrics`` share it.

:class:`HttpServer` binds (port 0 picks a free one), says where it serves in one log event, and
stops on :meth:`HttpServer.close`. It never touches signals (the binaries own them) and logs no
request (``access_log=None``): a scrape every few seconds is not news.
"""

from __future__ import annotations

import logging
from typing import final

from aiohttp import web

log = logging.getLogger(__name__)


def parse_listen(listen: str, *, default_host: str = "") -> tuple[str, int]:
    """``HOST:PORT`` (or only ``PORT`` when ``default_host`` is given) as ``(host, port)``.

    Raises:
        ValueError: it does not look like that.
    """
    if default_host and listen.isdigit():
        return default_host, int(listen)
    host, colon, port = listen.rpartition(":")
    if not (host and colon and port.isdigit()):
        expected = "HOST:PORT or PORT" if default_host else "HOST:PORT"
        raise ValueError(f"http: must look like {expected}, got {listen!r}")
    return host.strip("[]"), int(port)


@final
class HttpServer:
    """Serves ``app`` on ``HOST:PORT`` (port 0 picks a free one) until closed.

    ``started`` is the event logged once it serves (with the field ``listen``).

    Raises:
        ValueError: ``listen`` is not ``HOST:PORT``.
    """

    def __init__(self, app: web.Application, listen: str, *, started: str = "http.started") -> None:
        self._host, self._port = parse_listen(listen)
        self._app = app
        self._started = started
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        """Binds and serves; raises ``RuntimeError`` naming the address when it cannot bind."""
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, reuse_port=False)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise RuntimeError(
                f"cannot serve http on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        sockets = [s for s in runner.addresses if isinstance(s, tuple)]
        self.port = int(sockets[0][1]) if sockets else self._port
        log.info(self._started, extra={"listen": self.address})

    @property
    def address(self) -> str:
        """``HOST:PORT`` being served."""
        return f"{self._host}:{self.port}"

    async def close(self) -> None:
        """Stops serving. Idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
