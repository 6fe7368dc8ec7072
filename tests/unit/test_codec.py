"""Payloads users have round-trip through truba's msgpack extension types (truba.codec), in a
task and in a result as they travel."""

from __future__ import annotations

import datetime
import decimal
import uuid
import zoneinfo

import msgpack
import pytest

from truba import codec
from truba.pipes.errors import CodecError
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage


def through_the_wire(value: object) -> object:
    """``value`` as a task's payload, then as a result's value, each encoded and decoded."""
    task = TaskCodec().decode(TaskCodec().encode(TaskMessage("t", value)))
    result = ResultCodec().decode(ResultCodec().encode(ResultMessage("t", True, task.payload)))
    return result.value


@pytest.mark.parametrize(
    "value",
    [
        datetime.datetime(2026, 11, 25, 12, 30, 1, 123456),  # naive stays naive
        datetime.datetime(2026, 11, 25, 12, 30, tzinfo=datetime.UTC),
        datetime.datetime(
            2026, 11, 25, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-5, minutes=-30))
        ),
        datetime.date(2026, 2, 28),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        decimal.Decimal("3.14159265358979323846264338327950288"),
        decimal.Decimal("-0.00"),
        decimal.Decimal("Infinity"),
    ],
)
def test_datetimes_dates_uuids_and_decimals_come_back_equal_and_of_their_type(value: object) -> None:
    back = through_the_wire({"value": [value]})
    assert isinstance(back, dict)
    [got] = back["value"]
    assert type(got) is type(value) and got == value and str(got) == str(value)


def test_an_aware_datetime_keeps_its_offset_and_a_naive_one_stays_naive() -> None:
    aware = datetime.datetime(2026, 7, 1, 9, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    back = through_the_wire(aware)
    assert isinstance(back, datetime.datetime) and back == aware
    assert back.utcoffset() == datetime.timedelta(hours=2)
    naive = through_the_wire(datetime.datetime(2026, 7, 1, 9, 0))
    assert isinstance(naive, datetime.datetime) and naive.tzinfo is None


def test_a_decimal_nan_comes_back_a_nan() -> None:
    back = through_the_wire(decimal.Decimal("NaN"))
    assert isinstance(back, decimal.Decimal) and back.is_nan()


def test_an_unknown_extension_passes_through_unchanged() -> None:
    opaque = msgpack.ExtType(99, b"\x01\x02")
    assert through_the_wire(opaque) == opaque


def test_something_else_is_still_a_codec_error_naming_its_type() -> None:
    with pytest.raises(CodecError, match="not msgpack-serializable: can not serialize 'object' object"):
        TaskCodec().encode(TaskMessage("t", object()))


class TestNumpy:
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
    def test_arrays_come_back_equal_with_their_dtype_and_shape(self, array: object) -> None:
        np = self.np
        back = through_the_wire(array)
        assert isinstance(back, np.ndarray) and isinstance(array, np.ndarray)
        assert back.dtype == array.dtype and back.shape == array.shape
        assert np.array_equal(back, array)

    def test_a_decoded_array_is_a_read_only_view_of_the_message_not_a_copy(self) -> None:
        np = self.np
        data = codec.packb(np.arange(1000, dtype=np.float64))
        back = codec.unpackb(data)
        assert not back.flags.writeable and not back.flags.owndata  # a view of the message's bytes

    def test_numpy_scalars_travel_as_python_numbers(self) -> None:
        np = self.np
        assert through_the_wire([np.int64(3), np.float32(2.5)]) == [3, 2.5]

    def test_object_arrays_are_refused_pointing_to_pickle(self) -> None:
        np = self.np
        with pytest.raises(CodecError, match="codec='pickle'"):
            TaskCodec().encode(TaskMessage("t", np.array([object()])))


def test_a_pickle_job_s_client_unpickles_results_and_an_unpicklable_one_is_the_task_s_error() -> None:
    good = ResultCodec().encode(ResultMessage("t", True, codec.pickled({1, 2})))
    assert ResultCodec(unpickle=True).decode(good).value == {1, 2}
    assert ResultCodec().decode(good).value == codec.pickled({1, 2})  # a plain job never unpickles
    bad = ResultCodec().encode(ResultMessage("t", True, msgpack.ExtType(codec.PICKLED, b"garbage")))
    result = ResultCodec(unpickle=True).decode(bad)
    assert not result.ok and result.error is not None and result.error.type == "ResultNotUnpickled"
