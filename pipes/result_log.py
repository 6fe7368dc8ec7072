"""The result log of confirmed results and hand-backs: which members of a redelivered delivery need
no second run.

AMQP has no partial ack: a daemon that dies with part of a frame done leaves the whole frame to
be redelivered. So the daemon's result sender copies the result of every frame member into a
stream, the job's *result log* (on the same broker, within the same confirm: see ``copy_to`` of
a :class:`~truba.pipes.broker.Broker`'s sender): a frame member's result is confirmed exactly
when its broker's result log holds it. (A task delivered alone needs no copy: only redelivered
frames are looked up, see below.) A consumer that gets a delivery back redelivered reads the
result log of every broker from about when the delivery was first sent, and settles the members
that already have a result instead of handing them out to run again (see
:class:`~truba.pipes.frame.FrameListener`).

A member can also be done here without a result: a consumer that *handed it back* out of a frame
(published it again as a message of its own, a new copy with a copy id of its own, then settled
it in its frame) records that in the log once the copy is confirmed. Such a record names the
*copy* that was replaced (``copy_key``: the task id and the replaced member's copy id), never the
task alone: the new copy has another id, so it is never skipped by the record of its own making.
A member is skipped only when the log holds its result or a record of its copy, and a record is
written only after the new copy was confirmed: a member never goes unrun (a consumer that dies
between the confirm and the record leaves the member to run twice, the at-least-once case).

Reading costs a scan of the results recorded since then, so it is done for redelivered frames
only (a lone message runs again, as any redelivered AMQP message would), each broker's read
bounded by ``timeout`` seconds. A broker whose result log cannot be read counts as holding nothing:
its members run again, and the client drops the duplicate outcome (at least once, as without a
log). The log keeps an hour at most (RabbitMQ: :data:`~truba.pipes.rabbit.connection.STREAM_MAX_AGE`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Final, final

from truba.pipes.base import Delivery
from truba.pipes.broker import SENT_AT, Broker, redact
from truba.pipes.frame import unpack

log = logging.getLogger(__name__)

SKEW: Final = 30.0
"""Seconds read before a delivery's ``sent-at`` stamp: the sender's clock and the brokers' may
differ (an earlier start only reads more)."""


@final
class ResultLog:
    """Which members of a redelivered delivery have a confirmed result (or a confirmed hand-back)
    in the job's result log.

    ``result_key`` gives the key of one recorded message: a result's (a task id), or a hand-back
    record's (a copy of a task). ``member_key`` gives the key a member's result is recorded
    under, ``copy_key`` (optional) the key a hand-back of the member's copy is recorded
    under; the two kinds of keys must never be equal. Each returns None for a message it cannot
    read (a member that cannot be read is handed out, to be dead-lettered by the layer that
    decodes it).
    """

    def __init__(
        self,
        brokers: Sequence[Broker],
        stream: str,
        *,
        result_key: Callable[[bytes], Hashable | None],
        member_key: Callable[[bytes], Hashable | None],
        copy_key: Callable[[bytes], Hashable | None] | None = None,
        timeout: float = 3.0,
    ) -> None:
        self._brokers = list(brokers)
        self._stream = stream
        self._result_key = result_key
        self._member_key = member_key
        self._copy_key = copy_key
        self._timeout = timeout

    async def __call__(self, delivery: Delivery[bytes], members: Sequence[bytes]) -> Collection[int]:
        """Indexes of ``members`` (the messages of ``delivery``) that have a confirmed result or
        whose copy was handed back (its copy confirmed)."""
        keys: dict[Hashable, int] = {}
        for i, member in enumerate(members):
            for key in self._keys(member):
                keys[key] = i
        if not keys:
            return ()
        since = _sent_at(delivery)
        done = await self.done(keys.keys(), since - SKEW if since is not None else None)
        return sorted({keys[key] for key in done})

    def _keys(self, member: bytes) -> list[Hashable]:
        """The keys the log may hold ``member`` under: its result's, its copy's hand-back's."""
        keys = [self._member_key(member)]
        if self._copy_key is not None:
            keys.append(self._copy_key(member))
        return [key for key in keys if key is not None]

    async def done(self, keys: Collection[Hashable], since: float | None) -> set[Hashable]:
        """The ``keys`` recorded on any broker since ``since`` (Unix time; None: as far back as
        the log goes)."""
        wanted, found = set(keys), set[Hashable]()

        def each(body: bytes) -> None:
            for message in unpack(body) or [body]:
                key = self._result_key(message)
                if key in wanted:
                    found.add(key)

        reads = await asyncio.gather(
            *(self._read(broker, since, each) for broker in self._brokers), return_exceptions=True
        )
        for broker, read in zip(self._brokers, reads, strict=True):
            if isinstance(read, Exception):
                log.warning(
                    "pipe.result_log.unread",
                    extra={"stream": self._stream, "broker": redact(broker.url), "error": repr(read)},
                )
            elif isinstance(read, BaseException):
                raise read
        log.info(
            "pipe.result_log.read",
            extra={
                "stream": self._stream,
                "wanted": len(wanted),
                "done": len(found),
                "scanned": sum(read for read in reads if isinstance(read, int)),
            },
        )
        return found

    async def _read(self, broker: Broker, since: float | None, each: Callable[[bytes], None]) -> int:
        """Reads one broker's result log, connecting included, within ``timeout`` seconds: a broker
        that is down must not hold up the redelivered frame for a whole connect timeout."""
        return await broker.read_log(self._stream, since, each, timeout=self._timeout)


def _sent_at(delivery: Delivery[bytes]) -> float | None:
    stamp = delivery.headers.get(SENT_AT)
    return float(stamp) if isinstance(stamp, int | float) else None
