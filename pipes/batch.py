"""Batches through a stack: many messages sent, or many deliveries acked, in one call per layer.

Each message (each ack) passing a stack one by one costs a coroutine per layer it crosses. An
owner that has several at once (the daemon: a chunk's results, a run of confirmed tasks to ack)
hands them down together: a layer that can batch (:class:`BatchSender`, :class:`BatchListener`)
does its concern for all of them and passes the batch to the layer below in one call; a layer
that cannot is driven one by one by :func:`send_many` and :func:`ack_many`, exactly as its
owner would. Nothing changes on the wire: a frame layer gathers a batch's messages as it would
gather them one by one, each with its own confirmation.

**Sending.** ``send_many(messages)`` takes a *prefix* of the messages, in order, and returns one
confirmation per message taken, at least one: a message that cannot be taken at once (its send
fails, or waits for room) ends the batch there, and the caller sends it, and what follows, again.
If the first cannot be taken, it raises what ``send`` would. So a batch never hides an error:
the message it concerns comes first in the next call, and its error is raised there.

**Acking.** ``ack_many(deliveries)`` acks every one and returns the errors of those
whose ack failed, one :class:`~truba.pipes.errors.PipeError` each: a failed ack (a dead channel,
whose broker requeues the message anyway) does not stop the others. A delivery a layer does not
know (not one it handed out) is acked on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from truba.pipes.base import Confirmation, Delivery, Listener, Sender
from truba.pipes.errors import PipeError

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

__all__ = ["BatchListener", "BatchSender", "ack_each", "ack_many", "send_each", "send_many"]


class BatchSender(Protocol[T_contra]):
    """A sender that takes a batch in one call (see the module docstring)."""

    async def send_many(self, messages: Sequence[T_contra]) -> list[Confirmation]: ...


class BatchListener(Protocol[T_contra]):
    """A listener that acks a batch of its deliveries in one call (see the module docstring)."""

    async def ack_many(self, deliveries: Sequence[Delivery[T_contra]]) -> list[PipeError]: ...


async def send_many(sender: Sender[T], messages: Sequence[T]) -> list[Confirmation]:
    """A prefix of ``messages`` sent through ``sender``, in one call if it batches, else one by
    one (see the module docstring); ``messages`` must not be empty."""
    batched = getattr(sender, "send_many", None)
    if batched is not None:
        taken: list[Confirmation] = await batched(messages)
        return taken
    return await send_each(sender, messages)


async def send_each(sender: Sender[T], messages: Sequence[T]) -> list[Confirmation]:
    """``send_many`` for a sender that cannot batch: ``send`` per message, stopping at the first
    that fails after one was taken (the caller sends it again: its error is raised then)."""
    taken = [await sender.send(messages[0])]
    for message in messages[1:]:
        try:
            taken.append(await sender.send(message))
        except PipeError:
            break
    return taken


async def ack_many(listener: Listener[T], deliveries: Sequence[Delivery[T]]) -> list[PipeError]:
    """Acks ``deliveries`` of ``listener``'s, in one call if it batches, else one by one; the
    errors of the acks that failed (see the module docstring)."""
    batched = getattr(listener, "ack_many", None)
    if batched is not None:
        errors: list[PipeError] = await batched(deliveries)
        return errors
    return await ack_each(deliveries)


async def ack_each(deliveries: Sequence[Delivery[T]]) -> list[PipeError]:
    """``ack_many`` one by one: each delivery's own ``ack``."""
    errors: list[PipeError] = []
    for delivery in deliveries:
        try:
            await delivery.ack()
        except PipeError as exc:
            errors.append(exc)
    return errors
