"""The pipe error hierarchy: every failure a pipe reports is one of these.

::

    TrubaError
     └─ PipeError                 retryable: ClassVar[bool] = False
         ├─ PipeClosed            closed by its owner; using it again is a bug; never retried
         ├─ PipeBroken            transport failed under us; retryable; reopen fixes it
         │   ├─ ConnectionLost
         │   └─ ChannelLost
         ├─ SendTimeout           (also a TimeoutError) a bounded wait expired; retryable
         ├─ MessageRejected       broker nack or unroutable return; the message is still ours
         ├─ MessageTooLarge       refused before sending: over the configured size limit
         ├─ CodecError            encode/decode failed: a poison message, never retried
         └─ SpoolError            the disk buffer could not write: not spooled, not sent
             ├─ SpoolFull         its file system is full (or over quota)
             └─ SpoolLocked       another owner holds its directory

Foreign (AMQP) exceptions are translated once, in :mod:`truba.pipes.rabbit`; nothing else catches
them. Retryability is a property of the error class, so policies need not know the transport.
"""

from __future__ import annotations

from typing import ClassVar

from truba.errors import TrubaError


class PipeError(TrubaError):
    """A pipe failed to send or receive."""

    retryable: ClassVar[bool] = False


class PipeClosed(PipeError):
    """The pipe was closed by its owner; using it again is a bug, never retried."""


class PipeBroken(PipeError):
    """The transport failed under us. The pipe stays broken; reopening gives a fresh one."""

    retryable = True


class ConnectionLost(PipeBroken):
    """The broker connection is gone (closed, reset, heartbeat missed, refused)."""


class ChannelLost(PipeBroken):
    """The AMQP channel was closed by the broker (e.g. PRECONDITION_FAILED, unknown delivery tag)."""


class SendTimeout(PipeError, TimeoutError):
    """A bounded wait (confirm, connect, blocked connection) expired; the message is still ours."""

    retryable = True


class MessageRejected(PipeError):
    """The broker nacked or returned (unroutable) a message; it is still ours to send again."""

    def __init__(self, message: str, *, unroutable: bool = False) -> None:
        super().__init__(message)
        self.unroutable = unroutable
        """Returned because no queue took it (the queue is missing), rather than nacked."""


class MessageTooLarge(PipeError):
    """A message exceeds the configured size limit; refused before anything was sent."""


class CodecError(PipeError):
    """A message could not be encoded or decoded: poison, never retried."""


class SpoolError(PipeError):
    """The disk buffer could not write its log: the message was not spooled and not sent."""


class SpoolFull(SpoolError):
    """The spool's file system is full (or over quota); the message was not spooled and not sent."""


class SpoolLocked(SpoolError):
    """Another process (or another SpoolSender in this one) owns the spool directory."""
