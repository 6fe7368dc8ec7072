"""msgpack with truba's extension types: the values payloads and results may hold.

Besides msgpack's own values (None, bool, int, float, str, bytes, lists, dicts), these travel as
msgpack extension types and come back as what they were:

======  ==========================  ==================================================
code    type                        data
======  ==========================  ==================================================
1       ``datetime.datetime``       ISO 8601 text; aware ones keep their UTC offset (a
                                    ``ZoneInfo`` comes back as a fixed offset), naive
                                    ones stay naive
2       ``datetime.date``           ISO 8601 text
3       ``uuid.UUID``               its 16 bytes
4       ``decimal.Decimal``         its text (exact, NaN and infinities included)
5       ``numpy.ndarray``           dtype, shape, then the array's bytes (C order)
6       a pickled value             ``pickle.dumps(value)``: never unpickled by
                                    :func:`unpackb`; only a job created with
                                    ``codec="pickle"`` wraps its payloads and results
                                    in it (:func:`pickled`, :func:`unpickled`), and
                                    only daemons started with ``--allow-pickle`` run it
======  ==========================  ==================================================

numpy arrays need numpy on both sides. They are encoded from the array's own buffer (one copy,
into the message) and decoded without a copy: the array is a read-only view of the message's
bytes (``.copy()`` makes a writable one). Arrays of Python objects cannot be sent (use the
pickle codec); numpy scalars travel as the Python number they hold. A process without numpy (a
daemon that only passes tasks on) keeps an array as an opaque ``msgpack.ExtType`` and sends it on
unchanged; so does any process for an extension code it does not know.
"""

from __future__ import annotations

import datetime
import decimal
import pickle
import struct
import sys
import threading
import uuid
from collections.abc import Sequence
from typing import Any, Final

import msgpack

__all__ = [
    "DATE",
    "DATETIME",
    "DECIMAL",
    "NDARRAY",
    "PICKLED",
    "UUID",
    "NotPickled",
    "default",
    "ext_hook",
    "pack_parts",
    "packb",
    "pickled",
    "unpackb",
    "unpickled",
]

DATETIME: Final = 1
DATE: Final = 2
UUID: Final = 3
DECIMAL: Final = 4
NDARRAY: Final = 5
PICKLED: Final = 6
_DIMS: Final = struct.Struct("<B")
_DIM: Final = struct.Struct("<Q")


def default(obj: object) -> msgpack.ExtType | object:
    """The extension form of ``obj`` (msgpack calls this for what it cannot pack itself).

    Raises:
        TypeError: a type truba does not send (the message names it).
    """
    if isinstance(obj, datetime.datetime):
        return msgpack.ExtType(DATETIME, obj.isoformat().encode())
    if isinstance(obj, datetime.date):
        return msgpack.ExtType(DATE, obj.isoformat().encode())
    if isinstance(obj, uuid.UUID):
        return msgpack.ExtType(UUID, obj.bytes)
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(DECIMAL, str(obj).encode())
    numpy = sys.modules.get("numpy")  # an array exists only where numpy was imported
    if numpy is not None:
        if isinstance(obj, numpy.ndarray):
            return _array_ext(numpy, obj)
        if isinstance(obj, numpy.generic):
            return obj.item()
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def _array_ext(numpy: Any, array: Any) -> msgpack.ExtType:
    if array.dtype.hasobject:
        raise TypeError("numpy arrays of Python objects cannot be sent as msgpack (use codec='pickle')")
    if not array.flags.c_contiguous:  # (ascontiguousarray would make a 0-d array 1-d)
        array = array.copy(order="C")
    dtype = array.dtype.str.encode()  # e.g. b"<f8": byte order, kind, size
    head = (
        _DIMS.pack(len(dtype)) + dtype + _DIMS.pack(array.ndim) + b"".join(_DIM.pack(n) for n in array.shape)
    )
    body = memoryview(array.reshape(-1).view(numpy.uint8))  # the array's own bytes, not a copy
    return msgpack.ExtType(NDARRAY, b"".join((head, body)))


def ext_hook(code: int, data: bytes) -> object:
    """The value of an extension (msgpack calls this while unpacking); unknown ones stay ExtType."""
    if code == DATETIME:
        return datetime.datetime.fromisoformat(data.decode())
    if code == DATE:
        return datetime.date.fromisoformat(data.decode())
    if code == UUID:
        return uuid.UUID(bytes=data)
    if code == DECIMAL:
        return decimal.Decimal(data.decode())
    if code == NDARRAY:
        try:
            import numpy
        except ImportError:
            return msgpack.ExtType(code, data)
        return _array(numpy, data)
    return msgpack.ExtType(code, data)


def _array(numpy: Any, data: bytes) -> object:
    (size,) = _DIMS.unpack_from(data, 0)
    dtype = numpy.dtype(data[1 : 1 + size].decode())
    at = 1 + size
    (ndim,) = _DIMS.unpack_from(data, at)
    at += 1
    shape = tuple(_DIM.unpack_from(data, at + i * _DIM.size)[0] for i in range(ndim))
    at += ndim * _DIM.size
    return numpy.frombuffer(data, dtype=dtype, offset=at).reshape(shape)


_packers = threading.local()
"""This thread's packer, as ``packer`` (see :func:`packb`)."""


def packb(obj: object) -> bytes:
    """``obj`` as msgpack with truba's extension types.

    One packer per thread, kept: ``msgpack.packb`` makes a packer per call, which costs several
    times the packing of a small message (every task and every result is packed once). Per
    thread because a packer is not thread-safe (``default`` is Python code: another thread may
    run while it does); :func:`default` never packs, so a packer is never entered twice.

    Raises:
        TypeError, ValueError, OverflowError: ``obj`` holds something that cannot be sent.
    """
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, default=default, autoreset=True)
    packed: bytes = packer.pack(obj)  # on an error the packer drops what it had packed
    return packed


LARGE: Final = 64 * 1024
"""A ``bytes`` or extension value at least this long is packed by reference (see :func:`pack_parts`)."""
_BIN32: Final = struct.Struct(">BI")
_EXT32: Final = struct.Struct(">BIb")


def is_large(value: object) -> bool:
    """``value`` is a ``bytes`` or an extension (a pickled value) of :data:`LARGE` bytes or more:
    :func:`pack_parts` does not copy it (one type check on the hot path of small messages)."""
    if type(value) is bytes:
        return len(value) >= LARGE
    return isinstance(value, msgpack.ExtType) and type(value.data) is bytes and len(value.data) >= LARGE


def pack_parts(items: Sequence[object]) -> list[bytes]:
    """``packb(list(items))``, in parts whose concatenation is exactly those bytes: each large
    ``bytes`` item (:data:`LARGE` or longer), or large extension (a pickled value), is a part of
    its own, the very object, not a copy.

    So a 1 MB payload is copied once to join the parts of a message (``b"".join``), not twice
    (msgpack's buffer, then the ``bytes`` it returns), or not at all where the parts are written
    one after the other (a slot's pipe). Smaller items are packed together as ``packb`` does.

    Raises:
        TypeError, ValueError, OverflowError: an item cannot be sent (as :func:`packb`).
    """
    parts: list[bytes] = []
    small: list[object] = []
    n = len(items)
    head = (
        bytes([0x90 | n])
        if n < 16
        else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
    )
    for item in items:
        if not is_large(item):
            small.append(item)
            continue
        if type(item) is bytes:
            parts.append(b"".join([head, *map(packb, small), _BIN32.pack(0xC6, len(item))]))
            parts.append(item)
        else:
            assert isinstance(item, msgpack.ExtType)
            parts.append(b"".join([head, *map(packb, small), _EXT32.pack(0xC9, len(item.data), item.code)]))
            parts.append(item.data)
        head, small = b"", []
    if head or small:
        parts.append(b"".join([head, *map(packb, small)]))
    return parts


def unpackb(data: bytes) -> Any:
    """The value of ``data`` (msgpack with truba's extension types).

    Raises:
        Exception: msgpack raises several unrelated types on garbage; callers translate them.
    """
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=ext_hook)


class NotPickled(TypeError):
    """A value of a pickle job that is not a pickled value."""


def pickled(value: object) -> msgpack.ExtType:
    """``value`` pickled, as the extension a pickle job's payloads and results travel in.

    Raises:
        pickle.PicklingError, TypeError, AttributeError: ``value`` cannot be pickled.
    """
    return msgpack.ExtType(PICKLED, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def unpickled(value: object) -> Any:
    """The value a pickled extension holds. This runs code of the pickle's choosing: call it
    only on values of a job that asked for pickle, in a process that allows it.

    Raises:
        NotPickled: ``value`` is not a pickled extension.
        Exception: what unpickling raises (a module that cannot be imported, ...).
    """
    if not (isinstance(value, msgpack.ExtType) and value.code == PICKLED):
        raise NotPickled(f"a pickle job's values must be pickled, got {type(value).__name__}")
    return pickle.loads(value.data)  # noqa: S301 (the point of the pickle codec; see above)
