"""A daemon's HTTP face: ``GET /metrics`` (Prometheus text format) and ``GET /healthz``.

``truba daemon --metrics HOST:PORT`` serves it (off by default; loopback when only a port is
given), with :class:`truba.http_server.HttpServer` as the scheduler does. Read-only and without
a token: it tells what runs here and how fast, nothing more, so keep it on loopback or a
network only Prometheus reaches.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from truba.daemon.metrics import DaemonMetrics
from truba.http_server import HttpServer, parse_listen

LOOPBACK: Final = "127.0.0.1"


def metrics_app(metrics: DaemonMetrics) -> web.Application:
    """The application serving ``metrics``."""
    app = web.Application()

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", health)
    return app


def metrics_listen(listen: str) -> str:
    """``HOST:PORT`` to serve on: ``PORT`` alone means loopback.

    Raises:
        ValueError: it is neither ``HOST:PORT`` nor ``PORT``.
    """
    host, port = parse_listen(listen, default_host=LOOPBACK)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def metrics_server(metrics: DaemonMetrics, listen: str) -> HttpServer:
    """A server of ``metrics`` on ``listen`` (see :func:`metrics_listen`), not started yet."""
    return HttpServer(metrics_app(metrics), metrics_listen(listen), started="daemon.metrics.started")
