"""The seam between truba and a message broker: :class:`Broker`, and the queues it holds.

Everything above the pipes' leaves (the named stacks, the client, the daemon, the scheduler)
reaches a broker through this protocol and never through AMQP: :class:`~truba.pipes.rabbit.RabbitBroker`
implements it over RabbitMQ, :class:`~truba.pipes.testing.FakeBroker` in memory for unit tests
(scriptable: drop a queue, lose its data, refuse, stall, break a connection). An application picks
the implementation in one place, its composition root (``<app>/wiring.py``).

A broker hands out *leaves*: a :class:`~truba.pipes.base.Sender` of bytes to a queue, or a
:class:`PrefetchListener` of bytes on a queue. A leaf that fails stays broken; the reopen layers
(:mod:`truba.pipes.reopen`) ask the broker for a fresh one. Every call is bounded in time, and
every failure is a :class:`~truba.pipes.errors.PipeError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from truba.pipes.base import Listener, Sender

T_co = TypeVar("T_co", covariant=True)

SENT_AT: Final = "truba-sent-at"
"""Header every message a broker's sender publishes carries: its send time (whole seconds, the
sending host's clock). The done-record (:mod:`truba.pipes.result_log`) reads results from there on."""

QUEUE_KINDS: Final = ("quorum", "classic", "stream")


@dataclass(frozen=True)
class QueueSpec:
    """A durable queue and how it dead-letters.

    ``kind`` is ``"quorum"`` (the default: replicated, fsync before confirm, a delivery count),
    ``"classic"``, or ``"stream"`` (an append-only log read from a point in time, kept for a
    bounded age and size: the *log* of :meth:`Broker.read_log`). ``dead_letter_to`` names the
    queue rejected messages go to. ``max_priority`` makes a priority queue (classic queues only
    on RabbitMQ 3.x). ``delays``: the queue takes delayed messages (:mod:`truba.pipes.delay`):
    declaring it also declares the broker's delay levels (once per connection) and binds it to them.
    """

    name: str
    kind: str = "quorum"
    dead_letter_to: str | None = None
    max_priority: int | None = None
    delays: bool = False

    def __post_init__(self) -> None:
        if self.kind not in QUEUE_KINDS:
            raise ValueError(f"queue {self.name}: kind must be one of {QUEUE_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class QueuedMessage:
    """A message looked at in a queue without consuming it: its body and AMQP headers.

    ``taken``: it was removed from the queue (the browse was asked to take it).
    """

    body: bytes
    headers: dict[str, object]
    taken: bool = False


@dataclass(frozen=True)
class Browsed:
    """What a bounded look into a queue saw: the first messages, and how many the queue held."""

    messages: tuple[QueuedMessage, ...]
    total: int
    """Messages ready in the queue when the look began (more than ``messages`` when bounded)."""


QueueRef = str | QueueSpec
"""A queue by name (it must exist) or by spec (declared first, again after every reconnect)."""


class PrefetchListener(Listener[T_co], Protocol[T_co]):
    """A listening leaf whose prefetch window can be changed while it consumes."""

    async def set_prefetch(self, count: int) -> None:
        """At most ``count`` unsettled deliveries from now on (``count`` >= 1)."""
        ...


class Broker(Protocol):
    """One broker: opens leaves on its queues, reads a job's result log, closes.

    Leaves of many pipes share the broker's connection; when it dies every leaf on it breaks,
    and the next leaf asked for opens a new one.
    """

    @property
    def url(self) -> str:
        """Where the broker is; the key a client or daemon knows it by. May hold credentials:
        log :func:`redact` of it."""
        ...

    @property
    def name(self) -> str:
        """How this process introduces itself to the broker (shown in its connection list)."""
        ...

    async def sender(
        self,
        queue: QueueRef,
        *,
        confirm_timeout: float = 30.0,
        max_unconfirmed: int = 1000,
        priority: int | None = None,
        copy_to: QueueRef | None = None,
        delayed: bool = False,
    ) -> Sender[bytes]:
        """A fresh sending leaf publishing persistent messages to ``queue``.

        Each message is confirmed once the broker has it (and its copy in ``copy_to``, when
        given: an extra, so a copy queue that cannot be declared is skipped with a warning).
        Sends wait while ``max_unconfirmed`` messages await their confirm; a confirm not in
        within ``confirm_timeout`` fails it (the message stays in ``unconfirmed()``).
        ``priority`` is the priority every message carries. ``delayed``: every message is a
        due time and a body (:func:`truba.pipes.delay.with_due`); the broker holds the body
        until then, no consumer holding it, and then puts it in ``queue`` (a spec with
        ``delays=True``, or a queue bound to the delay levels); the confirm says the broker has it.

        Raises:
            ConnectionLost, SendTimeout: the broker cannot be reached (now).
            ChannelLost: the queue cannot be declared (exists with other arguments, or refused).
        """
        ...

    async def listener(self, queue: QueueRef, *, prefetch: int) -> PrefetchListener[bytes]:
        """A fresh listening leaf on ``queue``, with at most ``prefetch`` unsettled deliveries.

        Raises:
            ConnectionLost, SendTimeout: the broker cannot be reached (now).
            ChannelLost: the queue does not exist (given by name) or cannot be declared.
        """
        ...

    async def read_log(
        self, queue: str, since: float | None, each: Callable[[bytes], None], *, timeout: float
    ) -> int:
        """Calls ``each`` with every message appended to the log ``queue`` (a ``"stream"``) since
        ``since`` (Unix time; None: as far back as it is kept) and before the read began.

        Returns how many messages were read.

        Raises:
            ChannelLost: there is no such log.
            SendTimeout: the read did not end within ``timeout`` seconds.
        """
        ...

    async def has_queue(self, name: str) -> bool:
        """Whether queue ``name`` exists on the broker now."""
        ...

    async def declare(self, spec: QueueSpec) -> None:
        """Makes sure the queue exists (idempotent for an equal spec)."""
        ...

    async def close(self) -> None:
        """Closes the connection and every leaf on it; idempotent."""
        ...


BrokerFactory = Callable[[str], Broker]
"""Opens the link to the broker at a URL (lazily: the first leaf connects). An application's
composition root picks one; :func:`truba.pipes.rabbit.rabbit_brokers` is RabbitMQ's."""


def redact(url: str) -> str:
    """``url`` without its password, for logs: ``amqp://user:secret@host`` → ``amqp://user@host``."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
