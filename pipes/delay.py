"""Delayed messages: a broker holds a message until its due time, then puts it in its queue.

No consumer ever holds a delayed message (RabbitMQ's ``consumer_timeout`` would close the
channel of one that did, and a consumer's prefetch would fill with messages not yet due).
Instead every broker has :data:`LEVELS` *delay levels* (NServiceBus's and Celery 5.5's design):
level ``k`` is a queue whose messages all live ``2^k`` ticks of :data:`TICK` seconds (one TTL per
queue, so the queue is FIFO in due order and expiry at its head is in order) and then
dead-letter to the next level down. A message spells its delay in ticks, in binary, in headers
(:func:`bit_headers`: ``truba-d<k>`` is bit ``k``), and its routing key is its target queue::

    truba-d5=1 truba-d4=1 truba-d3=0 truba-d2=0 truba-d1=1 truba-d0=0   (5 s = 50 ticks)

Each level has a headers exchange: exchange ``k`` sends a message whose bit ``k`` is 1 into queue
``k`` (it waits there ``2^k`` ticks), one whose bit is 0 straight on to exchange ``k-1``; below
level 0 the *out* exchange (direct) routes it to its target queue by its routing key, which
dead-lettering keeps. A message is published to the exchange of its highest set bit
(:func:`first_exchange`). So a delay of up to :data:`MAX_DELAY` (32 levels of 0.1 s: 13.6 years)
takes at most one wait per set bit. Ticks of 0.1 s (rather than Celery's whole seconds) keep the
rounding error at ±0.05 s, so tasks due a fraction of a second apart still come out in due order.

Why headers and not Celery's topic routing keys (``0.1.1.….queue``): on RabbitMQ 3.10 a topic
lookup of a 32-word key costs a trie walk per exchange it passes, and a message passes up to 32;
at a few hundred delayed messages a second that became the bottleneck (due messages came out
later and later: 0.6 s late at 5 s under 50 messages/s). A headers exchange with two bindings
and a direct out exchange route in constant time.

A sender of delayed messages is handed each message with its due time in front
(:func:`with_due`): the leaf reads it at publish time (:func:`split_due`), so a message sent
again later (a reconnect, a lost broker) waits only what is left of its delay.

This module spells the topology; :mod:`truba.pipes.rabbit.delays` declares it on RabbitMQ and
:class:`~truba.pipes.testing.FakeBroker` honours it in memory.
"""

from __future__ import annotations

import math
import struct
from typing import Final

LEVELS: Final = 32
"""Delay levels per broker: delays up to 2^32 - 1 ticks (13.6 years), at most 32 hops."""
TICK: Final = 0.1
"""Seconds of the delay levels' unit: level ``k`` holds a message ``2^k`` ticks."""
MAX_DELAY: Final = (2**LEVELS - 1) * TICK
"""The longest delay, in seconds; a longer one is refused (``ValueError``)."""
PREFIX: Final = "truba.delay"
OUT_EXCHANGE: Final = f"{PREFIX}.out"
"""Routes a message whose delay is over to its target queue (a direct exchange: each target
queue is bound by its own name)."""
BIT_HEADER: Final = "truba-d"
"""Header ``truba-d<k>`` is bit ``k`` of a delayed message's delay in ticks ("1" or "0")."""
ORPHANS: Final = f"{PREFIX}.orphans"
"""Where a due message whose target queue is gone ends (the out exchange's alternate exchange
and a queue of that name that keeps them :data:`ORPHAN_TTL_MS`): a cancelled job's delayed tasks."""
ORPHAN_TTL_MS: Final = 24 * 3600 * 1000
_DUE: Final = struct.Struct(">d")


def level_name(level: int) -> str:
    """The name of level ``level``'s exchange and of its queue."""
    return f"{PREFIX}.{level}"


def first_exchange(delay: float) -> str:
    """Where a message to wait ``delay`` seconds is published: the exchange of the highest
    level it waits in (the levels above would only pass it on; each pass is a routing step)."""
    return level_name(max(0, delay_bits(delay).bit_length() - 1))


def level_ttl_ms(level: int) -> int:
    """How long a message stays in level ``level``'s queue, in milliseconds."""
    return int(2**level) * round(TICK * 1000)


def next_hop(level: int) -> str:
    """The exchange level ``level``'s queue dead-letters to."""
    return level_name(level - 1) if level > 0 else OUT_EXCHANGE


def bit_header(level: int) -> str:
    """The header that holds bit ``level`` of a delay."""
    return f"{BIT_HEADER}{level}"


def wait_binding(level: int) -> dict[str, str]:
    """Arguments of level ``level``'s queue binding to its exchange: bit ``level`` is 1."""
    return {"x-match": "all", bit_header(level): "1"}


def pass_binding(level: int) -> dict[str, str]:
    """Arguments of exchange ``level``'s binding to the next one down (:func:`next_hop`): bit
    ``level`` is 0."""
    return {"x-match": "all", bit_header(level): "0"}


def delay_bits(delay: float) -> int:
    """Ticks of ``delay`` seconds, rounded to the nearest (half up), at least 0.

    Raises:
        ValueError: over :data:`MAX_DELAY`.
    """
    if delay > MAX_DELAY:
        raise ValueError(f"delay of {delay} s is over the longest, {MAX_DELAY:.0f} s")
    return max(0, math.floor(delay / TICK + 0.5))


def bit_headers(delay: float) -> dict[str, str]:
    """The headers of a message to wait ``delay`` seconds: a bit for each level up to its
    highest set bit (empty for no delay).

    Raises:
        ValueError: over :data:`MAX_DELAY`.
    """
    ticks = delay_bits(delay)
    return {bit_header(level): str((ticks >> level) & 1) for level in range(ticks.bit_length())}


def with_due(body: bytes, due: float) -> bytes:
    """``body`` to be sent by a delayed sender: due at ``due`` (Unix time)."""
    return _DUE.pack(due) + body


def split_due(message: bytes) -> tuple[float, bytes]:
    """The due time and the body of a message made by :func:`with_due`.

    Raises:
        ValueError: too short to hold a due time.
    """
    if len(message) < _DUE.size:
        raise ValueError(f"a delayed message holds a due time first: {len(message)} bytes")
    (due,) = _DUE.unpack_from(message)
    return due, message[_DUE.size :]
