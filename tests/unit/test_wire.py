from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from truba.pipes.errors import CodecError
from truba.wire import (
    ErrorInfo,
    GaveUpCodec,
    GaveUpRecord,
    ResultCodec,
    ResultMessage,
    TaskCodec,
    TaskMessage,
    encode_task,
)

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)


@given(st.text(min_size=1, max_size=20), values)
def test_task_codec_round_trips(task_id: str, payload: object) -> None:
    message = TaskMessage(task_id, payload)
    assert TaskCodec().decode(TaskCodec().encode(message)) == message


@given(st.text(max_size=10), values)
def test_result_codec_round_trips_values(task_id: str, value: object) -> None:
    message = ResultMessage(task_id, True, value, None, "d1", 0.5)
    assert ResultCodec().decode(ResultCodec().encode(message)) == message


def test_result_codec_round_trips_errors() -> None:
    message = ResultMessage("t", False, None, ErrorInfo("ValueError", "bad", "Traceback..."), "d", 1.0)
    assert ResultCodec().decode(ResultCodec().encode(message)) == message


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"not msgpack at all \xff\xfe", b"\x93\x02\xa1x\x01", b"\x92\x01\x05", b"\xa5hello"],
)
def test_garbage_is_a_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        TaskCodec().decode(data)
    with pytest.raises(CodecError):
        ResultCodec().decode(data)


@given(st.text(min_size=1, max_size=20), values, st.integers(0, 1000))
def test_task_attempts_round_trip(task_id: str, payload: object, attempts: int) -> None:
    message = TaskMessage(task_id, payload, attempts)
    assert TaskCodec().decode(TaskCodec().encode(message)) == message


def test_fresh_tasks_and_first_results_keep_the_original_format() -> None:
    """Readers without extras (older daemons and clients) read what they always read."""
    assert msgpack.unpackb(TaskCodec().encode(TaskMessage("t", 5))) == [1, "t", 5]
    first = ResultCodec().encode(ResultMessage("t", True, 25, None, "d", 0.5))
    assert msgpack.unpackb(first) == [1, "t", True, 25, "d", 0.5]


def test_old_messages_decode_with_defaults() -> None:
    assert TaskCodec().decode(msgpack.packb([1, "t", {"x": 1}])) == TaskMessage("t", {"x": 1}, 0)
    old = ResultCodec().decode(msgpack.packb([1, "t", False, ["E", "m", "tb"], "d", 1.0]))
    assert (old.attempts, old.gave_up, old.error) == (1, False, ErrorInfo("E", "m", "tb"))


def test_unknown_extras_and_trailing_fields_are_ignored() -> None:
    task = msgpack.packb([1, "t", None, {"attempts": 2, "future": "x"}, "more", 7])
    assert TaskCodec().decode(task) == TaskMessage("t", None, 2)
    result = msgpack.packb([1, "t", True, 1, "d", 0.1, {"gave_up": False, "future": 1}, "more"])
    assert ResultCodec().decode(result) == ResultMessage("t", True, 1, None, "d", 0.1)


def test_give_ups_round_trip() -> None:
    message = ResultMessage("t", False, None, ErrorInfo("TaskTimeout", "too slow"), "d", 0.0, 3, True)
    assert ResultCodec().decode(ResultCodec().encode(message)) == message
    record = GaveUpRecord("t", 3, ErrorInfo("TaskTimeout", "too slow", ""), "d", b"\x93\x01\xa1t\xc0")
    assert GaveUpCodec().decode(GaveUpCodec().encode(record)) == record
    assert msgpack.unpackb(GaveUpCodec().encode(record))["kind"] == "gave_up"


@pytest.mark.parametrize(
    "fields",
    [[1, "t", None, "not a map"], [1, "t", None, {"attempts": -1}], [1, "t", None, {"attempts": "2"}]],
)
def test_bad_task_extras_are_codec_errors(fields: list[object]) -> None:
    with pytest.raises(CodecError):
        TaskCodec().decode(msgpack.packb(fields))


@pytest.mark.parametrize(
    "fields",
    [
        [1, "t", True, 1, "d", 0.1, []],
        [1, "t", True, 1, "d", 0.1, {"gave_up": 1}],
        [1, "t", True, 1, "d", 0.1, {"attempts": True}],
        [1, "t", True, 1, "d", "slow"],
    ],
)
def test_bad_result_extras_are_codec_errors(fields: list[object]) -> None:
    with pytest.raises(CodecError):
        ResultCodec().decode(msgpack.packb(fields))
    with pytest.raises(CodecError):
        GaveUpCodec().decode(msgpack.packb(fields))


def test_a_give_up_reaches_the_client_as_an_outcome_that_raises_task_gave_up() -> None:
    from truba.client.outcome import Outcome, TaskFailed, TaskGaveUp

    error = ErrorInfo("TaskTimeout", "the attempt ran longer than 1 s")
    wire = ResultCodec().encode(ResultMessage("t", False, None, error, "d", 0.0, 3, True))
    outcome = Outcome.from_message(ResultCodec().decode(wire))
    assert (outcome.gave_up, outcome.attempts, outcome.ok) == (True, 3, False)
    with pytest.raises(TaskGaveUp, match="gave up after 3 attempts: TaskTimeout") as raised:
        outcome.result()
    assert isinstance(raised.value, TaskFailed) and raised.value.attempts == 3
    plain = Outcome.from_message(ResultMessage("u", False, None, ErrorInfo("ValueError", "x"), "d", 0.1))
    with pytest.raises(TaskFailed) as failed:
        plain.result()
    assert not isinstance(failed.value, TaskGaveUp) and plain.attempts == 1


def test_a_task_priority_travels_in_the_extras_and_defaults_to_zero() -> None:
    codec = TaskCodec()
    task = TaskMessage("t", [1], attempts=2, priority=7)
    assert codec.decode(codec.encode(task)) == task
    plain = TaskMessage("t", [1])
    assert codec.decode(codec.encode(plain)).priority == 0
    assert len(codec.encode(plain)) < len(codec.encode(TaskMessage("t", [1], priority=1)))


@pytest.mark.parametrize(
    "message",
    [
        TaskMessage("t-1", None),
        TaskMessage("t-2", {"x": [1, 2]}, priority=3),
        TaskMessage("t-3", b"raw", attempts=2, priority=9, not_before=1.5, expires=9.25, copy_id=77),
    ],
)
def test_encode_task_gives_the_bytes_of_the_task_codec(message: TaskMessage) -> None:
    data = encode_task(
        message.task_id,
        message.payload,
        attempts=message.attempts,
        priority=message.priority,
        not_before=message.not_before,
        expires=message.expires,
        copy_id=message.copy_id,
    )
    assert data == TaskCodec().encode(message)
    assert TaskCodec().decode(data) == message
