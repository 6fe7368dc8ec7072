"""Combinator: balance one stream of messages over several senders (one per broker).

Each message goes to a random sender that is not overloaded, where load is the number of that
sender's messages awaiting a confirm, capped per sender by ``max_load``. One slow broker therefore
fills up to its cap and stops getting messages, without slowing the others; when every sender is
at its cap, ``send`` waits for the first confirm (backpressure). A sender that breaks is skipped;
its unconfirmed messages stay listed until an outer layer re-sends and drops them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Sequence
from typing import Generic, TypeVar, final

from truba.pipes.base import Confirmation, Sender
from truba.pipes.errors import PipeBroken, PipeClosed, PipeError

T = TypeVar("T")
log = logging.getLogger(__name__)


@final
class BalanceSender(Generic[T]):
    """Sends each message through a random not-overloaded sender of ``senders``.

    Raises:
        PipeBroken: every sender is broken (the last cause).
        PipeClosed: after close().
    """

    def __init__(self, senders: Sequence[Sender[T]], max_load: int = 1000, rng: random.Random | None = None):
        if not senders:
            raise ValueError("balance needs at least one sender")
        self._senders = list(senders)
        self._load = [0] * len(senders)
        self._broken: list[PipeError | None] = [None] * len(senders)
        self._max_load = max_load
        self._rng = rng or random.Random()
        self._room = asyncio.Event()
        self._closed = False

    def loads(self) -> list[int]:
        """Messages awaiting a confirm, per sender."""
        return list(self._load)

    async def send(self, message: T) -> Confirmation:
        while True:
            if self._closed:
                raise PipeClosed("balanced sender is closed")
            healthy = [i for i, broken in enumerate(self._broken) if broken is None]
            if not healthy:
                cause = self._broken[-1]
                assert cause is not None
                raise cause
            candidates = [i for i in healthy if self._load[i] < self._max_load]
            if not candidates:
                self._room.clear()
                await self._room.wait()
                continue
            index = self._rng.choice(candidates)
            try:
                confirmation = await self._senders[index].send(message)
            except PipeBroken as exc:
                self._broken[index] = exc
                log.warning("pipe.balance.skip_broken", extra={"sender": index, "error": repr(exc)})
                continue
            self._load[index] += 1
            confirmation.add_done_callback(functools.partial(self._settled, index))
            return confirmation

    def _settled(self, index: int, _: Confirmation) -> None:
        self._load[index] -= 1
        self._room.set()

    def unconfirmed(self) -> Sequence[T]:
        return [message for sender in self._senders for message in sender.unconfirmed()]

    def drop_unconfirmed(self) -> None:
        for sender in self._senders:
            sender.drop_unconfirmed()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._room.set()
        await asyncio.gather(*(sender.close() for sender in self._senders), return_exceptions=True)


def balance(senders: Sequence[Sender[T]], max_load: int = 1000) -> BalanceSender[T]:
    """Combinator: one sender over many, picking a random one below ``max_load`` unconfirmed."""
    return BalanceSender(senders, max_load)
