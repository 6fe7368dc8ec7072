"""Job options as the SDK spells them, and their ``truba.v1.JobSettings`` form."""

from __future__ import annotations

from typing import Any

import pytest

from truba.client.options import settings_pb
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
    with pytest.raises(ValueError, match="^frames: must be True or False"):
        settings_pb(frames=value)
