"""Counting a daemon's publisher confirms per broker: a :class:`~truba.pipes.broker.Broker` wrapper.

:func:`metered` wraps the daemon's :data:`~truba.pipes.broker.BrokerFactory`: every sending leaf
a broker hands out is wrapped in :class:`MeteredSender`, which counts each message's confirm
(ok or failed) in the broker's :class:`~truba.daemon.metrics.BrokerTally`. It sits below the
reopen layer, so a leaf's confirm that failed with its connection is counted failed, and its
re-send on the next leaf is counted again. Listeners and everything else pass through.

Connections opened (reconnects) are counted by the broker implementation's own hook
(:func:`truba.daemon.wiring.default_brokers`), not here: a wrapper cannot see them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import final

from truba.daemon.metrics import BrokerTally, DaemonMetrics
from truba.pipes.base import Confirmation, Sender
from truba.pipes.broker import Broker, BrokerFactory, PrefetchListener, QueueSpec


def metered(factory: BrokerFactory, metrics: DaemonMetrics) -> BrokerFactory:
    """``factory``, its brokers' sending leaves counting confirms into ``metrics``."""

    def open_link(url: str) -> Broker:
        return MeteredBroker(factory(url), metrics.broker(url))

    return open_link


@dataclass
class MeteredSender:
    """A sending leaf that counts its messages' confirms. Nothing else."""

    inner: Sender[bytes]
    tally: BrokerTally

    async def send(self, message: bytes) -> Confirmation:
        confirmation = await self.inner.send(message)
        confirmation.add_done_callback(self._settled)
        return confirmation

    def _settled(self, confirmation: Confirmation) -> None:
        if not confirmation.cancelled() and confirmation.exception() is None:
            self.tally.confirmed += 1
        else:
            self.tally.unconfirmed += 1

    def unconfirmed(self) -> Sequence[bytes]:
        return self.inner.unconfirmed()

    def drop_unconfirmed(self) -> None:
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        await self.inner.close()


@final
class MeteredBroker:
    """A broker whose sending leaves count confirms (see the module docstring)."""

    def __init__(self, inner: Broker, tally: BrokerTally) -> None:
        self.inner = inner
        self.tally = tally

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def name(self) -> str:
        return self.inner.name

    def __repr__(self) -> str:
        return f"MeteredBroker({self.inner!r})"

    async def sender(
        self,
        queue: str | QueueSpec,
        *,
        confirm_timeout: float = 30.0,
        max_unconfirmed: int = 1000,
        priority: int | None = None,
        copy_to: str | QueueSpec | None = None,
        delayed: bool = False,
    ) -> Sender[bytes]:
        leaf = await self.inner.sender(
            queue,
            confirm_timeout=confirm_timeout,
            max_unconfirmed=max_unconfirmed,
            priority=priority,
            copy_to=copy_to,
            delayed=delayed,
        )
        return MeteredSender(leaf, self.tally)

    async def listener(self, queue: str | QueueSpec, *, prefetch: int) -> PrefetchListener[bytes]:
        return await self.inner.listener(queue, prefetch=prefetch)

    async def read_log(
        self, queue: str, since: float | None, each: Callable[[bytes], None], *, timeout: float
    ) -> int:
        return await self.inner.read_log(queue, since, each, timeout=timeout)

    async def has_queue(self, name: str) -> bool:
        return await self.inner.has_queue(name)

    async def declare(self, spec: QueueSpec) -> None:
        await self.inner.declare(spec)

    async def close(self) -> None:
        await self.inner.close()
