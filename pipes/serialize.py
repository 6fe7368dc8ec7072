"""Layer: (de)serialization. Messages become bytes on the way out and back on the way in.

A message that cannot be encoded raises :class:`CodecError` to the sender (it can never be sent).
A delivery that cannot be decoded is poison: it is never retried. With a ``dead_letters`` sender
it is published there as a record carrying its error (see :func:`poison_record`) and then acked;
without one it is rejected without requeue, so the broker dead-letters it. Either way the error
is logged with the message's size and first bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

import msgpack

from truba.pipes.base import Codec, Confirmation, Delivery, Layer, Listener, ListenerLayer, Sender
from truba.pipes.batch import ack_each, ack_many, send_many
from truba.pipes.errors import CodecError, MessageTooLarge, PipeError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class SerializeSender(Generic[T]):
    """Encodes each message with ``codec`` before handing it to a ``Sender[bytes]``.

    ``unconfirmed()`` answers in ``T`` by decoding the inner sender's bytes (codecs are reversible).
    An encoded message longer than ``max_size`` bytes is refused with MessageTooLarge before
    anything is sent (brokers refuse large messages by closing the channel, which would break
    the pipe for every other message on it).
    """

    inner: Sender[bytes]
    codec: Codec[T]
    max_size: int | None = None

    async def send(self, message: T) -> Confirmation:
        data = self.codec.encode(message)
        if self.max_size is not None and len(data) > self.max_size:
            raise MessageTooLarge(
                f"message of {len(data):,} bytes encoded is over the limit of {self.max_size:,} bytes"
            )
        return await self.inner.send(data)

    async def send_many(self, messages: Sequence[T]) -> list[Confirmation]:
        """Encodes a batch and sends it in one call (see :mod:`truba.pipes.batch`): a message
        that cannot be encoded, or is too large, ends the batch before it (raised if first)."""
        encode, max_size = self.codec.encode, self.max_size
        encoded: list[bytes] = []
        for message in messages:
            try:
                data = encode(message)
            except CodecError:
                if encoded:
                    break
                raise
            if max_size is not None and len(data) > max_size:
                if encoded:
                    break
                raise MessageTooLarge(
                    f"message of {len(data):,} bytes encoded is over the limit of {max_size:,} bytes"
                )
            encoded.append(data)
        return await send_many(self.inner, encoded)

    def unconfirmed(self) -> Sequence[T]:
        return [self.codec.decode(data) for data in self.inner.unconfirmed()]

    def drop_unconfirmed(self) -> None:
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        await self.inner.close()


def serialize(codec: Codec[T], max_size: int | None = None) -> Layer[bytes, T]:
    """The serialize layer: ``Sender[bytes] -> Sender[T]``, refusing messages over ``max_size`` bytes."""
    return lambda inner: SerializeSender(inner, codec, max_size)


@dataclass
class DecodedDelivery(Generic[T]):
    """A delivery whose bytes were decoded; settling it settles the inner delivery."""

    inner: Delivery[bytes]
    message: T

    @property
    def redelivered(self) -> bool:
        return self.inner.redelivered

    @property
    def framed(self) -> bool:
        return self.inner.framed

    @property
    def headers(self) -> Mapping[str, object]:
        return self.inner.headers

    async def ack(self) -> None:
        await self.inner.ack()

    async def reject(self, requeue: bool) -> None:
        await self.inner.reject(requeue)


@runtime_checkable
class HoldsMembers(Protocol):
    """An inner listener that holds deliveries at hand (the unframe layer: a frame's members)."""

    def take_held(self, most: int | None = None) -> list[Delivery[bytes]]: ...

    def give_back(self, deliveries: Sequence[Delivery[bytes]]) -> None: ...


@dataclass
class DeserializeListener(Generic[T]):
    """Decodes deliveries of a ``Listener[bytes]``; poison deliveries go to the dead-letter path."""

    inner: Listener[bytes]
    codec: Codec[T]
    dead_letters: Sender[bytes] | None = None
    monotonic: Callable[[], float] = time.monotonic
    _holds: HoldsMembers | None = field(init=False, default=None, repr=False)
    """The inner listener, when it holds members at hand (:meth:`get_batch` takes them)."""

    def __post_init__(self) -> None:
        if isinstance(self.inner, HoldsMembers):  # once: a protocol check is not cheap
            self._holds = self.inner

    async def get(self, timeout: float) -> Delivery[T] | None:
        deadline = self.monotonic() + timeout
        while True:
            delivery = await self.inner.get(max(0.0, deadline - self.monotonic()))
            if delivery is None:
                return None
            decoded = await self._decode(delivery)
            if decoded is not None:
                return decoded
            if self.monotonic() >= deadline:
                return None

    async def get_batch(self, timeout: float) -> list[Delivery[T]]:
        """The next delivery (waiting up to ``timeout`` seconds, as :meth:`get`; [] on timeout),
        with every one the inner listener holds at hand after it (:meth:`take_at_hand`)."""
        first = await self.get(timeout)
        if first is None:
            return []
        batch: list[Delivery[T]] = [first]
        batch += self.take_at_hand()
        return batch

    def take_at_hand(self, most: int | None = None) -> list[Delivery[T]]:
        """Deliveries the inner listener holds at hand (every one, or the ``most`` oldest),
        decoded, without a wait: the rest of a frame
        (:meth:`~truba.pipes.frame_listener.FrameListener.take_held`) costs no ``get`` per
        member. [] when none is at hand or the inner listener holds none. A member that cannot
        be decoded ends the batch: it goes back in front with those after it, and the next
        :meth:`get` dead-letters it as it does any poison (not here: dead-lettering waits, and a
        wait would make this a coroutine, whose cancellation could lose what it decoded)."""
        holds = self._holds
        if holds is None:
            return []
        held = holds.take_held(most)
        taken: list[Delivery[T]] = []
        decode = self.codec.decode
        for index, delivery in enumerate(held):
            try:
                taken.append(DecodedDelivery(delivery, decode(delivery.message)))
            except CodecError:
                holds.give_back(held[index:])
                break
        return taken

    async def _decode(self, delivery: Delivery[bytes]) -> DecodedDelivery[T] | None:
        try:
            return DecodedDelivery(delivery, self.codec.decode(delivery.message))
        except CodecError as exc:
            data = delivery.message
            log.error(
                "pipe.poison",
                extra={"error": str(exc), "size": len(data), "prefix": data[:32].hex()},
            )
            await self._dead_letter(delivery, str(exc))
            return None

    async def _dead_letter(self, delivery: Delivery[bytes], error: str) -> None:
        """Hands a poison delivery, with its error, to ``dead_letters``; else to the broker's DLX.

        The original is acked only once its dead-letter record is confirmed: nothing is lost.
        """
        if self.dead_letters is not None:
            try:
                await asyncio.wait_for(
                    await self.dead_letters.send(poison_record(delivery.message, error)), 30
                )
            except (PipeError, TimeoutError) as exc:
                log.error("pipe.poison.dead_letter_failed", extra={"error": repr(exc)})
            else:
                await delivery.ack()
                return
        await delivery.reject(requeue=False)

    async def ack_many(self, deliveries: Sequence[Delivery[T]]) -> list[PipeError]:
        """Acks a batch of its deliveries through the inner listener in one call (see
        :mod:`truba.pipes.batch`); one it did not decode is acked on its own."""
        inner: list[Delivery[bytes]] = []
        errors: list[PipeError] = []
        for delivery in deliveries:
            if isinstance(delivery, DecodedDelivery):
                inner.append(delivery.inner)
            else:
                errors += await ack_each([delivery])
        return errors + await ack_many(self.inner, inner) if inner else errors

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        async def decode_then_call(delivery: Delivery[bytes]) -> None:
            decoded = await self._decode(delivery)
            if decoded is not None:
                await callback(decoded)

        self.inner.subscribe(decode_then_call)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        await self.inner.close()


def deserialize(codec: Codec[T], dead_letters: Sender[bytes] | None = None) -> ListenerLayer[bytes, T]:
    """The deserialize layer: ``Listener[bytes] -> Listener[T]``; poison goes to ``dead_letters``."""
    return lambda inner: DeserializeListener(inner, codec, dead_letters)


def poison_record(data: bytes, error: str) -> bytes:
    """A dead-letter record: ``{"kind": "poison", "error": ..., "body": <original bytes>}`` in msgpack."""
    packed: bytes = msgpack.packb({"kind": "poison", "error": error, "body": data}, use_bin_type=True)
    return packed
