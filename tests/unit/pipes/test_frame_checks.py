"""Malformed frames: none of their members runs; the whole frame is dead-lettered with its reason."""

from __future__ import annotations

import msgpack
import pytest

from truba.daemon.job_pipes import task_key
from truba.pipes.errors import CodecError
from truba.pipes.frame import MAGIC, FrameListener, pack
from truba.pipes.frame_format import MalformedFrame, members
from truba.pipes.testing import FakeListener, FakeSender
from truba.wire import TaskCodec, TaskMessage


def _task(task_id: str, payload: object) -> bytes:
    return TaskCodec().encode(TaskMessage(task_id, payload))


def _task_id(data: bytes) -> str | None:
    try:
        return TaskCodec().decode(data).task_id
    except CodecError:
        return None


def test_a_well_formed_frame_and_a_lone_message_pass_the_checks() -> None:
    frame = pack([_task("t-1", 1), _task("t-2", 2)])
    assert members(frame, _task_id) == [_task("t-1", 1), _task("t-2", 2)]
    assert members(_task("t-1", 1), _task_id) is None  # a lone message is not a frame


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (pack([_task("t-1", "seen"), _task("t-1", "hidden")]), "members 0 and 1 both have task id 't-1'"),
        (pack([b"a"]) + b"\x01", "bytes after its members"),
        (pack([]), "no members"),
        (pack([b"a", pack([b"hidden"])]), "member 1 is itself a frame"),
        (MAGIC + b"\xc1 not msgpack", "not msgpack"),
        (MAGIC + msgpack.packb([1, 2]), "not an array of byte strings"),
    ],
)
def test_a_crafted_frame_is_refused_with_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedFrame, match=reason):
        members(data, _task_id)


async def test_a_frame_hiding_a_second_task_with_the_same_id_runs_nothing_and_is_dead_lettered() -> None:
    # Given a frame whose second member reuses the first one's task id (its result would be
    # dropped by the client as a duplicate after it ran)
    inner: FakeListener[bytes] = FakeListener()
    dead: FakeSender[bytes] = FakeSender(auto_confirm=True)
    listener = FrameListener(inner, member_key=_task_id, dead_letters=dead)
    frame = pack([_task("t-1", "seen"), _task("t-1", "hidden")])
    inner.push(frame)
    inner.push(_task("t-2", "next"))
    # When the consumer takes what comes
    delivery = await listener.get(1.0)
    # Then no member of the frame ran: the next message comes first, the frame is dead-lettered
    assert delivery is not None and delivery.message == _task("t-2", "next")
    (record,) = dead.sent
    poison = msgpack.unpackb(record, raw=False)
    assert poison["kind"] == "poison" and poison["body"] == frame
    assert "both have task id 't-1'" in poison["error"]
    assert inner.acked == [frame]  # acked once its record was confirmed


async def test_without_a_dead_letter_sender_a_malformed_frame_goes_to_the_brokers_dead_letters() -> None:
    inner: FakeListener[bytes] = FakeListener()
    listener = FrameListener(inner)
    inner.push(MAGIC + b"\xff not a frame")
    assert await listener.get(0.05) is None
    assert inner.rejected == [(MAGIC + b"\xff not a frame", False)]


@pytest.mark.parametrize(
    "task",
    [
        TaskMessage("ab12cd-1", {"n": 1}),
        TaskMessage("ab12cd-2", b"x" * 100_000, attempts=2, priority=3),
        TaskMessage("a-task-id-longer-than-31-bytes-" * 3, None),
        TaskMessage("", 0),
        TaskMessage("ünïcödé", [1, 2]),
    ],
)
def test_the_daemons_frame_key_is_the_task_id_without_decoding_the_payload(task: TaskMessage) -> None:
    assert task_key(TaskCodec().encode(task)) == task.task_id


def test_the_daemons_frame_key_of_what_is_not_a_task_is_none() -> None:
    assert task_key(b"\x93\x01\xa2\xff\xfe\x00") is None  # an id that is not UTF-8
    assert task_key(b"\x93\x01\xa9ab") is None  # cut short
    assert task_key(b"garbage") is None
