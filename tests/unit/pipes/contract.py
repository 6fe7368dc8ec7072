"""The pipe contract suite: checks every Sender and every Listener must pass, after trio's
``check_one_way_stream``.

A check is a plain async function taking a *factory*. Each call of the factory is an async context
manager that yields a fresh :class:`SenderHarness` / :class:`ListenerHarness`: the pipe under test
(a leaf, or any stack of layers over leaves), a *bottom* that plays the broker under it, and the
timing to use. A bottom is scriptable, as tower-test's handle is: it makes the messages, holds and
releases confirms, delivers messages, breaks the leaves, and reports which leaves are still open.
The factory cleans up (closes the pipe, deletes queues) when the context exits.

- :class:`FakeSenderBottom` / :class:`FakeListenerBottom` drive :mod:`truba.pipes.testing` fakes;
  build any layer over their ``leaf()`` (or pass ``connect`` to a reopen wrapper).
- ``tests/integration/test_rabbit_contract.py`` has the RabbitMQ bottoms (a fault proxy per pipe).

Which checks apply: every pipe gets :data:`SENDER_CHECKS` / :data:`LISTENER_CHECKS`. A break is
final for leaves and for every layer but reopen (:data:`SENDER_BREAK_CHECKS`), while reopen
promises the opposite and gets :data:`SENDER_REOPEN_CHECKS` instead; :func:`sender_checks` and
:func:`listener_checks` pick. :func:`check_sender` / :func:`check_listener` run them all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pytest

from truba.pipes.base import Confirmation, Delivery, Listener, Sender
from truba.pipes.batch import ack_many, send_many
from truba.pipes.errors import MessageRejected, PipeBroken, PipeClosed, PipeError
from truba.pipes.testing import FakeListener, FakeSender

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
B = TypeVar("B")


@dataclass(frozen=True)
class Timing:
    """How long a check waits. Unit checks use tiny values; a real broker needs more."""

    short: float
    """A ``get`` timeout for "nothing is there", and the unit of polling."""
    patience: float
    """Upper bound for anything that must happen (a confirm, a delivery, a reopen)."""
    settle: float = 0.0
    """Extra wait before concluding that nothing more happens (confirms in flight, requeues)."""
    slack: float = 0.1
    """How much later than its timeout an empty ``get`` may return."""


UNIT = Timing(short=0.02, patience=0.25, settle=0.0, slack=0.1)


class SenderBottom(Protocol[T_co]):
    """The broker under a sender: fake or real, scriptable by the checks."""

    partial_confirms: bool
    """True if ``release(count)`` can confirm some held messages and not others."""

    @property
    def opened(self) -> int:
        """How many leaves were opened under the sender so far."""
        ...

    def message(self, i: int) -> T_co:
        """Message number ``i``, as the sender under test takes it; distinct for distinct ``i``."""
        ...

    async def hold(self) -> None:
        """From now on the broker withholds its confirms (it confirms at once by default).

        Checks hold only once the sender has sent a message, so its leaves are open: a real bottom
        holds confirms by stalling the network, which would also stall a connect.
        """
        ...

    async def release(self, count: int | None = None) -> None:
        """Confirms the oldest ``count`` held messages; None: all of them, and stop holding.

        A rejecting bottom (``make(rejecting=True)``) rejects (nacks or returns) instead.
        """
        ...

    async def break_(self) -> None:
        """Breaks every open leaf under the sender, as a lost connection would."""
        ...

    async def open_leaves(self) -> int:
        """How many leaves opened so far are not closed."""
        ...


class ListenerBottom(Protocol[T]):
    """The broker under a listener: fake or real, scriptable by the checks."""

    @property
    def opened(self) -> int:
        """How many leaves were opened under the listener so far."""
        ...

    def message(self, i: int) -> T:
        """Message number ``i``, as the listener under test hands it out."""
        ...

    async def push(self, message: T) -> None:
        """The broker delivers ``message`` to the listener's queue (waits for a leaf if need be)."""
        ...

    async def break_(self) -> None:
        """Breaks every open leaf under the listener (remote close / lost channel)."""
        ...

    async def open_leaves(self) -> int:
        """How many leaves opened so far are not closed."""
        ...

    async def backlog(self) -> int:
        """Messages the broker still holds (ready, or delivered and unsettled); after close."""
        ...


@dataclass
class SenderHarness(Generic[T]):
    """A sender under test and the broker under it."""

    sender: Sender[T]
    bottom: SenderBottom[T]
    timing: Timing
    reopens: bool = False
    """The sender promises to survive a break (reopen) instead of staying broken."""


@dataclass
class ListenerHarness(Generic[T]):
    """A listener under test and the broker under it."""

    listener: Listener[T]
    bottom: ListenerBottom[T]
    timing: Timing
    reopens: bool = False


class SenderFactory(Protocol[T]):
    """Makes a fresh harness per call; ``rejecting``: the broker refuses every message."""

    def __call__(self, *, rejecting: bool = False) -> AbstractAsyncContextManager[SenderHarness[T]]: ...


class ListenerFactory(Protocol[T]):
    """Makes a fresh harness per call."""

    def __call__(self) -> AbstractAsyncContextManager[ListenerHarness[T]]: ...


SenderCheck = Callable[[SenderFactory[Any]], Awaitable[None]]
ListenerCheck = Callable[[ListenerFactory[Any]], Awaitable[None]]


# -- helpers ---------------------------------------------------------------------------------------


async def _settle(timing: Timing) -> None:
    """Lets callbacks and tasks that are ready run (and, for real brokers, frames arrive)."""
    for _ in range(20):
        await asyncio.sleep(0)
    if timing.settle:
        await asyncio.sleep(timing.settle)


async def _until(predicate: Callable[[], bool], timing: Timing, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timing.patience
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timing.patience} s: {what}")
        await asyncio.sleep(min(0.005, timing.short))


def _state(confirmation: Confirmation) -> str:
    if not confirmation.done():
        return "pending"
    if confirmation.cancelled():
        return "cancelled"
    exc = confirmation.exception()
    return "confirmed" if exc is None else f"failed({type(exc).__name__})"


async def _confirmed(confirmations: Sequence[Confirmation], timing: Timing, what: str) -> None:
    """Waits until every confirmation is done and asserts that each resolved successfully."""
    await _until(lambda: all(c.done() for c in confirmations), timing, what)
    states = [_state(c) for c in confirmations]
    assert all(state == "confirmed" for state in states), f"{what}: {states}"


async def _warm_up(h: SenderHarness[T], i: int) -> None:
    """Sends message ``i`` and waits for its confirm, so every leaf under the sender is open."""
    confirmation = await h.sender.send(h.bottom.message(i))
    await _confirmed([confirmation], h.timing, "a message sent while the broker confirms")


async def _close_bounded(pipe: Sender[Any] | Listener[Any], timing: Timing) -> None:
    await asyncio.wait_for(pipe.close(), timing.patience)


async def _cancelled_close(pipe: Sender[Any] | Listener[Any], steps: int) -> asyncio.Task[None]:
    """Starts ``close()``, lets it run ``steps`` loop iterations, then cancels it (if still running)."""
    closing = asyncio.create_task(pipe.close())
    for _ in range(steps):
        await asyncio.sleep(0)
    closing.cancel()
    return closing


async def _finish(task: asyncio.Task[None], timing: Timing) -> None:
    done, _ = await asyncio.wait({task}, timeout=timing.patience)
    assert done, f"a cancelled close() did not finish within {timing.patience} s"
    if not task.cancelled() and task.exception() is not None:
        raise AssertionError(f"a cancelled close() raised {task.exception()!r}")


async def _take(h: ListenerHarness[T], i: int) -> Delivery[T]:
    """Pushes message ``i`` and gets it (the first delivery, not a redelivery).

    The get starts first: a listener may open its leaf only when asked for a delivery.
    """
    message = h.bottom.message(i)
    getter = asyncio.create_task(h.listener.get(h.timing.patience))
    try:
        await h.bottom.push(message)
    except BaseException:
        getter.cancel()
        raise
    delivery = await getter
    assert delivery is not None, "a pushed message was not delivered"
    assert delivery.message == message, f"got {delivery.message!r}, not the pushed {message!r}"
    assert not delivery.redelivered, "a first delivery is marked redelivered"
    return delivery


@contextlib.contextmanager
def _captured_logs(level: int = logging.WARNING) -> Iterator[list[logging.LogRecord]]:
    """Records of ``level`` or above from every logger (through the root logger)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    handler = Keep(level)
    old_level = root.level
    root.addHandler(handler)
    if old_level > level:
        root.setLevel(level)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


# -- sender checks ---------------------------------------------------------------------------------


async def check_sender_close_is_idempotent_and_closes_inner(make: SenderFactory[T]) -> None:
    """close() twice works, and every leaf under the sender ends up closed."""
    async with make() as h:
        # Given a sender that has sent (so every layer below it is open)
        await _warm_up(h, 0)
        assert h.bottom.opened >= 1, "sending opened no leaf"
        # When it is closed twice
        await _close_bounded(h.sender, h.timing)
        await _close_bounded(h.sender, h.timing)
        # Then every leaf under it is closed as well
        assert await h.bottom.open_leaves() == 0, "close() left an inner pipe open"


async def check_sender_send_after_close_raises_pipe_closed(make: SenderFactory[T]) -> None:
    """After close(), send raises PipeClosed: before any use, and after use."""
    async with make() as h:
        await _close_bounded(h.sender, h.timing)
        with pytest.raises(PipeClosed):
            await h.sender.send(h.bottom.message(0))
    async with make() as h:
        await _warm_up(h, 0)
        await _close_bounded(h.sender, h.timing)
        for i in (1, 2):
            with pytest.raises(PipeClosed):
                await h.sender.send(h.bottom.message(i))


async def check_sender_cancelled_close_still_closes(make: SenderFactory[T]) -> None:
    """A close() cancelled at its 1st, 2nd or 3rd suspension still closes the sender and its leaves.

    The sender has a message awaiting its confirm, so close() has something to wait for.
    """
    for steps in (1, 2, 3):
        async with make() as h:
            await _warm_up(h, 0)
            await h.bottom.hold()
            await h.sender.send(h.bottom.message(1))
            closing = await _cancelled_close(h.sender, steps)
            await h.bottom.release()
            await _finish(closing, h.timing)
            with pytest.raises(PipeClosed):
                await h.sender.send(h.bottom.message(2))
            assert await h.bottom.open_leaves() == 0, (
                f"close() cancelled after {steps} step(s) left a leaf open"
            )


async def check_sender_unconfirmed_is_exact(make: SenderFactory[T]) -> None:
    """unconfirmed() lists exactly the messages not confirmed, oldest first; their confirmations are
    pending while the confirmed ones resolved. After the rest is confirmed it is empty."""
    async with make() as h:
        sender, bottom = h.sender, h.bottom
        messages = [bottom.message(i) for i in range(6)]
        # Given two messages the broker confirmed
        confirmations = [await sender.send(m) for m in messages[:2]]
        await _confirmed(confirmations, h.timing, "messages sent while the broker confirms")
        # When four more are sent while it withholds its confirms, and (where the broker can) the
        # oldest two of those are confirmed
        await bottom.hold()
        confirmations += [await sender.send(m) for m in messages[2:]]
        done = 2
        if bottom.partial_confirms:
            await bottom.release(2)
            done = 4
        await _settle(h.timing)
        # Then exactly the others are listed, oldest first, and only their confirmations are pending
        states = [_state(c) for c in confirmations]
        assert states == ["confirmed"] * done + ["pending"] * (6 - done), states
        unconfirmed = list(sender.unconfirmed())
        assert unconfirmed == messages[done:], f"unconfirmed() is {unconfirmed}, not {messages[done:]}"
        # And once the broker confirms the rest, nothing is left
        await bottom.release()
        await _confirmed(confirmations, h.timing, "held messages after the broker released them")
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == [], f"unconfirmed() still lists {list(sender.unconfirmed())}"


async def check_sender_send_many_takes_a_prefix_in_order(make: SenderFactory[T]) -> None:
    """``send_many`` (:mod:`truba.pipes.batch`) takes a batch a prefix at a time, one confirmation
    per message taken: sent again until all are taken, they are listed by unconfirmed() in order
    while the broker withholds its confirms, as if sent one by one, and all confirmed after."""
    async with make() as h:
        sender, bottom = h.sender, h.bottom
        await _warm_up(h, 0)
        await bottom.hold()
        messages = [bottom.message(i) for i in range(1, 6)]
        confirmations: list[Confirmation] = []
        while len(confirmations) < len(messages):
            taken = await send_many(sender, messages[len(confirmations) :])
            assert taken, "send_many took nothing and raised nothing"
            confirmations += taken
        await _settle(h.timing)
        unconfirmed = list(sender.unconfirmed())
        assert unconfirmed == messages, f"unconfirmed() is {unconfirmed}, not the batch {messages}"
        await bottom.release()
        await _confirmed(confirmations, h.timing, "a batch after the broker released its confirms")
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == [], f"unconfirmed() still lists {list(sender.unconfirmed())}"
        await sender.close()
        with pytest.raises(PipeClosed):
            await send_many(sender, messages[:2])


async def check_sender_drop_unconfirmed_empties_unconfirmed(make: SenderFactory[T]) -> None:
    """drop_unconfirmed() empties unconfirmed(); late confirms don't bring messages back."""
    async with make() as h:
        sender, bottom = h.sender, h.bottom
        await _warm_up(h, 0)
        await bottom.hold()
        messages = [bottom.message(i) for i in range(1, 4)]
        for m in messages:
            await sender.send(m)
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == messages, "unconfirmed() is not exact before the drop"
        sender.drop_unconfirmed()
        assert list(sender.unconfirmed()) == [], "drop_unconfirmed() left messages listed"
        await bottom.release()
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == [], "a late confirm brought a dropped message back"
        # And the sender goes on working
        after = await sender.send(bottom.message(4))
        await _confirmed([after], h.timing, "a message sent after drop_unconfirmed()")
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == [], f"unconfirmed() still lists {list(sender.unconfirmed())}"


async def check_sender_rejected_message_fails_confirmation_and_stays_unconfirmed(
    make: SenderFactory[T],
) -> None:
    """A nacked or returned message fails its confirmation with MessageRejected and stays listed."""
    async with make(rejecting=True) as h:
        sender, bottom = h.sender, h.bottom
        messages = [bottom.message(i) for i in range(2)]
        for n, message in enumerate(messages, 1):
            confirmation = await sender.send(message)
            await bottom.release()
            await _until(confirmation.done, h.timing, "a confirmation for a rejected message")
            assert isinstance(confirmation.exception(), MessageRejected), _state(confirmation)
            await _settle(h.timing)
            unconfirmed = list(sender.unconfirmed())
            assert unconfirmed == messages[:n], f"rejected messages are not all listed: {unconfirmed}"
        sender.drop_unconfirmed()
        assert list(sender.unconfirmed()) == [], "drop_unconfirmed() left messages listed"


async def check_sender_broken_stays_broken(make: SenderFactory[T]) -> None:
    """After a break, send raises PipeBroken and keeps raising it; every message sent is listed by
    unconfirmed() (none is confirmed), and no confirmation resolved successfully."""
    async with make() as h:
        assert not h.reopens, "a reopening sender gets check_sender_reopen_recovers instead"
        sender, bottom = h.sender, h.bottom
        await _warm_up(h, 0)
        await bottom.hold()
        sent = [(m, await sender.send(m)) for m in (bottom.message(1), bottom.message(2))]
        await bottom.break_()
        # A real transport notices a break a little later: sends accepted until then count as sent.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + h.timing.patience
        i = 3
        while True:
            message = bottom.message(i)
            i += 1
            try:
                sent.append((message, await sender.send(message)))
            except PipeBroken:
                break
            assert loop.time() < deadline, "send did not raise PipeBroken after the break"
            await asyncio.sleep(h.timing.short / 4)
        for _ in range(3):
            with pytest.raises(PipeBroken):
                await sender.send(bottom.message(i))
            i += 1
        await bottom.release()
        await _settle(h.timing)
        states = [_state(c) for _, c in sent]
        assert "confirmed" not in states, states
        assert all(s == "pending" or s.startswith("failed") for s in states), states
        unconfirmed, expected = list(sender.unconfirmed()), [m for m, _ in sent]
        lost = [m for m in expected if m not in unconfirmed]
        assert not lost and len(unconfirmed) == len(expected), f"messages of the broken pipe got lost: {lost}"
        assert unconfirmed == expected, "unconfirmed() does not list the messages oldest first"


async def check_sender_reopen_recovers_and_resends(make: SenderFactory[T]) -> None:
    """After a break, the sender works again within patience and the messages unconfirmed at the
    break are re-sent: their original confirmations resolve."""
    async with make() as h:
        assert h.reopens, "check_sender_broken_stays_broken applies instead"
        sender, bottom = h.sender, h.bottom
        await _warm_up(h, 0)
        await bottom.hold()
        confirmations = [await sender.send(bottom.message(i)) for i in (1, 2)]
        await bottom.break_()
        await bottom.release()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + h.timing.patience
        while True:
            try:
                confirmations.append(await sender.send(bottom.message(3)))
                break
            except PipeError as exc:
                assert exc.retryable, f"while reopening, send raised a non-retryable {exc!r}"
                assert loop.time() < deadline, f"not reopened within {h.timing.patience} s"
                await asyncio.sleep(h.timing.short / 4)
        await _confirmed(confirmations, h.timing, "messages sent before and after a reopen")
        await _settle(h.timing)
        assert list(sender.unconfirmed()) == [], f"unconfirmed() still lists {list(sender.unconfirmed())}"


SENDER_CHECKS: Mapping[str, SenderCheck] = {
    "close_is_idempotent_and_closes_inner": check_sender_close_is_idempotent_and_closes_inner,
    "send_after_close_raises_pipe_closed": check_sender_send_after_close_raises_pipe_closed,
    "cancelled_close_still_closes": check_sender_cancelled_close_still_closes,
    "unconfirmed_is_exact": check_sender_unconfirmed_is_exact,
    "send_many_takes_a_prefix_in_order": check_sender_send_many_takes_a_prefix_in_order,
    "drop_unconfirmed_empties_unconfirmed": check_sender_drop_unconfirmed_empties_unconfirmed,
    "rejected_fails_confirmation_and_stays_unconfirmed": (
        check_sender_rejected_message_fails_confirmation_and_stays_unconfirmed
    ),
}
SENDER_BREAK_CHECKS: Mapping[str, SenderCheck] = {"broken_stays_broken": check_sender_broken_stays_broken}
SENDER_REOPEN_CHECKS: Mapping[str, SenderCheck] = {
    "reopen_recovers_and_resends": check_sender_reopen_recovers_and_resends
}


def sender_checks(*, reopens: bool) -> dict[str, SenderCheck]:
    """The checks a sender must pass: every common one, and the break check that fits it."""
    return {**SENDER_CHECKS, **(SENDER_REOPEN_CHECKS if reopens else SENDER_BREAK_CHECKS)}


async def check_sender(make: SenderFactory[T], *, reopens: bool = False) -> None:
    """Runs every sender check on ``make`` (trio's ``check_one_way_stream``, for senders)."""
    for check in sender_checks(reopens=reopens).values():
        await check(make)


# -- listener checks -------------------------------------------------------------------------------


async def check_listener_get_returns_none_after_timeout(make: ListenerFactory[T]) -> None:
    """On an empty queue, get(timeout) returns None after about ``timeout``."""
    async with make() as h:
        loop = asyncio.get_running_loop()
        # (the first get may connect first: ``slack`` covers that)
        for timeout in (h.timing.short, 2 * h.timing.short):
            start = loop.time()
            assert await h.listener.get(timeout) is None
            elapsed = loop.time() - start
            assert 0.9 * timeout <= elapsed <= timeout + h.timing.slack, (timeout, elapsed)


async def check_listener_blocked_get_wakes_with_pipe_closed_on_close(make: ListenerFactory[T]) -> None:
    """A get() waiting on an empty queue raises PipeClosed as soon as the listener is closed."""
    async with make() as h:
        assert await h.listener.get(h.timing.short) is None
        waiter = asyncio.create_task(h.listener.get(100 * h.timing.patience))
        await asyncio.sleep(h.timing.short)
        assert not waiter.done(), "get() returned early on an empty queue"
        await _close_bounded(h.listener, h.timing)
        with pytest.raises(PipeClosed):
            await asyncio.wait_for(waiter, h.timing.patience)


async def check_listener_close_is_idempotent_and_closes_inner(make: ListenerFactory[T]) -> None:
    """close() twice works, and every leaf under the listener ends up closed."""
    async with make() as h:
        assert await h.listener.get(h.timing.short) is None
        assert h.bottom.opened >= 1, "get() opened no leaf"
        await _close_bounded(h.listener, h.timing)
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.open_leaves() == 0, "close() left an inner pipe open"


async def check_listener_get_after_close_raises_pipe_closed(make: ListenerFactory[T]) -> None:
    """After close(), get raises PipeClosed: before any use, and after use."""
    async with make() as h:
        await _close_bounded(h.listener, h.timing)
        with pytest.raises(PipeClosed):
            await h.listener.get(h.timing.short)
    async with make() as h:
        assert await h.listener.get(h.timing.short) is None
        await _close_bounded(h.listener, h.timing)
        for _ in range(2):
            with pytest.raises(PipeClosed):
                await h.listener.get(h.timing.short)


async def check_listener_cancelled_close_still_closes(make: ListenerFactory[T]) -> None:
    """A close() cancelled at its 1st, 2nd or 3rd suspension still closes the listener and its leaves.

    The listener holds an unsettled delivery, so close() has something to give back.
    """
    for steps in (1, 2, 3):
        async with make() as h:
            await _take(h, 0)
            closing = await _cancelled_close(h.listener, steps)
            await _finish(closing, h.timing)
            with pytest.raises(PipeClosed):
                await h.listener.get(h.timing.short)
            assert await h.bottom.open_leaves() == 0, (
                f"close() cancelled after {steps} step(s) left a leaf open"
            )


async def check_listener_ack_settles(make: ListenerFactory[T]) -> None:
    """An acked delivery is gone: not delivered again, not held by the broker after close."""
    async with make() as h:
        delivery = await _take(h, 0)
        await delivery.ack()
        assert await h.listener.get(h.timing.short + h.timing.settle) is None, "an acked message came back"
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0, "the broker still holds an acked message"


async def check_listener_ack_many_settles(make: ListenerFactory[T]) -> None:
    """Deliveries acked together (``ack_many``, :mod:`truba.pipes.batch`) are gone, each: none
    comes back, the broker holds none after close, and no ack failed."""
    async with make() as h:
        deliveries = [await _take(h, i) for i in range(3)]
        errors = await ack_many(h.listener, deliveries)
        assert errors == [], f"acks failed: {errors}"
        assert await h.listener.get(h.timing.short + h.timing.settle) is None, "an acked message came back"
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0, "the broker still holds an acked message"


async def check_listener_cancel_stops_deliveries_and_keeps_held_ones_settleable(
    make: ListenerFactory[T],
) -> None:
    """After cancel(), nothing new is delivered (get answers None at once), a delivery taken
    before can still be acked, and what arrived later stays with the broker."""
    async with make() as h:
        held = await _take(h, 0)
        await h.listener.cancel()
        await h.listener.cancel()  # idempotent
        await h.bottom.push(h.bottom.message(1))
        began = time.monotonic()
        assert await h.listener.get(h.timing.patience) is None, "a delivery arrived after cancel()"
        assert time.monotonic() - began < h.timing.patience, "get() after cancel() waited its timeout"
        await held.ack()
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 1, "the message pushed after cancel() is not with the broker"


async def check_listener_reject_with_requeue_redelivers(make: ListenerFactory[T]) -> None:
    """reject(requeue=True) brings the message back, marked redelivered."""
    async with make() as h:
        delivery = await _take(h, 0)
        await delivery.reject(requeue=True)
        again = await h.listener.get(h.timing.patience)
        assert again is not None, "a requeued message did not come back"
        assert again.message == delivery.message, "another message came instead of the requeued one"
        assert again.redelivered, "a requeued message came back without redelivered=True"
        await again.ack()
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0


async def check_listener_reject_without_requeue_drops(make: ListenerFactory[T]) -> None:
    """reject(requeue=False) does not bring the message back (it goes to the dead-letter path)."""
    async with make() as h:
        delivery = await _take(h, 0)
        await delivery.reject(requeue=False)
        assert await h.listener.get(h.timing.short + h.timing.settle) is None, "a rejected message came back"
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0, "the broker still holds a message rejected without requeue"


async def check_listener_subscribe_delivers(make: ListenerFactory[T]) -> None:
    """subscribe(callback) hands each delivery to the callback."""
    async with make() as h:
        seen: list[tuple[T, bool]] = []

        async def take(delivery: Delivery[T]) -> None:
            seen.append((delivery.message, delivery.redelivered))
            await delivery.ack()

        h.listener.subscribe(take)
        messages = [h.bottom.message(i) for i in range(2)]
        for message in messages:
            await h.bottom.push(message)
        await _until(lambda: len(seen) >= 2, h.timing, "deliveries reaching the subscribed callback")
        await _settle(h.timing)
        assert sorted(map(repr, seen)) == sorted(repr((m, False)) for m in messages)
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0


async def check_listener_subscribe_callback_error_is_logged_and_requeued(make: ListenerFactory[T]) -> None:
    """A callback that raises: the error is logged (warning or above) and the delivery is requeued,
    so the callback gets it again, redelivered; nothing is lost."""
    async with make() as h:
        seen: list[tuple[T, bool]] = []

        async def fail_once(delivery: Delivery[T]) -> None:
            seen.append((delivery.message, delivery.redelivered))
            if len(seen) == 1:
                raise RuntimeError("callback boom")
            await delivery.ack()

        with _captured_logs() as records:
            h.listener.subscribe(fail_once)
            message = h.bottom.message(0)
            await h.bottom.push(message)
            await _until(lambda: len(seen) >= 1, h.timing, "the delivery reaching the callback")
            await _until(lambda: len(seen) >= 2, h.timing, "the failed delivery coming back (requeued)")
        assert seen[1] == (message, True), seen
        logged = [r for r in records if "callback boom" in repr(vars(r))]
        assert logged, "the callback's error was not logged at warning or above"
        await _close_bounded(h.listener, h.timing)
        assert await h.bottom.backlog() == 0


async def check_listener_broken_stays_broken(make: ListenerFactory[T]) -> None:
    """After a break, get raises PipeBroken (within patience) and keeps raising it."""
    async with make() as h:
        assert not h.reopens, "a reopening listener gets check_listener_reopen_recovers instead"
        assert await h.listener.get(h.timing.short) is None
        await h.bottom.break_()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + h.timing.patience
        while True:
            try:
                delivery = await h.listener.get(h.timing.short)
            except PipeBroken:
                break
            assert delivery is None, "a broken listener handed out a delivery"
            assert loop.time() < deadline, "get did not raise PipeBroken after the break"
        for _ in range(3):
            with pytest.raises(PipeBroken):
                await h.listener.get(h.timing.short)


async def check_listener_reopen_recovers(make: ListenerFactory[T]) -> None:
    """After a break, get raises nothing, and a message pushed after the break is delivered within
    patience; settling a delivery of the dead channel does not raise (the broker requeued it)."""
    async with make() as h:
        assert h.reopens, "check_listener_broken_stays_broken applies instead"
        old = await _take(h, 0)
        await h.bottom.break_()
        fresh = h.bottom.message(1)
        got: list[Delivery[T]] = []

        async def collect() -> None:
            # get goes on calling while the listener reopens (a reopen may start only on a get)
            while not any(d.message == fresh for d in got):
                delivery = await h.listener.get(h.timing.short)
                if delivery is not None:
                    got.append(delivery)

        collector = asyncio.create_task(collect())
        try:
            await h.bottom.push(fresh)
            await asyncio.wait_for(asyncio.shield(collector), h.timing.patience)
        except TimeoutError:
            raise AssertionError(f"no delivery within {h.timing.patience} s of a break") from None
        finally:
            collector.cancel()
        await old.ack()
        for delivery in got:
            await delivery.ack()


LISTENER_CHECKS: Mapping[str, ListenerCheck] = {
    "get_returns_none_after_timeout": check_listener_get_returns_none_after_timeout,
    "blocked_get_wakes_with_pipe_closed_on_close": check_listener_blocked_get_wakes_with_pipe_closed_on_close,
    "close_is_idempotent_and_closes_inner": check_listener_close_is_idempotent_and_closes_inner,
    "get_after_close_raises_pipe_closed": check_listener_get_after_close_raises_pipe_closed,
    "cancelled_close_still_closes": check_listener_cancelled_close_still_closes,
    "ack_settles": check_listener_ack_settles,
    "ack_many_settles": check_listener_ack_many_settles,
    "cancel_stops_deliveries_and_keeps_held_ones_settleable": (
        check_listener_cancel_stops_deliveries_and_keeps_held_ones_settleable
    ),
    "reject_with_requeue_redelivers": check_listener_reject_with_requeue_redelivers,
    "reject_without_requeue_drops": check_listener_reject_without_requeue_drops,
    "subscribe_delivers": check_listener_subscribe_delivers,
    "subscribe_callback_error_is_logged_and_requeued": (
        check_listener_subscribe_callback_error_is_logged_and_requeued
    ),
}
LISTENER_BREAK_CHECKS: Mapping[str, ListenerCheck] = {
    "broken_stays_broken": check_listener_broken_stays_broken
}
LISTENER_REOPEN_CHECKS: Mapping[str, ListenerCheck] = {"reopen_recovers": check_listener_reopen_recovers}


def listener_checks(*, reopens: bool) -> dict[str, ListenerCheck]:
    """The checks a listener must pass: every common one, and the break check that fits it."""
    return {**LISTENER_CHECKS, **(LISTENER_REOPEN_CHECKS if reopens else LISTENER_BREAK_CHECKS)}


async def check_listener(make: ListenerFactory[T], *, reopens: bool = False) -> None:
    """Runs every listener check on ``make``."""
    for check in listener_checks(reopens=reopens).values():
        await check(make)


# -- bottoms made of fakes -------------------------------------------------------------------------


class FakeSenderBottom(Generic[T, B]):
    """FakeSender leaves under a sender stack; ``T`` is what the stack takes, ``B`` what leaves see.

    Build the stack over ``leaf()`` (once per leaf), or hand ``connect`` to a reopen wrapper.
    ``to_leaf`` maps a message to its leaf form (e.g. a codec's ``encode``). Without
    ``partial_confirms`` the bottom releases its held confirms only all at once: for a stack whose
    leaves see other messages than it takes (frames of several), which it cannot confirm one by one.
    """

    def __init__(
        self,
        message: Callable[[int], T],
        to_leaf: Callable[[T], B],
        *,
        rejecting: bool = False,
        partial_confirms: bool = True,
    ) -> None:
        self.partial_confirms = partial_confirms
        self.leaves: list[FakeSender[B]] = []
        self._message = message
        self._to_leaf = to_leaf
        self._rejecting = rejecting
        self._held = False
        self._broken: set[int] = set()
        self._order: dict[B, int] = {}

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> T:
        message = self._message(i)
        self._order[self._to_leaf(message)] = i
        return message

    def leaf(self) -> FakeSender[B]:
        """A fresh leaf that confirms at once unless the bottom holds (or rejects)."""
        leaf = FakeSender[B](auto_confirm=not (self._held or self._rejecting))
        self.leaves.append(leaf)
        return leaf

    async def connect(self) -> FakeSender[B]:
        """A connector for reopen wrappers."""
        return self.leaf()

    def _live(self) -> list[FakeSender[B]]:
        return [leaf for leaf in self.leaves if not leaf.closed and id(leaf) not in self._broken]

    async def hold(self) -> None:
        self._held = True
        for leaf in self.leaves:
            leaf.auto_confirm = False

    async def release(self, count: int | None = None) -> None:
        live = self._live()
        if self._rejecting:
            for leaf in live:
                leaf.reject(len(leaf.unconfirmed()))
            return
        if not self.partial_confirms:
            assert count is None, "this bottom confirms its held messages only all at once"
            for leaf in live:  # what a leaf holds may be frames: no message order to follow
                leaf.confirm()
        else:
            # Oldest first across leaves: message i was sent before message i + 1.
            held = sorted(
                ((self._order[m], m, leaf) for leaf in live for m in leaf.unconfirmed()), key=lambda e: e[0]
            )
            for _, message, leaf in held[:count]:
                assert leaf.unconfirmed()[0] == message, "the fake broker confirms in send order only"
                leaf.confirm(1)
        if count is None:
            self._held = False
            for leaf in self.leaves:
                leaf.auto_confirm = True

    async def break_(self) -> None:
        for leaf in self._live():
            leaf.break_(PipeBroken("fake connection lost"))
            self._broken.add(id(leaf))

    async def open_leaves(self) -> int:
        return sum(not leaf.closed for leaf in self.leaves)


class FakeListenerBottom(Generic[T, B]):
    """FakeListener leaves under a listener stack; pushes go round-robin over the open leaves."""

    def __init__(self, message: Callable[[int], T], to_leaf: Callable[[T], B], timing: Timing = UNIT) -> None:
        self.leaves: list[FakeListener[B]] = []
        self._message = message
        self._to_leaf = to_leaf
        self._timing = timing
        self._pushed = 0

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> T:
        return self._message(i)

    def leaf(self) -> FakeListener[B]:
        leaf = FakeListener[B]()
        self.leaves.append(leaf)
        return leaf

    async def connect(self) -> FakeListener[B]:
        """A connector for reopen wrappers."""
        return self.leaf()

    def _live(self) -> list[FakeListener[B]]:
        return [leaf for leaf in self.leaves if not leaf.closed and leaf.broken is None]

    async def push(self, message: T) -> None:
        await _until(lambda: bool(self._live()), self._timing, "an open leaf to deliver to")
        live = self._live()
        live[self._pushed % len(live)].push(self._to_leaf(message))
        self._pushed += 1

    async def break_(self) -> None:
        for leaf in self._live():
            leaf.close_from_remote(PipeBroken("fake channel closed by the broker"))

    async def open_leaves(self) -> int:
        return sum(not leaf.closed for leaf in self.leaves)

    async def backlog(self) -> int:
        settled = sum(len(leaf.acked) for leaf in self.leaves)
        dead = sum(1 for leaf in self.leaves for _, requeue in leaf.rejected if not requeue)
        return self._pushed - settled - dead
