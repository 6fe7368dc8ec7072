"""When schedules are due, and which timings are refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from truba.scheduler.errors import InvalidArgument
from truba.scheduler.schedule_model import Schedule, check_timing, first_due, may_fire, next_due, resumed_due

T0 = datetime(2026, 11, 26, 8, 1, 30, tzinfo=UTC).timestamp()
SCHEDULE = Schedule("s", "m:f", "j", 1.0, "", b"", 0.5, 1.0, T0, T0)


@pytest.mark.parametrize(
    ("every", "cron", "deadline", "field"),
    [
        (0.0, "", 0.0, "every"),
        (1.0, "* * * * *", 0.0, "every"),
        (0.05, "", 0.0, "every"),
        (-1.0, "", 0.0, "every"),
        (float("nan"), "", 0.0, "every"),
        (0.0, "61 * * * *", 0.0, "cron"),
        (0.0, "* * * *", 0.0, "cron"),
        (0.0, "every minute", 0.0, "cron"),
        (1.0, "", 1.5, "deadline"),
        (1.0, "", -1.0, "deadline"),
        (0.0, "*/5 * * * *", 301.0, "deadline"),
        (3600.0, "", 3600.0, "deadline"),  # above the consumer timeout of 1800 s
    ],
)
def test_bad_timings_are_refused_naming_their_field(
    every: float, cron: str, deadline: float, field: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_timing(every, cron, deadline, max_deadline=1800.0)
    assert refused.value.field == field


def test_a_missing_deadline_is_the_period() -> None:
    assert check_timing(1.0, "", 0.0, max_deadline=1800.0) == (1.0, "", 1.0)
    assert check_timing(0.0, " */5 * * * * ", 0.0, max_deadline=1800.0) == (0.0, "*/5 * * * *", 300.0)
    assert check_timing(7200.0, "", 0.0, max_deadline=1800.0)[2] == 1800.0


def test_every_keeps_its_phase_and_skips_missed_times() -> None:
    assert first_due(1.0, "", T0) == T0
    assert next_due(SCHEDULE, T0, T0 + 0.03) == T0 + 1
    assert next_due(SCHEDULE, T0, T0 + 3.4) == T0 + 4
    paused = replace(SCHEDULE, next_due=T0 + 1)
    assert resumed_due(paused, T0 + 5.5) == T0 + 6
    assert resumed_due(paused, T0 + 0.5) == T0 + 1


def test_cron_times_are_the_expression_s_in_utc() -> None:
    five = replace(SCHEDULE, every=0.0, cron="*/5 * * * *")
    assert first_due(0.0, "*/5 * * * *", T0) == datetime(2026, 11, 26, 8, 5, tzinfo=UTC).timestamp()
    due = datetime(2026, 11, 26, 8, 5, tzinfo=UTC).timestamp()
    assert next_due(five, due, due + 0.1) == due + 300


def test_a_schedule_may_fire_when_due_active_and_not_held() -> None:
    assert may_fire(SCHEDULE, T0)
    assert not may_fire(SCHEDULE, T0 - 0.001)
    assert not may_fire(replace(SCHEDULE, lease_until=T0 + 1), T0 + 0.5)
    assert may_fire(replace(SCHEDULE, lease_until=T0 + 1), T0 + 1)
