"""The frame wire format: many small messages in one AMQP message (see :mod:`truba.pipes.frame`).

A frame is ``MAGIC`` followed by a msgpack array of the members' bytes. ``MAGIC`` starts with
0xC1, a byte msgpack never uses, so a frame is never mistaken for a lone truba message; a message
that starts with it but does not unpack is passed on as it is (the deserialize layer dead-letters
it as poison).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgpack

MAGIC: Final = b"\xc1TF1"


def pack(messages: Sequence[bytes]) -> bytes:
    """One frame holding ``messages``, in order."""
    body: bytes = msgpack.packb(list(messages), use_bin_type=True)
    return MAGIC + body


def unpack(data: bytes) -> list[bytes] | None:
    """The members of a frame, or None if ``data`` is not a well-formed frame."""
    if not data.startswith(MAGIC):
        return None
    try:
        members = msgpack.unpackb(data[len(MAGIC) :], raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(members, list) or not all(isinstance(m, bytes) for m in members):
        return None
    return members
