from __future__ import annotations

import logging

import pytest

from truba.backoff import Backoff
from truba.pipes.errors import CodecError, PipeBroken
from truba.pipes.retry import RetrySender
from truba.pipes.testing import FakeSender


class Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


class Flaky(FakeSender[str]):
    def __init__(self, failures: list[Exception]) -> None:
        super().__init__(auto_confirm=True)
        self.failures = failures

    async def send(self, message: str):  # type: ignore[no-untyped-def]
        if self.failures:
            raise self.failures.pop(0)
        return await super().send(message)


async def test_retry_resends_retryable_errors_with_backoff() -> None:
    sleeps = Sleeps()
    inner = Flaky([PipeBroken("a"), PipeBroken("b")])
    sender = RetrySender(inner, Backoff(attempts=5, base=1.0, cap=8.0, sleep=sleeps, rng=lambda lo, hi: hi))
    await sender.send("m")
    assert inner.sent == ["m"] and sleeps.slept == [1.0, 2.0]


async def test_retry_gives_up_after_budget_and_reraises_last_cause() -> None:
    causes = [PipeBroken("1"), PipeBroken("2"), PipeBroken("3")]
    sender = RetrySender(Flaky(list(causes)), Backoff(attempts=3, sleep=Sleeps()))
    with pytest.raises(PipeBroken) as raised:
        await sender.send("m")
    assert raised.value is causes[2]


async def test_retry_never_retries_non_retryable_errors() -> None:
    sleeps = Sleeps()
    poison = CodecError("bad")
    sender = RetrySender(Flaky([poison]), Backoff(attempts=5, sleep=sleeps))
    with pytest.raises(CodecError) as raised:
        await sender.send("m")
    assert raised.value is poison and sleeps.slept == []


def test_backoff_is_jittered_and_capped() -> None:
    upper = Backoff(base=0.1, cap=1.0, rng=lambda lo, hi: hi)
    assert [upper.delay(a) for a in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert Backoff(attempts=None).gives_up_after(10**6) is False


async def test_a_long_outage_is_one_retry_warning_not_one_per_try(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="truba.pipes.retry")
    inner = Flaky([PipeBroken(str(n)) for n in range(5)])
    await RetrySender(inner, Backoff(attempts=10, sleep=Sleeps())).send("m")
    levels = [r.levelno for r in caplog.records if r.getMessage() == "pipe.retry"]
    assert levels == [logging.WARNING] + [logging.DEBUG] * 4
