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


def test_a_value_that_cannot_be_packed_leaves_nothing_behind_for_the_next_one() -> None:
    # packb keeps one packer per thread: a pack that failed halfway must not leave its first
    # elements in the packer's buffer, in front of the next message.
    with pytest.raises(CodecError, match=r"task t1 payload is not msgpack-serializable"):
        TaskCodec().encode(TaskMessage("t1", [b"x" * 100, object()]))
    assert codec.packb([1, "a"]) == msgpack.packb([1, "a"], use_bin_type=True)


def test_threads_pack_at_once_each_with_its_own_packer() -> None:
    import threading

    values = [[n, datetime.date(2020, 1, 1 + n % 28), uuid.UUID(int=n)] for n in range(2000)]
    got: dict[int, list[bytes]] = {}

    def pack_all(key: int) -> None:
        got[key] = [codec.packb(value) for value in values]

    threads = [threading.Thread(target=pack_all, args=(key,)) for key in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [msgpack.packb(value, use_bin_type=True, default=codec.default) for value in values]
    assert all(got[key] == expected for key in range(4))


def test_a_pickle_job_s_client_unpickles_results_and_an_unpicklable_one_is_the_task_s_error() -> None:
    good = ResultCodec().encode(ResultMessage("t", True, codec.pickled({1, 2})))
    assert ResultCodec(unpickle=True).decode(good).value == {1, 2}
    assert ResultCodec().decode(good).value == codec.pickled({1, 2})  # a plain job never unpickles
    bad = ResultCodec().encode(ResultMessage("t", True, msgpack.ExtType(codec.PICKLED, b"garbage")))
    result = ResultCodec(unpickle=True).decode(bad)
    assert not result.ok and result.error is not None and result.error.type == "ResultNotUnpickled"


@pytest.mark.parametrize(
    "items",
    [
        [1, "t-1", b"x" * codec.LARGE],
        [1, "t-1", b"x" * (codec.LARGE + 5), {"attempts": 2}],
        ["h", codec.pickled(b"y" * codec.LARGE), b"z" * codec.LARGE, 0.5],
        [*range(20), b"x" * codec.LARGE],  # an array of 16 items or more
        [1, "t-1", b"x" * (codec.LARGE - 1)],  # not large: packed as one part
    ],
)
def test_a_large_item_is_packed_by_reference_into_exactly_packb_s_bytes(items: list[object]) -> None:
    parts = codec.pack_parts(items)
    assert b"".join(parts) == codec.packb(items)
    large = [item for item in items if codec.is_large(item)]
    for item in large:  # the payload itself, not a copy
        data = item.data if isinstance(item, msgpack.ExtType) else item
        assert any(part is data for part in parts)
    if not large:
        assert len(parts) == 1


def test_a_large_payload_or_result_encodes_to_the_same_bytes_and_decodes_back() -> None:
    payload = b"p" * (codec.LARGE * 3)
    task = TaskMessage("t-7", payload, attempts=2)
    data = TaskCodec().encode(task)
    assert data == codec.packb([1, "t-7", payload, {"attempts": 2}])
    assert TaskCodec().decode(data) == task
    result = ResultMessage("t-7", True, payload, daemon_id="d0", seconds=0.25, attempts=2)
    assert ResultCodec().decode(ResultCodec().encode(result)) == result


def test_a_large_value_that_cannot_be_sent_is_still_a_codec_error() -> None:
    with pytest.raises(CodecError, match="not msgpack-serializable"):
        TaskCodec().encode(TaskMessage("t", b"x" * codec.LARGE, priority=2**70))  # over msgpack's ints
