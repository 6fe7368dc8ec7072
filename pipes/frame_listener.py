"""Layer: hand out each member of a frame (:mod:`truba.pipes.frame`) as a delivery of its own.

:class:`FrameListener` unpacks frames into one delivery per member. The frame is settled with
the broker once every member is: acked when all were acked; a member rejected with requeue is
published again alone through ``requeue`` (when given) before the frame is acked, so the members
that were done do not run again. Without ``requeue`` (or for members rejected without requeue)
the whole frame is rejected that way once all members are settled: done members may then run
again, as after a crash (outcomes are deduplicated by task id downstream). Given ``done`` (a
:class:`~truba.pipes.result_log.ResultLog`), a frame that comes back redelivered is first looked up
in it: members that already have a confirmed result, or whose copy a consumer handed back
(published again as a message of its own, the copy confirmed), are acked instead of handed out,
so a frame a dead consumer had half done runs only its other half. (A redelivered lone message
runs again, as any redelivered AMQP message would.)

A message that starts like a frame but is not one truba packs (see
:func:`~truba.pipes.frame_format.members`: bytes after the members, no members, a frame inside,
two members with the same ``member_key``) is poison: none of its members runs. With a
``dead_letters`` sender it is published there as a poison record carrying the reason (as the
deserialize layer does for a message it cannot decode), then acked; without one it is rejected
without requeue, so the broker dead-letters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import final

from truba.pipes.base import Delivery, Listener, Sender
from truba.pipes.batch import ack_many
from truba.pipes.errors import PipeError
from truba.pipes.frame_format import MalformedFrame
from truba.pipes.frame_format import members as frame_members
from truba.pipes.serialize import poison_record

log = logging.getLogger(__name__)


@final
class _Frame:
    """One received frame: settled with the broker once every member is."""

    def __init__(self, delivery: Delivery[bytes], members: int, requeue: Sender[bytes] | None) -> None:
        self.delivery = delivery
        # Read once for every member (each a property through the layers below, down to aiormq).
        self.redelivered = delivery.redelivered
        self.headers = delivery.headers
        self.left = members
        self.requeue = requeue
        self.again = False  # a member asked to run again, and could not be sent alone
        self.dead = False  # a member was rejected without requeue
        self.settled = False  # every member is: the frame was (or is being) acked or rejected

    async def settle(self, message: bytes, how: str) -> None:
        if how == "requeue":
            if self.requeue is not None:
                confirmation = await self.requeue.send(message)
                await confirmation
            else:
                self.again = True
        elif how == "reject":
            self.dead = True
        if self.counted():
            await self.finish()

    def counted(self) -> bool:
        """One member more is settled; True when it was the last (the frame is to be settled)."""
        self.left -= 1
        if self.left == 0:
            self.settled = True
            return True
        return False

    async def finish(self) -> None:
        """Settles the frame with the broker, as its members were settled."""
        if self.again:
            await self.delivery.reject(requeue=True)
        elif self.dead:
            await self.delivery.reject(requeue=False)
        else:
            await self.delivery.ack()


@final
class _Member:
    """One message of a frame, settled on its own."""

    def __init__(self, message: bytes, frame: _Frame) -> None:
        self._message = message
        self._frame = frame
        self._settled = False

    @property
    def message(self) -> bytes:
        return self._message

    @property
    def redelivered(self) -> bool:
        return self._frame.redelivered

    @property
    def framed(self) -> bool:
        return not self._frame.settled

    @property
    def headers(self) -> Mapping[str, object]:
        return self._frame.headers

    async def ack(self) -> None:
        frame = self._frame
        if not self._settled and frame.left > 1:
            # Not the frame's last member: nothing to wait for, counted here (a coroutine less
            # per member: every task's result, every frame's but one, passes here).
            self._settled = True
            frame.left -= 1
            return
        await self._settle("ack")

    async def reject(self, requeue: bool) -> None:
        await self._settle("requeue" if requeue else "reject")

    def acked(self) -> _Frame | None:
        """Settles this member as acked without settling its frame: the frame, if this was its
        last member (its owner settles it then: see :meth:`FrameListener.ack_many`), else None."""
        if self._settled:
            raise PipeError("frame member already settled")
        self._settled = True
        return self._frame if self._frame.counted() else None

    async def _settle(self, how: str) -> None:
        if self._settled:
            raise PipeError("frame member already settled")
        self._settled = True
        await self._frame.settle(self._message, how)


@final
class _Turn:
    """Called back once the event loop turned (see :meth:`FrameListener._pull_here`)."""

    __slots__ = ("passed",)

    def __init__(self) -> None:
        self.passed = False

    def __call__(self) -> None:
        self.passed = True


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


DoneCheck = Callable[[Delivery[bytes], Sequence[bytes]], Awaitable[Collection[int]]]
"""Given a redelivered delivery and its members, the indexes of those with a confirmed result or
a confirmed hand-back (see :class:`~truba.pipes.result_log.ResultLog`)."""


@final
class FrameListener:
    """``Listener[bytes] -> Listener[bytes]`` handing out each member of a frame on its own.

    Several consumers may wait in ``get`` at once (a daemon's workers): one inner ``get`` runs
    for all of them, and the members of a frame it brings go to every waiter, so a frame is
    spread over the free slots instead of waiting behind one. Members received and not yet
    handed out stay here until ``get`` takes them (after :meth:`cancel` too) or :meth:`close`
    returns their frames to the broker.
    """

    name = "unframe"

    def __init__(
        self,
        inner: Listener[bytes],
        *,
        requeue: Sender[bytes] | None = None,
        done: DoneCheck | None = None,
        member_key: Callable[[bytes], str | None] | None = None,
        dead_letters: Sender[bytes] | None = None,
    ) -> None:
        self.inner = inner
        self._requeue = requeue
        self._done = done
        self._member_key = member_key
        """The key two members of one frame must not share (a task id), None for none."""
        self._dead_letters = dead_letters
        self._looking_up = False
        self._ready: deque[tuple[float, Delivery[bytes]]] = deque()
        """Members received and not handed out yet, with when their frame arrived."""
        self._pull: asyncio.Task[bool] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        """The gets waiting for the running pull to end."""
        self._pull_until = 0.0
        """When the running pull's inner get times out (loop time)."""
        self._pulling = False
        """A get pulls in its own task right now (see :meth:`_pull_here`)."""
        self._warm = False
        """A pull task's inner get returned: the inner listener is connected (see _pull_here)."""

    @property
    def held(self) -> int:
        """Members received and not handed out yet."""
        return len(self._ready)

    def take_held(self, most: int | None = None) -> list[Delivery[bytes]]:
        """The members received and not handed out yet, at once, oldest first (none: []): every
        one, or the ``most`` oldest.

        For a consumer that takes what is at hand in one call (the client's result stream, a
        daemon's worker taking a chunk): the rest of a frame costs it no ``get`` per member.
        Taken, they are the caller's to settle, as if each had come from ``get``."""
        ready = self._ready
        if not ready:
            return []
        if most is None or most >= len(ready):
            taken = [delivery for _, delivery in ready]
            ready.clear()
            return taken
        popleft = ready.popleft
        return [popleft()[1] for _ in range(most)]

    def give_back(self, deliveries: Sequence[Delivery[bytes]]) -> None:
        """Puts members taken with :meth:`take_held` and not handed out back in front, in their
        order: the next ``get`` hands out the first (a consumer that cannot take one itself)."""
        now = time.monotonic()
        self._ready.extendleft((now, delivery) for delivery in reversed(deliveries))

    def held_for(self) -> float:
        """Seconds the oldest member not handed out yet has waited here (0.0: none waits).

        An owner whose consumers are all busy hands such members back when they wait too
        long, so that another consumer of the queue can run them (late binding).
        """
        if not self._ready:
            return 0.0
        return time.monotonic() - self._ready[0][0]

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        if self._ready:
            return self._ready.popleft()[1]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._pull is None and not self._pulling and self._warm:
                # Nobody pulls: this get does, in its own task (see _pull_here).
                if not await self._pull_here(deadline):
                    return None  # the inner get timed out for our whole timeout
                if self._ready:
                    return self._ready.popleft()[1]
                if self._pull is None:  # nothing of it to hand out: pull again for the rest
                    continue
            if self._pulling:
                # Another get pulls in its own task: it wakes us as it ends; if it took the
                # only delivery, we pull next.
                await self._wait(deadline - loop.time())
                if self._ready:
                    return self._ready.popleft()[1]
                if loop.time() >= deadline:
                    return None
                continue
            pull = self._pull or self._start_pull(deadline)
            until = self._pull_until  # a pull another waiter started may end before our deadline
            if not pull.done():
                # The pull wakes us itself as it ends (no done callback in between: one turn of
                # the event loop less per frame); neither our timeout nor our cancellation stops
                # it: what it brings stays here for the next get.
                await self._wait(deadline - loop.time())
            if not pull.done() and self._looking_up:
                # The pull holds a redelivered frame and is looking it up in the record (a
                # bounded wait): its members come next, and must not go unseen by an owner
                # that takes what is left before closing (it would return them redelivered).
                await asyncio.wait((pull,))
            if self._ready:
                return self._ready.popleft()[1]
            if not pull.done():
                return None  # our time is up; the pull goes on for the others
            if not pull.cancelled() and (error := pull.exception()) is not None:
                raise error
            if loop.time() >= deadline or (not pull.cancelled() and not pull.result() and until >= deadline):
                return None  # the inner get timed out for our whole timeout
            # Others took what the pull brought, or it was cancelled, or it timed out before our
            # deadline (another waiter's, shorter): pull again for the rest of our time.

    async def _pull_here(self, deadline: float) -> bool:
        """The one inner get, run in the calling get's own task: a delivery reaches its worker
        one turn of the event loop sooner than through a pull task (the task's wake-up, then
        the worker's). False when it timed out. Wakes the gets waiting meanwhile as it ends.

        Cancelling the caller cancels the inner get, which takes nothing then (the leaves'
        gets wait on a queue, cancel-safe). What follows the inner get is synchronous on the
        common path; a delivery that needs a wait of its own (a redelivered frame to look up,
        a malformed one to dead-letter) is finished by a pull task (:meth:`_finish`), which no
        caller's cancellation cuts short. Only once the listener is connected (``_warm``): a
        first connect is no step to cancel halfway.
        """
        loop = asyncio.get_running_loop()
        self._pulling = True
        self._pull_until = deadline
        turn = _Turn()
        passing = loop.call_soon(turn)
        try:
            delivery = await self.inner.get(max(0.0, deadline - loop.time()))
            if delivery is not None:
                members = self._members_now(delivery)
                if members is None:
                    pull = self._pull = loop.create_task(self._finish(delivery))
                    pull.add_done_callback(self._pulled)
                else:
                    self._ready.extend((time.monotonic(), member) for member in members)
        finally:
            self._pulling = False
            self._wake()
        if not turn.passed:
            # The inner listener had it at hand: what already waits for the event loop goes
            # first all the same, as it did when every pull was a task (the client acks a batch
            # from a task started just before its next get); cancelled here, what was pulled
            # stays in _ready for the next get.
            passing.cancel()
            await asyncio.sleep(0)
        return delivery is not None

    async def _wait(self, timeout: float) -> None:
        """Until the running pull ends (it wakes its waiters: :meth:`_wake`) or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(max(0.0, timeout), self._time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter.cancelled():  # our task was cancelled: no longer waiting
                self._time_out(waiter)

    def _time_out(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        _wake(waiter)

    def _wake(self) -> None:
        """Wakes every get waiting for the pull that ends now."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _wake(waiter)

    async def take_in(self) -> None:
        """Moves one delivery the inner listener has at hand (if any, without waiting) in here,
        split: its members then count as :attr:`held`. Lets an owner whose consumers are all
        busy see (and hand back) a frame that would otherwise wait unseen in the prefetch."""
        if self._pull is None and not self._pulling:
            await asyncio.wait((self._start_pull(asyncio.get_running_loop().time()),))

    def _start_pull(self, until: float) -> asyncio.Task[bool]:
        """The one inner get that every waiter shares (see :meth:`get`), waiting until ``until``."""
        loop = asyncio.get_running_loop()
        self._pull_until = until
        pull = self._pull = loop.create_task(self._fetch(max(0.0, until - loop.time())))
        pull.add_done_callback(self._pulled)
        return pull

    def _pulled(self, pull: asyncio.Task[bool]) -> None:
        if self._pull is pull:  # cancelled before it ran (its own finally never ran)
            self._pull = None
            self._wake()
        if not pull.cancelled():
            pull.exception()  # seen: its waiters may all have left (the next get raises it anew)

    async def _fetch(self, timeout: float) -> bool:
        """One inner get; its members go to ``_ready``. False when it timed out. Wakes the gets
        waiting for it as it ends, however it ends (they run once it has)."""
        try:
            try:
                delivery = await self.inner.get(timeout)
            finally:
                self._pull = None
            self._warm = True  # connected: gets may pull in their own tasks from now on
            if delivery is None:
                return False
            members = await self._unsettled(delivery)
            now = time.monotonic()
            self._ready.extend((now, member) for member in members)
            return True
        finally:
            self._wake()

    async def _finish(self, delivery: Delivery[bytes]) -> bool:
        """A pull task for what a get pulled in its own task and must wait on (see
        :meth:`_pull_here`): its members go to ``_ready``; wakes the gets waiting as it ends."""
        try:
            members = await self._unsettled(delivery)
            self._ready.extend((time.monotonic(), member) for member in members)
            return True
        finally:
            self._pull = None
            self._wake()

    async def ack_many(self, deliveries: Sequence[Delivery[bytes]]) -> list[PipeError]:
        """Acks a batch (see :mod:`truba.pipes.batch`): a member's ack only counts it in its
        frame, with no coroutine of its own; a frame whose members are all settled now is
        settled with the broker, and lone messages are acked, through the inner listener in
        one call."""
        errors: list[PipeError] = []
        below: list[Delivery[bytes]] = []
        for delivery in deliveries:
            if not isinstance(delivery, _Member):
                below.append(delivery)
                continue
            try:
                frame = delivery.acked()
            except PipeError as exc:
                errors.append(exc)
                continue
            if frame is not None:
                if frame.again or frame.dead:  # a member was put back: not a plain ack
                    try:
                        await frame.finish()
                    except PipeError as exc:
                        errors.append(exc)
                else:
                    below.append(frame.delivery)
        if below:
            errors += await ack_many(self.inner, below)
        return errors

    def subscribe(self, callback: Callable[[Delivery[bytes]], Awaitable[None]]) -> None:
        async def each(delivery: Delivery[bytes]) -> None:
            for member in await self._unsettled(delivery):
                await callback(member)

        self.inner.subscribe(each)

    async def cancel(self) -> None:
        await self.inner.cancel()

    async def close(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
        self._ready.clear()  # unsettled members: their frames go back to the broker
        await self.inner.close()

    async def _unsettled(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]]:
        """The members of ``delivery`` to hand out: all of them, but for a redelivered one those
        that the ``done`` record says have a result already (they are acked here)."""
        members = await self._split(delivery)
        if not members:
            return members
        if self._done is None or not delivery.redelivered or len(members) == 1:
            return members  # a lone message runs again, as any redelivered AMQP message would
        self._looking_up = True
        try:
            done = set(await self._done(delivery, [member.message for member in members]))
        except Exception as exc:  # the record is an optimisation: without it, all run again
            log.warning("pipe.frame.record_failed", extra={"error": repr(exc)})
            return members
        finally:
            self._looking_up = False
        if done:
            log.info("pipe.frame.done_before", extra={"members": len(members), "done": len(done)})
        for i in sorted(done):
            await members[i].ack()
        return [member for i, member in enumerate(members) if i not in done]

    def _members_now(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]] | None:
        """The members of ``delivery`` to hand out when that needs no wait (the common case:
        a lone message, a frame delivered for the first time); None for a malformed frame or a
        redelivered one to look up (:meth:`_unsettled` deals with those)."""
        try:
            found = frame_members(delivery.message, self._member_key)
        except MalformedFrame:
            return None
        if found is None:
            return [delivery]
        if self._done is not None and delivery.redelivered and len(found) > 1:
            return None
        frame = _Frame(delivery, len(found), self._requeue)
        return [_Member(message, frame) for message in found]

    async def _split(self, delivery: Delivery[bytes]) -> list[Delivery[bytes]]:
        """The members of ``delivery`` (itself when it is a lone message; none when it is a
        malformed frame, which goes to the dead-letter path)."""
        try:
            found = frame_members(delivery.message, self._member_key)
        except MalformedFrame as exc:
            await self._dead_letter(delivery, str(exc))
            return []
        if found is None:
            return [delivery]
        frame = _Frame(delivery, len(found), self._requeue)
        return [_Member(message, frame) for message in found]

    async def _dead_letter(self, delivery: Delivery[bytes], error: str) -> None:
        """A malformed frame, whole and with its error, to ``dead_letters`` (else to the broker's
        dead-letter exchange); the original is acked only once its record is confirmed."""
        data = delivery.message
        log.error(
            "pipe.frame.malformed", extra={"error": error, "size": len(data), "prefix": data[:32].hex()}
        )
        if self._dead_letters is not None:
            try:
                await asyncio.wait_for(await self._dead_letters.send(poison_record(data, error)), 30)
            except (PipeError, TimeoutError) as exc:
                log.error("pipe.frame.dead_letter_failed", extra={"error": repr(exc)})
            else:
                await delivery.ack()
                return
        await delivery.reject(requeue=False)
