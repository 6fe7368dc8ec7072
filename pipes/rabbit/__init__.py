"""RabbitMQ leaves: the only package of truba that imports aio-pika / aiormq.

- :class:`RabbitBroker` is the link to one broker: a shared connection, reopened when gone, that
  opens a channel per leaf. :class:`RabbitConnection` is one such connection, and administers
  queues (declare, delete, inspect).
- :class:`RabbitSender` publishes persistent messages with ``mandatory=true`` on a confirm
  channel, keeps every message until its confirm arrives, and bounds every wait.
- :class:`RabbitListener` consumes one queue with a prefetch window; its deliveries are acked or
  rejected on the channel that delivered them.

Every AMQP exception is translated once, by :func:`map_amqp_errors`. A leaf that fails is broken
for good; :mod:`truba.pipes.reopen` opens a fresh one.
"""

from truba.pipes.rabbit.connection import (
    DELIVERY_LIMIT,
    RabbitBroker,
    RabbitConnection,
    queue_arguments,
    rabbit_brokers,
)
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.listener import RabbitDelivery, RabbitListener
from truba.pipes.rabbit.sender import RabbitSender

__all__ = [
    "DELIVERY_LIMIT",
    "RabbitBroker",
    "RabbitConnection",
    "RabbitDelivery",
    "RabbitListener",
    "RabbitSender",
    "map_amqp_errors",
    "queue_arguments",
    "rabbit_brokers",
]
