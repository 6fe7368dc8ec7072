"""truba.pipes: a combinator library of transport layers over RabbitMQ.

Two interfaces (:class:`Sender`, :class:`Listener`), and building blocks of three kinds:

- layers wrap one pipe and add one concern: :func:`serialize`, :func:`deserialize`;
- combinators make one pipe of many: :func:`balance` (send), :func:`merge` (listen);
- leaves talk to a broker: :mod:`truba.pipes.rabbit`.

In-memory fakes for tests ship in :mod:`truba.pipes.testing`.
"""

from truba.pipes.balance import BalanceSender, balance
from truba.pipes.base import Codec, Confirmation, Delivery, Layer, Listener, ListenerLayer, Sender
from truba.pipes.errors import (
    ChannelLost,
    CodecError,
    ConnectionLost,
    MessageRejected,
    MessageTooLarge,
    PipeBroken,
    PipeClosed,
    PipeError,
    SendTimeout,
)
from truba.pipes.frame import FrameSender
from truba.pipes.frame_listener import FrameListener
from truba.pipes.merge import MergeListener, merge
from truba.pipes.serialize import DeserializeListener, SerializeSender, deserialize, serialize

__all__ = [
    "BalanceSender",
    "ChannelLost",
    "Codec",
    "CodecError",
    "Confirmation",
    "ConnectionLost",
    "Delivery",
    "DeserializeListener",
    "FrameListener",
    "FrameSender",
    "Layer",
    "Listener",
    "ListenerLayer",
    "MergeListener",
    "MessageRejected",
    "MessageTooLarge",
    "PipeBroken",
    "PipeClosed",
    "PipeError",
    "Sender",
    "SendTimeout",
    "SerializeSender",
    "balance",
    "deserialize",
    "merge",
    "serialize",
]
