from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from truba.pipes.errors import CodecError
from truba.wire import ErrorInfo, ResultCodec, ResultMessage, TaskCodec, TaskMessage

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
