"""The frame wire format: many small messages in one AMQP message (see :mod:`truba.pipes.frame`).

A frame is ``MAGIC`` followed by one msgpack array of the members' bytes, and nothing after it.
``MAGIC`` starts with 0xC1, a byte msgpack never uses, so a frame is never mistaken for a lone
truba message. truba never packs an empty frame, a frame inside a frame, or (given a
``member_key``, the task id) two members with the same key: :func:`members` refuses each of
them, and anything after the array, with :class:`MalformedFrame`, so a crafted frame is
dead-lettered whole instead of running members whose outcomes would be dropped downstream as
duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import msgpack

from truba.pipes.errors import CodecError

MAGIC: Final = b"\xc1TF1"


class MalformedFrame(CodecError):
    """A message starts like a frame but is not one truba packs: a poison message, never run."""


def pack(messages: Sequence[bytes]) -> bytes:
    """One frame holding ``messages``, in order."""
    body: bytes = msgpack.packb(list(messages), use_bin_type=True)
    return MAGIC + body


def unpack(data: bytes) -> list[bytes] | None:
    """The members of a frame, or None if ``data`` is not a well-formed frame."""
    try:
        return members(data)
    except MalformedFrame:
        return None


def members(data: bytes, member_key: Callable[[bytes], str | None] | None = None) -> list[bytes] | None:
    """The members of a frame; None when ``data`` is a lone message (no ``MAGIC``).

    ``member_key`` (e.g. a task message's id; None for a member it cannot read) makes two
    members with the same key malformed.

    Raises:
        MalformedFrame: ``data`` starts with ``MAGIC`` but is not a frame truba packs; the
            message says why.
    """
    if not data.startswith(MAGIC):
        return None
    try:
        found = msgpack.unpackb(data[len(MAGIC) :], raw=False)
    except msgpack.ExtraData:
        raise MalformedFrame("malformed frame: bytes after its members") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedFrame(f"malformed frame: not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(found, list) or not all(isinstance(m, bytes) for m in found):
        raise MalformedFrame("malformed frame: not an array of byte strings")
    if not found:
        raise MalformedFrame("malformed frame: no members")
    keys: dict[str, int] = {}
    for i, member in enumerate(found):
        if member.startswith(MAGIC):
            raise MalformedFrame(f"malformed frame: member {i} is itself a frame")
        key = member_key(member) if member_key is not None else None
        if key is None:
            continue
        if key in keys:
            raise MalformedFrame(f"malformed frame: members {keys[key]} and {i} both have task id {key!r}")
        keys[key] = i
    return found
