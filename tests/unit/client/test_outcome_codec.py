"""The client's result codec: every result decoded straight into the outcome the wire's codec
and ``Outcome.from_message`` would give, with the same checks."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from truba import codec
from truba.client.outcome import Outcome, TaskGaveUp
from truba.client.outcome_codec import OutcomeCodec
from truba.pipes.errors import CodecError
from truba.wire import ErrorInfo, ResultCodec, ResultMessage

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
errors = st.builds(ErrorInfo, st.text(max_size=8), st.text(max_size=8), st.text(max_size=8))
results = st.builds(
    lambda task_id, ok, value, error, daemon, seconds, attempts, gave_up: ResultMessage(
        task_id,
        ok,
        value if ok else None,
        None if ok else error,
        daemon,
        seconds,
        attempts,
        gave_up and not ok,
    ),
    st.text(min_size=1, max_size=12),
    st.booleans(),
    values,
    errors,
    st.text(max_size=8),
    st.floats(0, 1e6, allow_nan=False),
    st.integers(1, 50),
    st.booleans(),
)


@given(results)
def test_an_outcome_decoded_from_the_wire_equals_the_one_made_from_the_result_message(
    message: ResultMessage,
) -> None:
    data = ResultCodec().encode(message)
    outcome = OutcomeCodec().decode(data)
    assert type(outcome) is Outcome
    assert outcome == Outcome.from_message(ResultCodec().decode(data))
    assert OutcomeCodec().decode(OutcomeCodec().encode(outcome)) == outcome


def test_a_give_up_decodes_to_an_outcome_that_raises_task_gave_up() -> None:
    error = ErrorInfo("TaskTimeout", "the attempt ran longer than 1 s")
    outcome = OutcomeCodec().decode(
        ResultCodec().encode(ResultMessage("t", False, None, error, "d", 0.5, 3, True))
    )
    assert (outcome.ok, outcome.gave_up, outcome.attempts, outcome.daemon_id, outcome.seconds) == (
        False,
        True,
        3,
        "d",
        0.5,
    )
    with pytest.raises(TaskGaveUp, match="gave up after 3 attempts"):
        outcome.result()


def test_a_pickle_jobs_value_is_unpickled_or_becomes_the_tasks_error() -> None:
    outcomes = OutcomeCodec(unpickle=True)
    good = outcomes.decode(ResultCodec().encode(ResultMessage("a", True, codec.pickled({1, 2}))))
    assert good.ok and good.value == {1, 2}
    bad = outcomes.decode(ResultCodec().encode(ResultMessage("b", True, b"not a pickle")))
    assert not bad.ok and bad.error is not None and bad.error.type == "ResultNotUnpickled"


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        msgpack.packb([1, "t", True]),
        msgpack.packb([1, "t", "yes", None, "d", 0.0]),
        msgpack.packb([1, "t", True, None, "d", "slow"]),
        msgpack.packb([1, "t", False, ["only", "two"], "d", 0.0]),
    ],
)
def test_what_the_wire_codec_refuses_the_outcome_codec_refuses(data: bytes) -> None:
    with pytest.raises(CodecError):
        ResultCodec().decode(data)
    with pytest.raises(CodecError):
        OutcomeCodec().decode(data)
