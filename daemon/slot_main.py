"""The program a slot subprocess runs: ``python -m truba.daemon.slot_main``.

It reads requests from its stdin and writes replies to the original stdout, one length-prefixed
msgpack frame each. The handler's own prints go to stderr (fd 1 is pointed there), so they cannot
corrupt the frames. Imported handlers are cached for the life of the slot. Requests, told apart by
their length:

- one task: ``[handler, task_id, payload]`` in, ``[task_id, ok, value | [type, message,
  traceback, [class names]], seconds]`` out (the names of the exception's classes, its MRO);
- describe: ``[handler]`` in, ``[max_size, max_wait]`` out for a batch handler (see
  :mod:`truba.handlers`), ``None`` for any other or one that cannot be imported (its tasks then
  report the import error, one by one, as before);
- ping: ``[]`` in, ``[]`` out (the daemon's :meth:`~truba.daemon.slot_process.SlotProcess.warm`:
  the slot is up);
- a batch: ``[handler, [[task_id, payload], ...]]`` in, ``[reply, ...]`` out, one single-task
  reply per task, in order. The handler is called once with the list of payloads; if it raises
  or returns the wrong number of results, every task of the batch gets that error.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import BinaryIO, Final

from truba import codec, trace
from truba.handlers import batch_spec

HEADER: Final = struct.Struct(">I")
LARGE_FRAME: Final = 64 * 1024
"""A frame at least this long is written after its header, not copied behind it."""
PR_SET_PDEATHSIG: Final = 1
PING_REQUEST: Final = codec.packb([])
"""A ping's request frame, and its reply."""


class HandlerImportError(Exception):
    """The job's handler could not be imported."""


def read_frame(stream: BinaryIO) -> object | None:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    frame: object = codec.unpackb(stream.read(size))
    return frame


def write_frame(stream: BinaryIO, obj: object) -> None:
    data = codec.packb(obj)
    _write(stream, data)
    stream.flush()


def _write(stream: BinaryIO, data: bytes | list[bytes]) -> None:
    """One frame: its header and ``data`` (a large one after the header, not copied behind it),
    or the frame in parts (:func:`truba.codec.pack_parts`: a large result, each part as it is)."""
    if isinstance(data, list):
        stream.write(HEADER.pack(sum(map(len, data))))
        for part in data:
            stream.write(part)
    elif len(data) < LARGE_FRAME:
        stream.write(HEADER.pack(len(data)) + data)
    else:
        stream.write(HEADER.pack(len(data)))
        stream.write(data)


PICKLE_SUFFIX: Final = "|pickle"
"""Ends the handler name of a request whose payloads are pickled (a job with ``codec="pickle"``
on a daemon started with ``--allow-pickle``; a handler name itself never holds a ``|``): the
slot unpickles each payload and pickles each result."""


def load_handler(handler: str, cache: dict[str, Callable[[object], object]]) -> Callable[[object], object]:
    if handler in cache:
        return cache[handler]
    if handler.endswith(PICKLE_SUFFIX):
        cache[handler] = pickling(load_handler(handler.removesuffix(PICKLE_SUFFIX), cache))
        return cache[handler]
    module_name, _, function_name = handler.partition(":")
    try:
        module = importlib.import_module(module_name)
        function = getattr(module, function_name)
    except Exception as exc:
        raise HandlerImportError(f"cannot import handler {handler!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(function):
        raise HandlerImportError(f"handler {handler!r} is not callable")
    cache[handler] = function
    return cache[handler]


def pickling(function: Callable[[object], object]) -> Callable[[object], object]:
    """``function`` taking pickled payloads and returning pickled results (a batch handler's
    each, its batch spec kept)."""
    if batch_spec(function) is not None:

        @functools.wraps(function)
        def batch(payloads: object) -> object:
            assert isinstance(payloads, list)
            values = _batch_values(function, [codec.unpickled(payload) for payload in payloads])
            return [codec.pickled(value) for value in values]

        return batch

    @functools.wraps(function)
    def one(payload: object) -> object:
        return codec.pickled(function(codec.unpickled(payload)))

    return one


def describe(handler: str, cache: dict[str, Callable[[object], object]]) -> list[object] | None:
    """``[max_size, max_wait]`` for a batch handler, else None (an import error included)."""
    try:
        spec = batch_spec(load_handler(handler, cache))
    except HandlerImportError:
        return None
    return None if spec is None else [spec.max_size, spec.max_wait]


def run_one(
    handler: str, task_id: str, payload: object, cache: dict[str, Callable[[object], object]]
) -> bytes | list[bytes]:
    """The reply frame to one task; a large value's in parts (see :func:`_write`)."""
    started = time.perf_counter()
    try:
        function = load_handler(handler, cache)
        if batch_spec(function) is not None:  # a batch handler asked for one task: a batch of one
            value = _batch_values(function, [payload])[0]
        else:
            value = function(payload)
        reply: list[object] = [task_id, True, value, time.perf_counter() - started]
        return codec.pack_parts(reply) if codec.is_large(value) else codec.packb(reply)
    except (Exception, SystemExit) as exc:  # the handler's failure is the task's outcome
        error: list[object]
        if isinstance(exc, TypeError | ValueError | OverflowError) and "value" in locals():
            error = ["ResultNotSerializable", f"the handler's result cannot be sent: {exc}", ""]
        else:
            error = error_of(exc)
        reply = [task_id, False, error, time.perf_counter() - started]
        return codec.packb(reply)


def error_of(exc: BaseException) -> list[object]:
    """A handler's error as a reply carries it: type, message, traceback, and the names of the
    exception's classes (``module.Qualname``, builtins bare), so ``retry_on`` matches subclasses."""
    kinds = [
        kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        for kind in type(exc).__mro__
        if kind is not object
    ]
    return [type(exc).__name__, str(exc), traceback.format_exc(), kinds]


class BatchResultMismatch(Exception):
    """A batch handler returned something other than one result per payload."""


def _batch_values(function: Callable[[object], object], payloads: list[object]) -> list[object]:
    values = function(payloads)
    if not isinstance(values, list | tuple) or len(values) != len(payloads):
        got = f"{len(values)} results" if isinstance(values, list | tuple) else type(values).__name__
        raise BatchResultMismatch(f"the batch handler got {len(payloads)} tasks and returned {got}")
    return list(values)


def run_batch(handler: str, tasks: list[object], cache: dict[str, Callable[[object], object]]) -> bytes:
    """One call of the batch handler for ``tasks`` (``[task_id, payload]`` pairs); one reply each.

    Each reply carries the task's share of the call's time. A result that cannot be sent fails
    only its own task.
    """
    started = time.perf_counter()
    pairs = [(str(pair[0]), pair[1]) for pair in tasks if isinstance(pair, list) and len(pair) == 2]
    if len(pairs) != len(tasks):
        raise SystemExit(f"slot protocol error: expected [[task_id, payload], ...], got {tasks!r:.200}")
    try:
        values = _batch_values(load_handler(handler, cache), [payload for _, payload in pairs])
    except (Exception, SystemExit) as exc:  # the handler's failure is every task's outcome
        error = error_of(exc)
        share = (time.perf_counter() - started) / max(1, len(pairs))
        replies: list[object] = [[task_id, False, error, share] for task_id, _ in pairs]
        return codec.packb(replies)
    share = (time.perf_counter() - started) / max(1, len(pairs))
    packed = []
    for (task_id, _), value in zip(pairs, values, strict=True):
        try:
            packed.append(codec.packb([task_id, True, value, share]))
        except (TypeError, ValueError, OverflowError) as exc:
            error = ["ResultNotSerializable", f"the handler's result cannot be sent: {exc}", ""]
            packed.append(codec.packb([task_id, False, error, share]))
    # The replies are packed one by one (so one bad value fails one task); join them as an array.
    return _array_header(len(packed)) + b"".join(packed)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def die_with_parent(parent: int | None = None) -> None:
    """Asks Linux to SIGKILL this slot when its daemon dies, even by kill -9.

    Otherwise an orphaned slot would compute on until its task ends (it only notices the daemon
    is gone at the next read), and the broker has redelivered that task elsewhere already.
    ``parent`` is the pid the parent had before this process started (a forked slot knows its
    template's); if it is gone already, exit now.
    """
    parent = os.getppid() if parent is None else parent
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the EOF on stdin still stops it, later
        return
    if os.getppid() != parent:  # the daemon died before the request took effect
        os._exit(0)


def main(parent: int | None = None) -> int:
    """Serves requests until EOF; ``parent``: see :func:`die_with_parent`."""
    # The daemon decides when a slot stops; Ctrl-C on a terminal must not fail a running task.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the handler's prints go to stderr
    sys.stdout = sys.stderr
    frames_in = sys.stdin.buffer
    cache: dict[str, Callable[[object], object]] = {}
    while True:
        request = read_frame(frames_in)
        if request is None:
            trace.flush()  # a forked slot leaves without running atexit
            return 0
        if isinstance(request, list) and len(request) == 3:
            handler, task_id, payload = request
            if trace.enabled:
                trace.mark("slot.start", str(task_id))
            reply = run_one(str(handler), str(task_id), payload, cache)
            if trace.enabled:
                trace.mark("slot.done", str(task_id))
        elif isinstance(request, list) and len(request) == 2 and isinstance(request[1], list):
            reply = run_batch(str(request[0]), request[1], cache)
        elif isinstance(request, list) and len(request) == 1:
            reply = codec.packb(describe(str(request[0]), cache))
        elif request == []:
            reply = PING_REQUEST
        else:
            raise SystemExit(f"slot protocol error: unknown request {request!r:.200}")
        _write(frames_out, reply)
        frames_out.flush()


if __name__ == "__main__":
    sys.exit(main())
