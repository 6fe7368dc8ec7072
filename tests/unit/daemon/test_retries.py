"""Which handler errors a job retries, and how long each retry waits."""

from __future__ import annotations

from truba.daemon.retries import retries_on, retry_delay
from truba.daemon.settings import JobSettings

SETTINGS = JobSettings(max_attempts=3, retry_on=frozenset({"OSError", "mypkg.errors.Busy"}))


def test_a_subclass_of_a_listed_exception_is_retried_while_attempts_are_left() -> None:
    assert retries_on(["ConnectionError", "OSError", "Exception", "BaseException"], SETTINGS, 1)
    assert retries_on(["mypkg.errors.Busy", "Exception"], SETTINGS, 2)
    assert not retries_on(["mypkg.errors.Busy", "Exception"], SETTINGS, 3)  # the last attempt


def test_other_exceptions_and_jobs_without_retry_on_are_not_retried() -> None:
    assert not retries_on(["ValueError", "Exception"], SETTINGS, 1)
    assert not retries_on(["OSError"], JobSettings(max_attempts=3), 1)


def test_the_backoff_doubles_per_attempt_up_to_its_cap_with_half_of_it_jittered() -> None:
    longest = lambda low, high: high  # noqa: E731
    shortest = lambda low, high: low  # noqa: E731
    assert [retry_delay(n, (1.0, 5.0), longest) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert [retry_delay(n, (1.0, 5.0), shortest) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 2.5]
