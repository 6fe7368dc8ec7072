from __future__ import annotations

import pytest

from truba.daemon.attempts import LOST, Verdict, admit, after_failure, deaths
from truba.wire import TaskMessage


@pytest.mark.parametrize(
    ("redelivered", "headers", "expected"),
    [
        (False, {}, (0, False)),
        (True, {}, (1, False)),  # classic: at least one death, not how many
        (True, {"x-delivery-count": 3}, (3, True)),  # quorum: exact
        (False, {"x-delivery-count": 0}, (0, True)),
        (True, {"x-delivery-count": "3"}, (1, False)),  # foreign junk: fall back to the flag
        (True, {"x-delivery-count": True}, (1, False)),
    ],
)
def test_deaths_read_from_a_delivery(redelivered: bool, headers: dict[str, object], expected: object) -> None:
    assert deaths(redelivered, headers) == expected


def test_a_fresh_task_runs_with_nothing_spent() -> None:
    assert admit(TaskMessage("t", None), False, {}, 3).verdict is Verdict.RUN
    assert admit(TaskMessage("t", None, attempts=2), False, {}, 3).spent == 2


def test_classic_redeliveries_are_recounted_and_quorum_ones_run_at_once() -> None:
    classic = admit(TaskMessage("t", None, attempts=1), True, {}, 3)
    assert (classic.verdict, classic.spent, classic.error) == (Verdict.RECOUNT, 2, LOST)
    quorum = admit(TaskMessage("t", None), True, {"x-delivery-count": 2}, 3)
    assert (quorum.verdict, quorum.spent) == (Verdict.RUN, 2)


def test_tasks_with_every_attempt_spent_are_given_up() -> None:
    lost = admit(TaskMessage("t", None, attempts=2), True, {}, 3)
    assert (lost.verdict, lost.spent, lost.error) == (Verdict.GIVE_UP, 3, LOST)
    exhausted = admit(TaskMessage("t", None, attempts=5), False, {}, 3)
    assert exhausted.verdict is Verdict.GIVE_UP and exhausted.error is not None
    assert exhausted.error.type == "AttemptsExhausted"
    assert admit(TaskMessage("t", None), True, {"x-delivery-count": 1}, 1).verdict is Verdict.GIVE_UP


def test_after_a_failure_the_count_grows_until_the_limit() -> None:
    assert after_failure(0, 3) == (False, 1)
    assert after_failure(1, 3) == (False, 2)
    assert after_failure(2, 3) == (True, 3)
    assert after_failure(0, 1) == (True, 1)
