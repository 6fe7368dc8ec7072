"""numpy arrays round-trip through truba's msgpack extension type (skipped without numpy)."""

from __future__ import annotations

import pytest

from tests.unit.test_codec import through_the_wire
from truba import codec
from truba.pipes.errors import CodecError
from truba.wire import TaskCodec, TaskMessage

np = pytest.importorskip("numpy")


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2],  # big-endian and not contiguous
        np.array(7, dtype=np.int16),  # 0-d
        np.zeros((0, 3), dtype=np.float32),
        np.array([True, False]),
        np.array(["ab", "c"]),
        np.array(["2026-11-25"], dtype="datetime64[D]"),
        np.array([1 + 2j], dtype=np.complex64),
    ],
)
def test_arrays_come_back_equal_with_their_dtype_and_shape(array: object) -> None:
    back = through_the_wire(array)
    assert isinstance(back, np.ndarray) and isinstance(array, np.ndarray)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array)


def test_a_decoded_array_is_a_read_only_view_of_the_message_not_a_copy() -> None:
    data = codec.packb(np.arange(1000, dtype=np.float64))
    back = codec.unpackb(data)
    assert not back.flags.writeable and not back.flags.owndata  # a view of the message's bytes


def test_numpy_scalars_travel_as_python_numbers() -> None:
    assert through_the_wire([np.int64(3), np.float32(2.5)]) == [3, 2.5]


def test_object_arrays_are_refused_pointing_to_pickle() -> None:
    with pytest.raises(CodecError, match="codec='pickle'"):
        TaskCodec().encode(TaskMessage("t", np.array([object()])))
