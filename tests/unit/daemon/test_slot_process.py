from __future__ import annotations

import datetime
import decimal
import fcntl
import uuid
from collections.abc import AsyncIterator

import pytest

from truba import codec
from truba.daemon.forkserver import ForkServer
from truba.daemon.launch import Launcher, Spawn
from truba.daemon.pipe_size import SLOT_PIPE_BYTES
from truba.daemon.slot_process import SlotDied, SlotProcess


@pytest.fixture(params=["spawn", "fork"])
async def slot(request: pytest.FixtureRequest) -> AsyncIterator[SlotProcess]:
    # Every slot behaviour holds whether the slot is spawned or forked from a template.
    launcher: Launcher = Spawn() if request.param == "spawn" else ForkServer(["tests.handlers.basic:square"])
    process = SlotProcess(0, launcher)
    await process.start()
    yield process
    await process.stop()
    await launcher.close()


async def test_slot_runs_a_handler_and_reuses_its_process(slot: SlotProcess) -> None:
    pid = slot.pid
    first = await slot.run("tests.handlers.basic:square", "t1", 7)
    second = await slot.run("tests.handlers.basic:noisy", "t2", {"k": [1, 2]})
    assert (first.ok, first.value, first.task_id) == (True, 49, "t1")
    assert (second.ok, second.value) == (True, {"k": [1, 2]})
    assert slot.pid == pid and slot.tasks_run == 2


async def test_a_raising_handler_gives_an_error_with_traceback(slot: SlotProcess) -> None:
    reply = await slot.run("tests.handlers.basic:square", "t", -1)
    assert not reply.ok and reply.error is not None
    assert reply.error.type == "ValueError"
    assert "negative one" in reply.error.message
    assert "Traceback" in reply.error.traceback and "square" in reply.error.traceback


async def test_import_failures_and_unserializable_results_are_clear_errors(slot: SlotProcess) -> None:
    missing = await slot.run("tests.handlers.nope:f", "t1", None)
    assert missing.error is not None and missing.error.type == "HandlerImportError"
    assert "tests.handlers.nope:f" in missing.error.message
    bad = await slot.run("tests.handlers.basic:unserializable", "t2", None)
    assert bad.error is not None and bad.error.type == "ResultNotSerializable"
    ok = await slot.run("tests.handlers.basic:echo", "t3", "still alive")
    assert ok.value == "still alive"


async def test_a_crashing_handler_raises_slot_died_and_the_slot_restarts(slot: SlotProcess) -> None:
    with pytest.raises(SlotDied, match="exited with 13"):
        await slot.run("tests.handlers.basic:crash", "t1", None)
    reply = await slot.run("tests.handlers.basic:echo", "t2", 5)
    assert reply.value == 5


async def test_a_raising_handler_reports_its_exception_classes_for_retry_on(slot: SlotProcess) -> None:
    reply = await slot.run("tests.handlers.flaky:busy_twice", "t", "/nonexistent/dir/counter")
    assert not reply.ok and reply.kinds[0] == "FileNotFoundError" and "OSError" in reply.kinds


async def test_datetimes_uuids_and_decimals_reach_the_handler_and_come_back(slot: SlotProcess) -> None:
    value = {
        "at": datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC),
        "id": uuid.uuid4(),
        "n": decimal.Decimal("1.5"),
    }
    reply = await slot.run("tests.handlers.basic:echo", "t", value)
    assert reply.ok and reply.value == value


async def test_a_numpy_array_reaches_the_handler_and_comes_back(slot: SlotProcess) -> None:
    np = pytest.importorskip("numpy")
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    reply = await slot.run("tests.handlers.basic:echo", "t", array)
    assert reply.ok and isinstance(reply.value, np.ndarray) and np.array_equal(reply.value, array)


async def test_a_pickle_job_s_slot_unpickles_payloads_and_pickles_results(slot: SlotProcess) -> None:
    payload = {"a set": {1, 2}, "a complex": 1 + 2j}
    reply = await slot.run("tests.handlers.basic:echo|pickle", "t", codec.pickled(payload))
    assert reply.ok and codec.unpickled(reply.value) == payload


async def test_a_pickle_job_s_payload_that_is_not_pickled_is_an_error_not_a_guess(slot: SlotProcess) -> None:
    reply = await slot.run("tests.handlers.basic:echo|pickle", "t", b"plain bytes")
    assert not reply.ok and reply.error is not None and reply.error.type == "NotPickled"


async def test_a_pickled_value_is_never_unpickled_by_a_plain_job_s_slot(slot: SlotProcess) -> None:
    crafted = codec.pickled({"would": "run code"})
    reply = await slot.run("tests.handlers.basic:echo", "t", crafted)
    assert reply.ok and reply.value == crafted  # handed over as the opaque extension it is


async def test_a_large_payload_and_its_result_cross_whole(slot: SlotProcess) -> None:
    payload = bytes(range(256)) * 4000  # 1 MB: written in parts, read in chunks, both ways
    reply = await slot.run("tests.handlers.basic:echo", "big", payload)
    assert (reply.ok, reply.task_id, reply.value) == (True, "big", payload)
    pickled = codec.pickled(payload)  # a large extension too
    reply = await slot.run("tests.handlers.basic:echo", "ext", pickled)
    assert reply.ok and reply.value == pickled
    assert (await slot.run("tests.handlers.basic:square", "after", 3)).value == 9


async def test_a_slot_s_pipes_hold_a_large_payload_in_one_write(slot: SlotProcess) -> None:
    await slot.run("tests.handlers.basic:echo", "t", 1)
    handle = slot._process
    assert handle is not None
    pipes = [
        handle.stdin.transport.get_extra_info("pipe"),
        handle.stdout._transport.get_extra_info("pipe") if handle.stdout._transport else None,
    ]
    assert [fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) for pipe in pipes if pipe] == [SLOT_PIPE_BYTES] * 2


async def test_a_large_payload_is_written_to_the_slot_as_it_is_not_copied(
    slot: SlotProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    await slot.run("tests.handlers.basic:echo", "t", 1)
    handle = slot._process
    assert handle is not None
    written: list[bytes] = []
    write = handle.stdin.write

    def recording(data: bytes) -> None:
        written.append(data)
        write(data)

    monkeypatch.setattr(handle.stdin, "write", recording)
    payload = b"z" * 1_000_000
    assert (await slot.run("tests.handlers.basic:echo", "big", payload)).value == payload
    assert any(part is payload for part in written)
