"""Layer: the disk buffer. Every message is logged before it is sent and forgotten once confirmed.

Contract of :class:`SpoolSender` (``Sender[bytes] -> Sender[bytes]``):

- ``send`` appends a record to the spool directory's log, makes it as durable as the fsync
  policy says, and only then hands the message to the inner sender. The returned confirmation
  resolves (or fails with the same error) when the inner one does; on success the record is
  forgotten. A failed confirmation keeps the record held: it stays in ``unconfirmed()`` and on
  disk until confirmed by a later (re)send or dropped with ``drop_unconfirmed()``.
- A write error raises :class:`SpoolError` (:class:`SpoolFull` when the disk is full) and the
  message is neither spooled nor sent. If the inner ``send`` raises a PipeError, the message was
  not accepted downstream: its record is forgotten and the error propagates (nothing is held
  that the caller was told failed).
- Records held by an earlier run (a crash, or a close before confirms) are sent again, oldest
  first, by :meth:`SpoolSender.replay`, before any new message: :meth:`SpoolSender.open` replays
  at once; the sync :func:`spool` layer (for the builder) replays on the first ``send``, or when
  the owner calls ``replay()``. A replayed or re-sent message may reach a broker twice; truba
  deduplicates by task id. A message is never lost while its record is held.
- Forgetting writes a mark (no fsync) in the loop iteration after the confirm, before anyone
  awaiting that confirmation resumes: after a process crash, a message whose confirmation was
  seen is not replayed; after a power loss it may be, as a duplicate.
- One owner per directory (``flock``): a second opener gets :class:`SpoolLocked`.

Fsync policies, and what a message whose ``send`` returned survives:

- ``"always"``: write + fdatasync on the event loop for every message. Survives power loss.
  Cheapest for one sender at a low rate; blocks the loop for each fsync.
- ``"batch"`` (group commit): write, then wait for the next fdatasync, run in a worker thread
  while the loop goes on; every send that arrives during an fsync shares the following one.
  Survives power loss. Concurrent senders get ~one fsync per group; one sequential sender still
  waits one fsync per message.
- ``"interval"``: write, hand the message on at once, and fdatasync in a worker thread within
  ``SYNC_INTERVAL`` (10 ms). Survives a crash of this process; a power loss can lose only what
  was written in the last interval and not yet confirmed by a broker (a confirmed message is
  safe on the broker anyway). The client's default: it costs a sequential sender no fsync wait.
- ``"never"``: write only (OS page cache). Survives a crash of this process, not of the machine.

Choosing: one sequential sender that needs power-loss safety is faster with "always" (no thread
hop); many concurrent senders are much faster with "batch"; "interval" bounds the power-loss
window for unconfirmed messages at little cost; "never" is fastest.

Memory: held messages are kept in memory too (``unconfirmed()`` must return them), so a broker
outage costs RAM as well as disk until the messages are confirmed or dropped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Final, final

from truba.pipes.base import Confirmation, Layer, Sender, fail_confirmation
from truba.pipes.errors import PipeClosed, PipeError, SpoolError, SpoolFull, SpoolLocked
from truba.pipes.fsync import SYNC_INTERVAL, Committer, FsyncPolicy, check_policy
from truba.pipes.spool_log import SpoolLog

__all__ = ["SYNC_INTERVAL", "FsyncPolicy", "SpoolError", "SpoolFull", "SpoolLocked", "SpoolSender", "spool"]

log = logging.getLogger(__name__)

SEGMENT_BYTES: Final = 64 * 1024 * 1024


@final
class SpoolSender:
    """Logs each message to disk before the inner sender sees it; forgets it once confirmed.

    Build with :meth:`open` (async, replays at once) or the :func:`spool` layer (replays lazily).

    A ``send`` cancelled after its record was written leaves the message held (listed by
    ``unconfirmed()``, sent again by ``resend_held()`` or the next run's replay).

    Raises:
        SpoolFull, SpoolError: the record could not be written (or fsynced); nothing was sent.
        PipeClosed: after ``close()``.
        PipeError: whatever the inner sender raises (the record is then forgotten, except
            during replay or ``resend_held``, where it stays held).
    """

    def __init__(self, inner: Sender[bytes], spool_log: SpoolLog, fsync: FsyncPolicy) -> None:
        self.inner = inner
        self.fsync: FsyncPolicy = check_policy(fsync)
        self.replayed = 0
        """Records of earlier runs handed to the inner sender again."""
        self._log = spool_log
        self._held: dict[int, bytes] = dict(spool_log.recovered)  # seq -> message, oldest first
        self._to_replay = list(self._held)
        spool_log.recovered = []
        self._in_flight: set[int] = set()
        self._resending = asyncio.Lock()
        self._commit = Committer(spool_log, self.fsync)
        self._flush: asyncio.Handle | None = None
        self._closed = False
        log.info(
            "pipe.spool.opened",
            extra={
                "directory": str(spool_log.directory),
                "held": len(self._held),
                "fsync": fsync,
                "segments": spool_log.segment_count,
            },
        )

    @classmethod
    async def open(
        cls,
        inner: Sender[bytes],
        directory: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "batch",
        segment_bytes: int = SEGMENT_BYTES,
    ) -> SpoolSender:
        """Opens (locks, recovers) the spool in ``directory`` and replays its held records.

        Raises:
            SpoolLocked: another owner has the directory.
            PipeError: the inner sender failed during replay. The directory is released again
                (its records stay on disk); the inner sender is left open, it is the caller's.
        """
        spool_log = _open_log(directory, fsync, segment_bytes)
        sender = cls(inner, spool_log, fsync)
        try:
            await sender.replay()
        except BaseException:
            sender._closed = True
            spool_log.close()
            raise
        return sender

    @property
    def directory(self) -> str:
        return str(self._log.directory)

    async def send(self, message: bytes) -> Confirmation:
        self._check_open()
        if self._to_replay:
            await self.replay()
            self._check_open()
        seq = self._log.append(message)
        self._held[seq] = message
        self._in_flight.add(seq)  # this send owns it: resend_held must not send it too
        try:
            await self._commit.commit()
        except SpoolError:
            # Durability unknown: the caller is told it failed. The record may still come back
            # after a restart, as a duplicate of whatever the caller does next.
            self._in_flight.discard(seq)
            self._held.pop(seq, None)
            raise
        except BaseException:  # cancelled: the message stays held, for resend_held or replay
            self._in_flight.discard(seq)
            raise
        try:
            return await self._hand(seq, message)
        except PipeError:
            log.debug("pipe.spool.send_failed", extra={"seq": seq})
            self._in_flight.discard(seq)
            if self._held.pop(seq, None) is not None:
                self._forget(seq)
            raise
        except BaseException:
            self._in_flight.discard(seq)
            raise

    async def replay(self) -> list[Confirmation]:
        """Sends the records held by earlier runs again, oldest first; returns their confirmations.

        Safe to call repeatedly and concurrently: each record is replayed once.

        Raises:
            PipeError: the inner sender raised; that record and later ones stay held and are
                replayed by the next ``replay()`` or ``send()``.
        """
        async with self._resending:
            if not self._to_replay:
                return []
            log.info(
                "pipe.spool.replay", extra={"directory": self.directory, "records": len(self._to_replay)}
            )
            confirmations = await self._resend(self._to_replay)
            log.info("pipe.spool.replayed", extra={"directory": self.directory, "records": self.replayed})
            return confirmations

    async def resend_held(self) -> list[Confirmation]:
        """Sends again every held message that is not awaiting a confirm, oldest first.

        For an owner that retries failed confirmations (nacks, timeouts). When nothing is in
        flight, the inner sender's unconfirmed list is dropped first, since all of it is re-sent.

        Raises:
            PipeError: the inner sender raised; the rest stays held.
        """
        self._check_open()
        async with self._resending:
            if not self._in_flight:
                self.inner.drop_unconfirmed()
            return await self._resend([seq for seq in self._held if seq not in self._in_flight])

    def unconfirmed(self) -> Sequence[bytes]:
        return list(self._held.values())

    def drop_unconfirmed(self) -> None:
        for seq in self._held:
            self._log.forget(seq)
        self._held.clear()
        self._in_flight.clear()
        self._to_replay.clear()
        self._schedule_flush()
        self.inner.drop_unconfirmed()

    async def close(self) -> None:
        """Closes the inner sender (which waits, bounded, for confirms), then the log.

        Records still held stay on disk for the next owner. Idempotent; a cancelled close
        still releases the directory.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._commit.drain()
            await self.inner.close()
            await asyncio.sleep(0)  # let confirmation callbacks that close() settled run
        finally:
            if self._flush is not None:
                self._flush.cancel()
            self._log.close()
            log.info("pipe.spool.closed", extra={"directory": self.directory, "held": len(self._held)})

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PipeClosed(f"spool {self.directory} is closed")

    async def _hand(self, seq: int, message: bytes) -> Confirmation:
        confirmation = await self.inner.send(message)
        self._in_flight.add(seq)
        outer: Confirmation = confirmation.get_loop().create_future()
        confirmation.add_done_callback(functools.partial(self._settled, seq, outer))
        return outer

    async def _resend(self, seqs: Iterable[int]) -> list[Confirmation]:
        confirmations = []
        for seq in list(seqs):
            message = self._held.get(seq)
            if message is not None and seq not in self._in_flight:
                confirmations.append(await self._hand(seq, message))
            if self._to_replay and self._to_replay[0] == seq:  # replay goes in seq order
                del self._to_replay[0]
                if message is not None:
                    self.replayed += 1
        return confirmations

    def _settled(self, seq: int, outer: Confirmation, inner: Confirmation) -> None:
        self._in_flight.discard(seq)
        error = PipeClosed("confirmation cancelled") if inner.cancelled() else inner.exception()
        if error is None:
            if self._held.pop(seq, None) is not None:
                self._forget(seq)
            if not outer.done():
                outer.set_result(None)
        else:
            log.debug("pipe.spool.unconfirmed", extra={"seq": seq, "error": repr(error)})
            fail_confirmation(outer, error)

    def _forget(self, seq: int) -> None:
        self._log.forget(seq)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        # One write for all the marks of a loop iteration, queued before the callbacks (and
        # awaiting tasks) that see the confirmations: whoever saw a confirm, a process crash
        # cannot bring that message back.
        if self._flush is None and not self._closed:
            self._flush = asyncio.get_running_loop().call_soon(self._flush_forgets)

    def _flush_forgets(self) -> None:
        self._flush = None
        self._log.flush_forgets()


def spool(
    directory: str | os.PathLike[str],
    *,
    fsync: FsyncPolicy = "batch",
    segment_bytes: int = SEGMENT_BYTES,
) -> Layer[bytes, bytes]:
    """The spool layer for the builder: ``Sender[bytes] -> Sender[bytes]``.

    Opening (lock, recovery) happens when the layer is applied; held records are replayed by
    the first ``send`` (or an explicit ``await sender.replay()``).

    Raises:
        SpoolLocked, SpoolError: when applied, if the directory cannot be owned or read.
    """

    def wrap(inner: Sender[bytes]) -> Sender[bytes]:
        return SpoolSender(inner, _open_log(directory, fsync, segment_bytes), fsync)

    return wrap


def _open_log(directory: str | os.PathLike[str], fsync: FsyncPolicy, segment_bytes: int) -> SpoolLog:
    check_policy(fsync)
    return SpoolLog.open(directory, durable=fsync != "never", segment_bytes=segment_bytes)
