"""Translation of aio-pika/aiormq exceptions into the pipe error hierarchy: the only place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import aiormq.exceptions as amqp

from truba.pipes.errors import ChannelLost, ConnectionLost, MessageRejected, PipeError, SendTimeout


@contextlib.contextmanager
def map_amqp_errors(what: str) -> Iterator[None]:
    """Translates aio-pika/aiormq exceptions into the pipe error hierarchy, chaining the cause."""
    try:
        yield
    except PipeError:
        raise
    except amqp.PublishError as exc:
        raise MessageRejected(f"{what}: returned as unroutable: {exc}", unroutable=True) from exc
    except amqp.DeliveryError as exc:
        raise MessageRejected(f"{what}: nacked by the broker: {exc}") from exc
    except amqp.ChannelInvalidStateError as exc:
        raise ChannelLost(f"{what}: channel is closed: {exc}") from exc
    except amqp.AMQPChannelError as exc:
        raise ChannelLost(f"{what}: channel closed by the broker: {exc!r}") from exc
    except TimeoutError as exc:  # before OSError, of which it is a subclass
        raise SendTimeout(f"{what}: timed out") from exc
    except (amqp.AMQPConnectionError, ConnectionError, OSError) as exc:
        raise ConnectionLost(f"{what}: connection lost: {exc!r}") from exc
    except amqp.AMQPError as exc:
        raise ConnectionLost(f"{what}: AMQP error: {exc!r}") from exc
