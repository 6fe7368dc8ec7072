"""Job options as the SDK spells them, and their ``truba.v1.JobSettings`` form."""

from __future__ import annotations

import math
from typing import Any

import pytest

from truba.client.errors import InvalidArgument
from truba.client.options import check_importance, exception_name, settings_pb
from truba.proto.v1 import common_pb2


def test_frames_are_on_by_default() -> None:
    assert settings_pb().no_frames is False
    assert settings_pb(frames=True).no_frames is False


def test_frames_false_sets_no_frames() -> None:
    message = settings_pb(frames=False, queue_type="classic", priorities=True)
    assert message == common_pb2.JobSettings(
        preemption=common_pb2.PREEMPTION_GRACEFUL,
        queue_type=common_pb2.QUEUE_TYPE_CLASSIC,
        priorities=True,
        no_frames=True,
    )


@pytest.mark.parametrize("value", [0, 1, "false", None])
def test_frames_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ValueError, match="frames: must be True or False"):
        settings_pb(frames=value)


def test_misspelt_options_task_timout_and_max_attempt_raise_naming_the_right_ones() -> None:
    # Given the misspellings a user made, which ran silently with the defaults before
    with pytest.raises(TypeError, match=r"unknown option 'task_timout'; did you mean 'task_timeout'\?"):
        settings_pb(task_timout=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"unknown option 'max_attempt'; did you mean 'max_attempts'\?"):
        settings_pb(max_attempt=1)  # type: ignore[call-arg]


def test_an_option_like_nothing_known_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match="unknown option 'zzz'; valid options: backoff, codec, frames"):
        settings_pb(zzz=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts: must be at least 1, got 0"),
        ({"max_slots": 0}, "max_slots: must be at least 1, got 0"),
        ({"min_slots": -1}, "min_slots: must be at least 0, got -1"),
        ({"min_slots": 5, "max_slots": 2}, "max_slots: must be at least min_slots=5, got 2"),
        ({"max_attempts": 2.5}, "max_attempts: must be an int, got 2.5"),
        ({"max_slots": True}, "max_slots: must be an int, got True"),
        ({"task_timeout": 0}, "task_timeout: must be a finite number > 0, got 0"),
        ({"task_timeout": "1"}, "task_timeout: must be a number of seconds, got '1'"),
        ({"preemption": "now"}, "preemption: must be one of"),
        ({"preemption_grace": 0}, "preemption_grace: must be a finite number > 0, got 0"),
        ({"preemption": "immediate", "preemption_grace": 5}, "preemption_grace: bounds graceful preemption"),
        ({"codec": "json"}, "codec: must be one of"),
        ({"retry_on": ValueError}, "retry_on: must be a sequence"),
        ({"retry_on": [42]}, "retry_on: must list exception classes"),
        ({"retry_on": ["not a name"]}, "retry_on: a name must look like"),
        ({"backoff": (2, 1)}, "backoff: max must be at least initial"),
        ({"backoff": 1}, r"backoff: must be \(initial, max\)"),
    ],
)
def test_every_limit_is_an_invalid_argument_naming_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings_pb(**options)


def test_max_attempts_0_is_refused_not_turned_into_3() -> None:
    with pytest.raises(InvalidArgument, match="max_attempts: must be at least 1, got 0"):
        settings_pb(max_attempts=0)


def test_max_slots_0_is_refused_and_none_means_no_limit_on_the_wire() -> None:
    with pytest.raises(InvalidArgument, match="max_slots: must be at least 1, got 0"):
        settings_pb(max_slots=0)
    assert not settings_pb(max_slots=None).HasField("max_slots")
    assert not settings_pb().HasField("max_attempts")
    assert settings_pb(max_slots=3, max_attempts=1).max_slots == 3


@pytest.mark.parametrize(
    ("importance", "shown"), [(None, "None"), ("high", "'high'"), (0, "0"), (math.nan, "nan"), (True, "True")]
)
def test_importance_none_or_high_is_an_invalid_argument_showing_what_was_given(
    importance: object, shown: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"importance: must be a finite number > 0, got {shown}"):
        check_importance(importance)


class Busy(Exception):
    pass


def test_retry_on_sends_classes_and_names_as_names_builtins_bare() -> None:
    message = settings_pb(
        retry_on=(TimeoutError, Busy, "mypkg.errors.Busy", "builtins.KeyError"), backoff=(0.5, 8)
    )
    assert list(message.retry_on) == [
        "TimeoutError",
        "tests.unit.client.test_options.Busy",
        "mypkg.errors.Busy",
        "KeyError",
    ]
    assert (message.backoff_initial, message.backoff_max) == (0.5, 8.0)


def test_retry_on_refuses_a_class_defined_in_a_function() -> None:
    class Local(Exception):
        pass

    with pytest.raises(InvalidArgument, match="defined in a function"):
        exception_name(Local)


def test_codec_pickle_travels_as_pickle() -> None:
    assert settings_pb(codec="pickle").codec == "pickle"
    assert settings_pb(codec="msgpack").codec == ""
