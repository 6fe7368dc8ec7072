"""The daemon's composition root: the one module of :mod:`truba.daemon` that names a transport.

Everything else in the daemon reaches brokers through :class:`truba.pipes.broker.Broker`;
:class:`~truba.daemon.daemon.Daemon` takes a :data:`~truba.pipes.broker.BrokerFactory` and, when
given none, uses :func:`default_brokers` (RabbitMQ).
"""

from __future__ import annotations

from collections.abc import Callable

from truba.pipes.broker import BrokerFactory
from truba.pipes.rabbit import rabbit_brokers

__all__ = ["default_brokers"]


def default_brokers(
    daemon_id: str, *, heartbeat: float, on_connect: Callable[[str], None] | None = None
) -> BrokerFactory:
    """Links to RabbitMQ brokers named after the daemon (shown in each broker's connection list);
    ``on_connect(url)`` hears of each connection opened (the daemon's metrics count them)."""
    return rabbit_brokers(f"truba-daemon-{daemon_id}", heartbeat=heartbeat, on_connect=on_connect)
