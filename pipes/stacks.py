"""The named stacks of truba, built from layers over RabbitMQ brokers.

Sending (the client's tasks; the daemon's results, requeues and dead letters)::

    serialize → [spool] → retry → log → balance[[frame] → reopen → rabbit, ...]

Listening (daemon tasks; client results)::

    deserialize → unframe → retry → log → merge[reopen → rabbit(prefetch), ...]

``frame`` (:mod:`truba.pipes.frame`) packs small messages into one AMQP message under load;
``unframe`` is always there, since a queue holds frames whenever any of its producers frames.

The builders return a handle (:class:`SendStack`, :class:`ListenStack`): the pipe, and the controls
its owner steers it by (frame holds, the unframe layer's members at hand, the prefetch window,
each broker leaf's readiness and break notices), wired explicitly, never looked up in the stack.

Choices on purpose: ``reopen`` sits under ``balance``/``merge``, one
per broker, so a broken broker is reopened alone while the others carry on, and ``balance``
moves a broken broker's unconfirmed messages to the others at once instead of waiting for its
reopen. ``prefetch`` is a :class:`~truba.pipes.prefetch.Window` applied by every rabbit leaf.
Over a single broker, ``balance`` and ``merge`` of one are left out: they would only add work.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from truba.backoff import Backoff
from truba.pipes.balance import BalanceSender
from truba.pipes.base import Codec, Layer, Listener, Sender
from truba.pipes.broker import Broker, PrefetchListener, QueueSpec
from truba.pipes.frame import FrameSender
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.frame_listener import DoneCheck, FrameListener
from truba.pipes.log import log_errors, log_listener
from truba.pipes.merge import MergeListener
from truba.pipes.pipeline import ListenerPipeline, Pipeline
from truba.pipes.prefetch import Window
from truba.pipes.reopen import ReopenSender
from truba.pipes.reopen_listener import ReopenListener
from truba.pipes.retry import retry, retry_listener
from truba.pipes.serialize import deserialize, serialize

T = TypeVar("T")

UNTIL_SUCCESS = Backoff(attempts=None, base=0.05, cap=5.0)
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
"""16 MiB: well under RabbitMQ's max_message_size (128 MiB by default), and big messages stall
every other message on the same connection; pass large data by reference."""


@dataclass(frozen=True)
class SendOptions:
    """Knobs of a sending stack. ``max_unconfirmed`` caps each broker's unconfirmed messages;
    ``max_message_size`` (bytes, encoded) is refused before sending."""

    confirm_timeout: float = 30.0
    priority: int | None = None
    """AMQP priority of every message sent (a stack per level: see RouteSender)."""
    max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE
    max_unconfirmed: int = 1000
    connect_timeout: float = 10.0
    retry: Backoff = field(default=UNTIL_SUCCESS)
    copy_to: str | QueueSpec | None = None
    """A second queue each broker also puts every message in, in the same confirm (the daemon's
    results go to the job's record too: see truba.pipes.result_log)."""
    delayed: bool = False
    """Each message is a due time and a body (:func:`truba.pipes.delay.with_due`): the brokers hold
    it until then (:mod:`truba.pipes.delay`). Such a stack has no frames: a frame's members would
    share one due time."""


@dataclass(frozen=True)
class SendStack(Generic[T]):
    """A built sending stack and the controls its owner steers it by."""

    sender: Sender[T]
    frames: FrameLimits | None
    """The limits its frame layers share: :meth:`~FrameLimits.hold` keeps messages from going
    out alone while more follow at once, :meth:`~FrameLimits.release` lets them. None: no frames."""
    links: tuple[ReopenSender[bytes], ...]
    """Each broker's leaf, in the brokers' order: ``ready`` and ``on_break`` (``balance`` hears
    them through the same objects)."""

    def connect_ahead(self) -> None:
        """Starts each broker's first connect now rather than at the first send (see
        :meth:`~truba.pipes.reopen.ReopenSender.connect_ahead`)."""
        for link in self.links:
            link.connect_ahead()


@dataclass(frozen=True)
class ListenStack(Generic[T]):
    """A built listening stack and the controls its owner steers it by."""

    listener: Listener[T]
    window: Window
    """The prefetch window over every broker's leaf (resize it as slots come and go)."""
    frames: FrameListener
    """The unframe layer: ``held`` says how many members of frames are at hand, so an owner can
    take more at once (or not ack yet) while they are."""


def _sender_connector(
    broker: Broker, queue: str | QueueSpec, options: SendOptions
) -> Callable[[], Awaitable[Sender[bytes]]]:
    async def connect() -> Sender[bytes]:
        return await broker.sender(
            queue,
            confirm_timeout=options.confirm_timeout,
            max_unconfirmed=options.max_unconfirmed,
            priority=options.priority,
            copy_to=options.copy_to,
            delayed=options.delayed,
        )

    return connect


def _listener_connector(
    broker: Broker, queue: str | QueueSpec, window: Window
) -> Callable[[], Awaitable[PrefetchListener[bytes]]]:
    async def connect() -> PrefetchListener[bytes]:
        leaf = await broker.listener(queue, prefetch=window.leaf_size)
        window.watch(leaf.set_prefetch)
        return leaf

    return connect


def send_stack(
    codec: Codec[T],
    brokers: Sequence[Broker],
    queue: str | QueueSpec,
    *,
    role: str = "send",
    spool: Layer[bytes, bytes] | None = None,
    options: SendOptions | None = None,
    frames: FrameLimits | None = None,
    log_confirms: bool = True,
    share_confirmations: bool = False,
) -> SendStack[T]:
    """``serialize → [spool] → retry → log → balance[[frame] → reopen → rabbit, ...]`` to ``queue``.

    No stack of truba's apps has a spool today (the client's journal keeps its tasks); the layer
    is there for senders that need one. Given a :class:`QueueSpec`, every (re)connect declares the
    queue first. With ``frames``, each broker's leaf packs messages into frames under load, within
    those (shared) limits. ``log_confirms=False``: the owner logs failed confirmations itself
    (it watches each one), so the log layer adds no callback per message.
    ``share_confirmations``: the members of a frame get one confirmation object (see
    :attr:`FrameSender.share_confirmations`; for an owner that never cancels one).
    """
    opts = options or SendOptions()
    if opts.delayed and frames is not None:
        raise ValueError("a stack of delayed messages has no frames: its members would share one due time")
    name = _name(queue)
    links: list[ReopenSender[bytes]] = []
    leaves: list[Sender[bytes]] = []
    for broker in brokers:
        link: ReopenSender[bytes] = ReopenSender(
            _sender_connector(broker, queue, opts),
            label=f"{name}@{broker.name}",
            connect_timeout=opts.connect_timeout,
        )
        links.append(link)
        leaves.append(
            link
            if frames is None
            else FrameSender(
                link, frames, max_unconfirmed=opts.max_unconfirmed, share_confirmations=share_confirmations
            )
        )
    start: Pipeline[T, T] = Pipeline(lambda sender: sender)
    encoded = start.layer(serialize(codec, opts.max_message_size))
    spooled = encoded.layer(spool) if spool is not None else encoded
    retried: Pipeline[T, bytes] = spooled.layer(retry(opts.retry))
    logged: Pipeline[T, bytes] = retried.layer(log_errors(role, confirms=log_confirms))
    # Over one broker there is nothing to balance: the leaf's own window caps its load.
    base = leaves[0] if len(leaves) == 1 else BalanceSender(leaves, opts.max_unconfirmed, health=links)
    return SendStack(logged.build(base), frames, tuple(links))


def listen_stack(
    codec: Codec[T],
    brokers: Sequence[Broker],
    queue: str | QueueSpec,
    window: Window,
    *,
    role: str = "listen",
    connect_timeout: float = 10.0,
    dead_letter_queue: str | QueueSpec | None = None,
    done: DoneCheck | None = None,
    member_key: Callable[[bytes], str | None] | None = None,
) -> ListenStack[T]:
    """``deserialize → unframe → retry → log → merge[reopen → rabbit(prefetch window), ...]`` on ``queue``.

    The daemon's task listener and the client's result listener are this stack. With
    ``dead_letter_queue``, a message that cannot be decoded is published there with its error.
    Given a :class:`QueueSpec`, every (re)connect declares the queue (else it must exist).
    The window's total is spread over the brokers' leaves when it is split (see :class:`Window`).
    With ``done``, a redelivered message's members that have a confirmed result are acked, not
    handed out (see :class:`FrameListener`). With ``member_key`` (a task id), a frame with two
    members of the same key is malformed: dead-lettered whole, as a frame that does not unpack.
    """
    window.leaves = len(brokers)
    leaves: list[Listener[bytes]] = [
        ReopenListener(
            _listener_connector(broker, queue, window),
            label=f"{_name(queue)}@{broker.name}",
            connect_timeout=connect_timeout,
        )
        for broker in brokers
    ]
    dead_letters = None
    if dead_letter_queue is not None:  # poison goes there with its error, through any broker
        dead_letters = _bytes_sender(brokers, dead_letter_queue, SendOptions(), connect_timeout)
    start: ListenerPipeline[T, T] = ListenerPipeline(lambda listener: listener)
    decoded = start.layer(deserialize(codec, dead_letters))
    unframe: list[FrameListener] = []

    def unframe_layer(inner: Listener[bytes]) -> Listener[bytes]:
        unframe.append(FrameListener(inner, done=done, member_key=member_key, dead_letters=dead_letters))
        return unframe[0]

    unframed: ListenerPipeline[T, bytes] = decoded.layer(unframe_layer)
    retried: ListenerPipeline[T, bytes] = unframed.layer(retry_listener(UNTIL_SUCCESS))
    logged: ListenerPipeline[T, bytes] = retried.layer(log_listener(role))
    listener = logged.build(leaves[0] if len(leaves) == 1 else MergeListener(leaves))
    return ListenStack(listener, window, unframe[0])


def _name(queue: str | QueueSpec) -> str:
    return queue.name if isinstance(queue, QueueSpec) else queue


def _bytes_sender(
    brokers: Sequence[Broker], queue: str | QueueSpec, options: SendOptions, connect_timeout: float
) -> Sender[bytes]:
    leaves: list[ReopenSender[bytes]] = [
        ReopenSender(
            _sender_connector(broker, queue, options),
            label=f"{_name(queue)}@{broker.name}",
            connect_timeout=connect_timeout,
        )
        for broker in brokers
    ]
    if len(leaves) == 1:
        return leaves[0]
    return BalanceSender(list[Sender[bytes]](leaves), options.max_unconfirmed, health=leaves)
