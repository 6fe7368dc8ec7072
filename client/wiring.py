"""The client's composition root: the one module of :mod:`truba.client` that names a transport.

Everything else in the client reaches brokers through :class:`truba.pipes.broker.Broker`;
:class:`~truba.client.client.Client` takes a :data:`~truba.pipes.broker.BrokerFactory` and, when
given none, uses :func:`default_brokers` (RabbitMQ).
"""

from __future__ import annotations

from truba.pipes.broker import BrokerFactory
from truba.pipes.rabbit import rabbit_brokers

__all__ = ["default_brokers"]


def default_brokers(client_name: str, *, heartbeat: float) -> BrokerFactory:
    """Links to RabbitMQ brokers named after the client (shown in each broker's connection list)."""
    return rabbit_brokers(client_name, heartbeat=heartbeat)
