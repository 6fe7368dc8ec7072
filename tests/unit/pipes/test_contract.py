"""The contract suite (``contract.py``) on the fakes and on every layer wrapped around fakes.

Each test is one (implementation, contract point). A known violation is marked, for that single
pair, ``xfail(strict=True)`` with what goes wrong, so the suite stays green while the bug stays
visible (and the mark must go once the bug is fixed). A check that does not apply to an
implementation by design is skipped for that pair, with why (``*_NOT_APPLICABLE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.unit.pipes.contract import (
    UNIT,
    FakeListenerBottom,
    FakeSenderBottom,
    ListenerCheck,
    ListenerFactory,
    ListenerHarness,
    SenderCheck,
    SenderFactory,
    SenderHarness,
    listener_checks,
    sender_checks,
)
from truba.backoff import Backoff
from truba.pipes.balance import BalanceSender
from truba.pipes.base import Listener, Sender
from truba.pipes.errors import PipeError
from truba.pipes.frame import FrameSender
from truba.pipes.frame_format import pack
from truba.pipes.frame_limits import FrameLimits
from truba.pipes.frame_listener import FrameListener
from truba.pipes.log import LogListener, LogSender
from truba.pipes.merge import MergeListener
from truba.pipes.reopen import ReopenSender
from truba.pipes.reopen_listener import ReopenListener
from truba.pipes.retry import RetryListener, RetrySender
from truba.pipes.route import RouteSender
from truba.pipes.serialize import DeserializeListener, SerializeSender
from truba.pipes.spool import spool
from truba.pipes.testing import FakeListener
from truba.wire import TaskCodec, TaskMessage

T = TypeVar("T")
B = TypeVar("B")


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


QUICK = Backoff(attempts=3, sleep=_no_sleep)  # retry layers: give up fast, never really sleep
FAST = Backoff(attempts=None, sleep=_no_sleep)  # reopen: reconnect at once
CODEC = TaskCodec()


def _text(i: int) -> str:
    return f"m{i}"


def _task(i: int) -> TaskMessage:
    return TaskMessage(f"t{i}", [i, "payload"])


def _bytes(i: int) -> bytes:
    return f"m{i}".encode()


def _same(message: T) -> T:
    return message


async def _close_quietly(pipe: Sender[Any] | Listener[Any]) -> None:
    with contextlib.suppress(PipeError, TimeoutError):
        await asyncio.wait_for(pipe.close(), 1.0)


# -- senders ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SenderImpl:
    """A sender stack over fake leaves; ``factory(tmp_path)`` makes its harness factory."""

    name: str
    factory: Callable[[Path], SenderFactory[Any]]
    reopens: bool = False


def _senders(
    message: Callable[[int], T],
    to_leaf: Callable[[T], B],
    build: Callable[[FakeSenderBottom[T, B], Path], Sender[T]],
    *,
    reopens: bool = False,
    partial: bool = True,
) -> Callable[[Path], SenderFactory[T]]:
    def factory(tmp_path: Path) -> SenderFactory[T]:
        @contextlib.asynccontextmanager
        async def make(*, rejecting: bool = False) -> AsyncIterator[SenderHarness[T]]:
            bottom = FakeSenderBottom(message, to_leaf, rejecting=rejecting, partial_confirms=partial)
            sender = build(bottom, Path(tempfile.mkdtemp(dir=tmp_path)))
            try:
                yield SenderHarness(sender, bottom, UNIT, reopens=reopens)
            finally:
                await _close_quietly(sender)

        return make

    return factory


def _fake(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
    return b.leaf()


def _serialize(b: FakeSenderBottom[TaskMessage, bytes], _: Path) -> Sender[TaskMessage]:
    return SerializeSender(b.leaf(), CODEC)


def _retry(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
    return RetrySender(b.leaf(), QUICK)


def _log(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
    return LogSender(b.leaf())


def _balance(count: int) -> Callable[[FakeSenderBottom[str, str], Path], Sender[str]]:
    def build(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
        return BalanceSender([b.leaf() for _ in range(count)], rng=random.Random(7))

    return build


def _reopen(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
    return ReopenSender(b.connect, label="contract", backoff=FAST)


def _spool(b: FakeSenderBottom[bytes, bytes], directory: Path) -> Sender[bytes]:
    return spool(directory)(b.leaf())


def _frame(b: FakeSenderBottom[bytes, bytes], _: Path) -> Sender[bytes]:
    # Default limits: a message sent while one is in flight is gathered for up to 5 ms, so the
    # checks see lone messages, gathered ones (not at the broker yet) and frames of several.
    return FrameSender(b.leaf(), FrameLimits())


def _frame_shared(b: FakeSenderBottom[bytes, bytes], _: Path) -> Sender[bytes]:
    # The client's task leaf: a frame's members share one confirmation object.
    return FrameSender(b.leaf(), FrameLimits(), share_confirmations=True)


def _balance_frames(b: FakeSenderBottom[bytes, bytes], _: Path) -> Sender[bytes]:
    # The production shape over two brokers: a frame sender per leaf, under balance.
    return BalanceSender([FrameSender(b.leaf(), FrameLimits()) for _ in range(2)], rng=random.Random(7))


def _balance_frames_shared(b: FakeSenderBottom[bytes, bytes], _: Path) -> Sender[bytes]:
    # The client's task stack over two brokers: shared confirmations under balance.
    return BalanceSender(
        [FrameSender(b.leaf(), FrameLimits(), share_confirmations=True) for _ in range(2)],
        rng=random.Random(7),
    )


def _route(key: Callable[[int], int]) -> Callable[[FakeSenderBottom[str, str], Path], Sender[str]]:
    """A leaf per key; message ``m<i>`` goes by key ``key(i)``."""

    def build(b: FakeSenderBottom[str, str], _: Path) -> Sender[str]:
        return RouteSender(lambda message: key(int(message[1:])), lambda _: b.leaf())

    return build


ROUTE_ORDER = (
    "by design, RouteSender.unconfirmed() lists oldest first per key, key after key: its routes are "
    "independent streams (one per AMQP priority level, which the broker reorders anyway), and one "
    "order over all would cost a stamp per message; route-2-apart runs this check over two routes"
)


SENDERS = [
    SenderImpl("fake", _senders(_text, _same, _fake)),
    SenderImpl("serialize", _senders(_task, CODEC.encode, _serialize)),
    SenderImpl("retry", _senders(_text, _same, _retry)),
    SenderImpl("log", _senders(_text, _same, _log)),
    SenderImpl("balance-1", _senders(_text, _same, _balance(1))),
    SenderImpl("balance-2", _senders(_text, _same, _balance(2))),
    SenderImpl("reopen", _senders(_text, _same, _reopen, reopens=True), reopens=True),
    SenderImpl("spool", _senders(_bytes, _same, _spool)),
    # Frames: the bottom cannot confirm some members of a frame and not others, nor messages
    # still gathered (they are not at the broker yet): it releases confirms all at once.
    SenderImpl("frame", _senders(_bytes, _same, _frame, partial=False)),
    SenderImpl("frame-shared", _senders(_bytes, _same, _frame_shared, partial=False)),
    SenderImpl("balance-frame-2", _senders(_bytes, _same, _balance_frames, partial=False)),
    SenderImpl("balance-frame-shared-2", _senders(_bytes, _same, _balance_frames_shared, partial=False)),
    SenderImpl("route-1", _senders(_text, _same, _route(lambda i: 0))),
    SenderImpl("route-2", _senders(_text, _same, _route(lambda i: i % 2))),  # keys alternate
    # The warm-up message m0 on a route of its own, every later one on another.
    SenderImpl("route-2-apart", _senders(_text, _same, _route(lambda i: min(i, 1)))),
]

# Known violations, (implementation, check) -> what goes wrong; empty now that all are fixed.
SENDER_XFAIL: dict[tuple[str, str], str] = {}

# Checks that do not apply to an implementation by design, (implementation, check) -> why (skipped).
SENDER_NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("route-2", "drop_unconfirmed_empties_unconfirmed"): ROUTE_ORDER,
    ("route-2", "broken_stays_broken"): ROUTE_ORDER,
    ("route-2", "send_many_takes_a_prefix_in_order"): ROUTE_ORDER,
}


def _sender_cases() -> list[Any]:
    cases = []
    for impl in SENDERS:
        for name, check in sender_checks(reopens=impl.reopens).items():
            reason = SENDER_XFAIL.get((impl.name, name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if (why := SENDER_NOT_APPLICABLE.get((impl.name, name))) is not None:
                marks.append(pytest.mark.skip(reason=why))
            cases.append(pytest.param(impl, check, id=f"{impl.name}-{name}", marks=marks))
    return cases


@pytest.mark.parametrize(("impl", "check"), _sender_cases())
async def test_sender_contract(impl: SenderImpl, check: SenderCheck, tmp_path: Path) -> None:
    await check(impl.factory(tmp_path))


# -- listeners -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListenerImpl:
    """A listener stack over fake leaves."""

    name: str
    factory: ListenerFactory[Any]
    reopens: bool = False


def _listeners(
    message: Callable[[int], T],
    to_leaf: Callable[[T], B],
    build: Callable[[FakeListenerBottom[T, B]], Listener[T]],
    *,
    reopens: bool = False,
) -> ListenerFactory[T]:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[ListenerHarness[T]]:
        bottom = FakeListenerBottom(message, to_leaf, UNIT)
        listener = build(bottom)
        try:
            yield ListenerHarness(listener, bottom, UNIT, reopens=reopens)
        finally:
            await _close_quietly(listener)

    return make


def _fake_listener(b: FakeListenerBottom[str, str]) -> Listener[str]:
    leaf: FakeListener[str] = b.leaf()
    return leaf


def _deserialize(b: FakeListenerBottom[TaskMessage, bytes]) -> Listener[TaskMessage]:
    return DeserializeListener(b.leaf(), CODEC)


def _retry_listener(b: FakeListenerBottom[str, str]) -> Listener[str]:
    return RetryListener(b.leaf(), QUICK)


def _log_listener(b: FakeListenerBottom[str, str]) -> Listener[str]:
    return LogListener(b.leaf())


def _merge(count: int) -> Callable[[FakeListenerBottom[str, str]], Listener[str]]:
    def build(b: FakeListenerBottom[str, str]) -> Listener[str]:
        return MergeListener([b.leaf() for _ in range(count)])

    return build


def _reopen_listener(b: FakeListenerBottom[str, str]) -> Listener[str]:
    return ReopenListener(b.connect, label="contract", backoff=FAST)


def _unframe(b: FakeListenerBottom[bytes, bytes]) -> Listener[bytes]:
    return FrameListener(b.leaf())


def _framed(message: bytes) -> bytes:
    """A frame of one member: the listener hands it out as a member of its frame."""
    return pack([message])


LISTENERS = [
    ListenerImpl("fake", _listeners(_text, _same, _fake_listener)),
    ListenerImpl("deserialize", _listeners(_task, CODEC.encode, _deserialize)),
    ListenerImpl("retry", _listeners(_text, _same, _retry_listener)),
    ListenerImpl("log", _listeners(_text, _same, _log_listener)),
    ListenerImpl("merge-1", _listeners(_text, _same, _merge(1))),
    ListenerImpl("merge-2", _listeners(_text, _same, _merge(2))),
    ListenerImpl("reopen", _listeners(_text, _same, _reopen_listener, reopens=True), reopens=True),
    ListenerImpl("unframe-lone", _listeners(_bytes, _same, _unframe)),  # lone messages pass through
    ListenerImpl("unframe", _listeners(_bytes, _framed, _unframe)),  # members of frames
]

LISTENER_XFAIL: dict[tuple[str, str], str] = {}


def _listener_cases() -> list[Any]:
    cases = []
    for impl in LISTENERS:
        for name, check in listener_checks(reopens=impl.reopens).items():
            reason = LISTENER_XFAIL.get((impl.name, name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(impl, check, id=f"{impl.name}-{name}", marks=marks))
    return cases


@pytest.mark.parametrize(("impl", "check"), _listener_cases())
async def test_listener_contract(impl: ListenerImpl, check: ListenerCheck) -> None:
    await check(impl.factory)
