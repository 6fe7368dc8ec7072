"""The disk buffer layer over FakeSender: log before send, forget on confirm, replay, compaction."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from truba.pipes import spool_files, spool_format, spool_log
from truba.pipes.base import Confirmation
from truba.pipes.errors import MessageRejected, PipeBroken, PipeClosed
from truba.pipes.spool import FsyncPolicy, SpoolError, SpoolFull, SpoolLocked, SpoolSender, spool
from truba.pipes.testing import FakeSender

POLICIES: list[FsyncPolicy] = ["always", "batch", "interval", "never"]


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.seg"))


def on_disk(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in segments(directory))


class Recording:
    """A Sender[bytes] over a FakeSender that records events, and what the spool file held, per send."""

    def __init__(self, directory: Path, events: list[tuple[str, bytes]], auto_confirm: bool = False) -> None:
        self.fake: FakeSender[bytes] = FakeSender(auto_confirm=auto_confirm)
        self.directory = directory
        self.events = events
        self.on_disk_at_send: list[bool] = []

    async def send(self, message: bytes) -> Confirmation:
        self.on_disk_at_send.append(message in on_disk(self.directory))
        self.events.append(("send", message))
        return await self.fake.send(message)

    def unconfirmed(self) -> Sequence[bytes]:
        return self.fake.unconfirmed()

    def drop_unconfirmed(self) -> None:
        self.fake.drop_unconfirmed()

    async def close(self) -> None:
        await self.fake.close()


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes]]:
    """Records every record write and every fdatasync the spool makes, in order."""
    happened: list[tuple[str, bytes]] = []
    write_all, fdatasync = spool_files.write_all, os.fdatasync

    def recording_write(fd: int, *parts: bytes) -> None:
        write_all(fd, *parts)
        happened.append(("write", b"".join(parts[1::2])))  # headers and payloads alternate

    def recording_fdatasync(fd: int) -> None:
        fdatasync(fd)
        happened.append(("fsync", b""))

    monkeypatch.setattr(spool_log, "write_all", recording_write)
    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    return happened


@pytest.mark.parametrize("policy", POLICIES)
async def test_each_message_is_on_disk_and_synced_per_policy_before_the_inner_sender_sees_it(
    tmp_path: Path, policy: FsyncPolicy, events: list[tuple[str, bytes]]
) -> None:
    inner = Recording(tmp_path, events)
    sender = await SpoolSender.open(inner, tmp_path, fsync=policy)
    for i in range(5):
        await sender.send(f"m{i}".encode())
    assert inner.on_disk_at_send == [True] * 5
    for i in range(5):
        message = f"m{i}".encode()
        written, sent = events.index(("write", message)), events.index(("send", message))
        synced = ("fsync", b"") in events[written:sent]
        assert written < sent and synced == (policy in ("always", "batch")), (policy, events)
    await sender.close()


async def test_interval_policy_syncs_soon_after_without_delaying_the_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[float] = []

    def slow_fdatasync(fd: int) -> None:  # a slow disk: 0.3 s per fsync
        time.sleep(0.3)
        synced.append(time.monotonic())

    inner: FakeSender[bytes] = FakeSender(auto_confirm=True)
    sender = await SpoolSender.open(inner, tmp_path, fsync="interval")
    await sender.send(b"warm-up")  # creating the first segment syncs once, on purpose
    await asyncio.sleep(0.05)
    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    began = time.monotonic()
    for i in range(20):
        await sender.send(b"i%d" % i)
    sent_at = time.monotonic()
    assert sent_at - began < 0.25, "a send waited for an fsync"
    assert len(inner.sent) == 21
    await asyncio.sleep(0.8)
    assert synced and synced[0] > sent_at - 0.3  # one sync covered the burst, soon after
    await sender.close()


async def test_a_confirmed_message_is_forgotten_and_not_replayed(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    confirmations = [await sender.send(m) for m in (b"a", b"b", b"c")]
    inner.confirm(2)
    await asyncio.gather(*confirmations[:2])
    assert sender.unconfirmed() == [b"c"]
    await sender.close()

    again: FakeSender[bytes] = FakeSender()
    reopened = await SpoolSender.open(again, tmp_path)
    assert again.sent == [b"c"] and reopened.replayed == 1
    await reopened.close()


async def test_a_failed_confirmation_keeps_the_message_until_a_resend_is_confirmed(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    first = await sender.send(b"nacked")
    second = await sender.send(b"pending")
    inner.reject(1)
    with pytest.raises(MessageRejected):
        await first
    assert sender.unconfirmed() == [b"nacked", b"pending"]  # oldest first, failed ones included

    # resend_held re-sends only what is not awaiting a confirm
    resent = await sender.resend_held()
    assert inner.sent == [b"nacked", b"pending", b"nacked"] and len(resent) == 1
    inner.confirm()
    await asyncio.gather(second, *resent)
    assert sender.unconfirmed() == []
    await sender.close()
    assert segments(tmp_path) == []  # everything confirmed: nothing left on disk


async def test_held_messages_are_replayed_in_order_before_new_ones_after_reopen(tmp_path: Path) -> None:
    first: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(first, tmp_path)
    for i in range(10):
        await sender.send(b"old%d" % i)
    first.confirm(3)
    await asyncio.sleep(0)
    await sender.close()  # without confirms: 7 records stay on disk

    second: FakeSender[bytes] = FakeSender()
    reopened = await SpoolSender.open(second, tmp_path)
    assert reopened.replayed == 7
    assert reopened.unconfirmed() == [b"old%d" % i for i in range(3, 10)]
    await reopened.send(b"new")
    assert second.sent == [b"old%d" % i for i in range(3, 10)] + [b"new"]
    second.confirm()
    await asyncio.sleep(0)
    assert reopened.unconfirmed() == []
    await reopened.close()


async def test_the_builder_layer_replays_lazily_on_the_first_send(tmp_path: Path) -> None:
    first: FakeSender[bytes] = FakeSender()
    built = spool(tmp_path, fsync="never")(first)
    await built.send(b"held")
    await built.close()

    second: FakeSender[bytes] = FakeSender()
    built = spool(tmp_path, fsync="never")(second)
    assert built.unconfirmed() == [b"held"] and second.sent == []
    await asyncio.gather(built.send(b"new1"), built.send(b"new2"))
    assert second.sent == [b"held", b"new1", b"new2"]
    assert isinstance(built, SpoolSender) and built.replayed == 1
    assert await built.replay() == []  # replaying twice sends nothing
    await built.close()


async def test_drop_unconfirmed_forgets_on_disk_and_drops_the_inner_list(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    for m in (b"x", b"y"):
        await sender.send(m)
    sender.drop_unconfirmed()
    assert sender.unconfirmed() == [] and inner.unconfirmed() == []
    await sender.close()

    again: FakeSender[bytes] = FakeSender()
    reopened = await SpoolSender.open(again, tmp_path)
    assert again.sent == [] and reopened.replayed == 0
    await reopened.close()


async def test_an_inner_send_error_forgets_the_record_and_propagates(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    inner.fail_next(PipeBroken("broker down"))
    with pytest.raises(PipeBroken, match="broker down"):
        await sender.send(b"refused")
    assert sender.unconfirmed() == []
    await sender.close()
    again: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(again, tmp_path)).close()
    assert again.sent == []


async def test_a_replay_that_fails_keeps_the_records_and_releases_the_directory(tmp_path: Path) -> None:
    sender = await SpoolSender.open(FakeSender(), tmp_path)
    await sender.send(b"keep")
    await sender.close()

    broken: FakeSender[bytes] = FakeSender()
    broken.fail_next(PipeBroken("no broker"))
    with pytest.raises(PipeBroken):
        await SpoolSender.open(broken, tmp_path)

    good: FakeSender[bytes] = FakeSender()
    reopened = await SpoolSender.open(good, tmp_path)  # not locked any more
    assert good.sent == [b"keep"]
    await reopened.close()


async def test_a_torn_or_corrupt_tail_record_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sender = await SpoolSender.open(FakeSender(), tmp_path)
    for m in (b"one", b"two", b"three"):
        await sender.send(m)
    await sender.close()
    [segment] = segments(tmp_path)
    data = segment.read_bytes()
    segment.write_bytes(data[:-2])  # a crash in the middle of the last append

    caplog.set_level(logging.WARNING, logger="truba.pipes.spool_recovery")
    replayed: FakeSender[bytes] = FakeSender()
    reopened = await SpoolSender.open(replayed, tmp_path)
    assert replayed.sent == [b"one", b"two"]
    assert [r for r in caplog.records if r.getMessage() == "pipe.spool.corrupt_tail"]
    await reopened.send(b"four")  # goes to a new segment, never after the torn tail
    await reopened.close()

    # A flipped bit fails the CRC: that record and the rest of its segment are ignored.
    for path in segments(tmp_path):
        raw = bytearray(path.read_bytes())
        if b"two" in raw:
            raw[raw.index(b"two")] ^= 0x01
            path.write_bytes(bytes(raw))
    last: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(last, tmp_path)).close()
    assert last.sent == [b"one", b"four"]


async def test_a_full_disk_is_a_clear_error_and_nothing_is_sent_or_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    await sender.send(b"before")
    real_write = spool_files.write_all

    def half_then_enospc(fd: int, *parts: bytes) -> None:
        os.write(fd, b"".join(parts)[:5])  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_log, "write_all", half_then_enospc)
    with pytest.raises(
        SpoolFull, match=rf"spool {re.escape(str(tmp_path))} is full \(\d+ bytes free\)"
    ) as raised:
        await sender.send(b"rejected")
    assert not raised.value.retryable
    assert any(r.getMessage() == "pipe.spool.full" and r.levelno == logging.ERROR for r in caplog.records)
    assert inner.sent == [b"before"] and sender.unconfirmed() == [b"before"]

    monkeypatch.setattr(spool_log, "write_all", real_write)  # space is back
    await sender.send(b"after")
    await sender.close()
    again: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(again, tmp_path)).close()
    assert again.sent == [b"before", b"after"]


async def test_a_failed_fsync_fails_the_send_and_breaks_the_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync="batch")
    await sender.send(b"fine")

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(SpoolError, match="fsync failed"):
        await sender.send(b"unknown")
    monkeypatch.undo()
    with pytest.raises(SpoolError, match="fsync failed"):  # page cache state unknown: for good
        await sender.send(b"later")
    assert inner.sent == [b"fine"]
    await sender.close()


async def test_a_second_owner_of_the_directory_is_refused(tmp_path: Path) -> None:
    owner = await SpoolSender.open(FakeSender(), tmp_path)
    with pytest.raises(SpoolLocked, match=rf"spool {re.escape(str(tmp_path))} is in use .*pid {os.getpid()}"):
        await SpoolSender.open(FakeSender(), tmp_path)
    with pytest.raises(SpoolLocked):
        spool(tmp_path)(FakeSender())
    await owner.close()
    await (await SpoolSender.open(FakeSender(), tmp_path)).close()


async def test_segments_rotate_and_are_deleted_once_all_their_records_are_confirmed(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync="never", segment_bytes=1024)
    stuck = await sender.send(b"s" * 100)  # never confirmed: pins the first segment
    confirmations = [await sender.send(b"%04d" % i + b"m" * 96) for i in range(100)]
    assert len(segments(tmp_path)) >= 10
    inner.confirm()
    await asyncio.gather(stuck, *confirmations)
    assert len(segments(tmp_path)) <= 1  # only the active one may remain

    inner.fail_next(PipeBroken("x"))  # a send whose record is forgotten at once
    with pytest.raises(PipeBroken):
        await sender.send(b"gone")
    await sender.close()
    assert segments(tmp_path) == [] and list(tmp_path.glob("*.ack")) == []


async def test_an_unconfirmed_record_keeps_only_its_own_segment(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync="never", segment_bytes=1024)
    for i in range(100):
        await sender.send(b"%04d" % i + b"m" * 96)
    inner.reject(1)  # the oldest fails; confirming the rest leaves its confirmation failed
    inner.confirm()
    await asyncio.sleep(0)
    await sender.close()
    assert len(segments(tmp_path)) == 1
    again: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(again, tmp_path)).close()
    assert again.sent == [b"0000" + b"m" * 96]


async def test_batch_policy_shares_one_fsync_among_concurrent_sends(
    tmp_path: Path, events: list[tuple[str, bytes]]
) -> None:
    inner: FakeSender[bytes] = FakeSender(auto_confirm=True)
    sender = await SpoolSender.open(inner, tmp_path, fsync="batch")
    events.clear()
    confirmations = await asyncio.gather(*(sender.send(b"c%d" % i) for i in range(50)))
    await asyncio.gather(*confirmations)
    fsyncs = sum(1 for kind, _ in events if kind == "fsync")
    assert len(inner.sent) == 50 and 1 <= fsyncs <= 5, fsyncs
    await sender.close()


@pytest.mark.parametrize("policy", POLICIES)
async def test_every_policy_round_trips_many_messages(tmp_path: Path, policy: FsyncPolicy) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync=policy, segment_bytes=4096)
    messages = [os.urandom(i % 300) for i in range(300)]
    for m in messages:
        await sender.send(m)
    inner.confirm(150)
    await asyncio.sleep(0)
    await sender.close()
    again: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(again, tmp_path, fsync=policy)).close()
    assert again.sent == messages[150:]


async def test_close_is_idempotent_closes_the_inner_sender_and_refuses_sends(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path)
    await sender.close()
    await sender.close()
    assert inner.closed
    with pytest.raises(PipeClosed):
        await sender.send(b"late")


def test_an_unknown_fsync_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync policy"):
        spool(tmp_path, fsync="sometimes")(FakeSender())  # type: ignore[arg-type]


async def test_a_cancelled_send_leaves_its_message_held_for_resend(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync="batch")
    sending = asyncio.create_task(sender.send(b"cancelled"))
    await asyncio.sleep(0)  # written, waiting for its group's fsync
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert inner.sent == [] and sender.unconfirmed() == [b"cancelled"]
    [confirmation] = await sender.resend_held()
    inner.confirm()
    await confirmation
    assert inner.sent == [b"cancelled"] and sender.unconfirmed() == []
    await sender.close()


async def test_torn_or_foreign_forget_marks_forget_nothing(tmp_path: Path) -> None:
    inner: FakeSender[bytes] = FakeSender()
    sender = await SpoolSender.open(inner, tmp_path, fsync="never")
    for m in (b"a", b"b", b"c"):
        await sender.send(m)
    inner.confirm(1)
    await asyncio.sleep(0)
    await sender.close()
    [marks] = tmp_path.glob("*.ack")
    seq_of_b = 1
    foreign = spool_format.ACK.pack(seq_of_b, 12345)  # right seq, wrong salt: another incarnation's
    marks.write_bytes(marks.read_bytes() + foreign + b"\x02\x00\x00")  # plus a torn mark
    again: FakeSender[bytes] = FakeSender()
    await (await SpoolSender.open(again, tmp_path)).close()
    assert again.sent == [b"b", b"c"]


def test_append_many_writes_one_run_per_segment_and_recovers_in_order(
    tmp_path: Path, events: list[tuple[str, bytes]]
) -> None:
    log = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=200)
    records = [f"record {i}".encode() * 3 for i in range(8)]  # 42 bytes each with its header
    assert log.append_many(records) == list(range(8))
    writes = [payload for kind, payload in events if kind == "write" and payload]
    assert len(writes) == 2 and log.segment_count == 2  # 4 fit in the first 200-byte segment
    assert log.append_many([]) == [] and log.append(b"one more") == 8
    log.close()
    again = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=200)
    assert again.recovered == [*enumerate(records), (8, b"one more")]
    again.close()


def test_append_many_refuses_an_oversized_record_before_writing_any(tmp_path: Path) -> None:
    log = spool_log.SpoolLog.open(tmp_path, durable=False, segment_bytes=1 << 20)
    with pytest.raises(SpoolError, match="exceeds"):
        log.append_many([b"fine", b"x" * (spool_format.MAX_RECORD + 1)])
    assert log.next_seq == 0
    log.close()
