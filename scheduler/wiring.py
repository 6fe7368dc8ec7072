"""The scheduler's composition root: the one module of :mod:`truba.scheduler` that names a
transport. :class:`~truba.scheduler.brokers.Brokers` administers queues through the
:class:`~truba.scheduler.brokers.AdminConnection` that :func:`open_admin` opens (RabbitMQ), and
the schedules' runs travel over the links of :func:`pipe_brokers`."""

from __future__ import annotations

from truba.pipes.broker import BrokerFactory
from truba.pipes.rabbit import RabbitConnection, rabbit_brokers
from truba.scheduler.brokers import AdminConnection

__all__ = ["open_admin", "pipe_brokers"]


async def open_admin(url: str, *, name: str, heartbeat: float, timeout: float) -> AdminConnection:
    """An admin connection to the RabbitMQ broker at ``url`` (the first connect error is raised)."""
    return await RabbitConnection.open(url, name=name, heartbeat=heartbeat, timeout=timeout)


def pipe_brokers(name: str, *, heartbeat: float, timeout: float) -> BrokerFactory:
    """Links to RabbitMQ brokers for the schedules' pipes, introduced as ``name``."""
    return rabbit_brokers(name, heartbeat=heartbeat, connect_timeout=timeout)
