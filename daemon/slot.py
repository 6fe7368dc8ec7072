"""The program a slot subprocess runs: ``python -m truba.daemon.slot``.

It reads tasks from its stdin and writes outcomes to the original stdout, one length-prefixed
msgpack frame each: ``[handler, task_id, payload]`` in, ``[task_id, ok, value | [type, message,
traceback], seconds]`` out. The handler's own prints go to stderr (fd 1 is pointed there), so they
cannot corrupt the frames. Imported handlers are cached for the life of the slot.
"""

from __future__ import annotations

import importlib
import os
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import BinaryIO, Final

import msgpack

HEADER: Final = struct.Struct(">I")
PR_SET_PDEATHSIG: Final = 1


class HandlerImportError(Exception):
    """The job's handler could not be imported."""


def read_frame(stream: BinaryIO) -> object | None:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    frame: object = msgpack.unpackb(stream.read(size), raw=False, strict_map_key=False)
    return frame


def write_frame(stream: BinaryIO, obj: object) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def load_handler(handler: str, cache: dict[str, Callable[[object], object]]) -> Callable[[object], object]:
    if handler in cache:
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


def run_one(
    handler: str, task_id: str, payload: object, cache: dict[str, Callable[[object], object]]
) -> bytes:
    started = time.perf_counter()
    try:
        value = load_handler(handler, cache)(payload)
        reply: list[object] = [task_id, True, value, time.perf_counter() - started]
        return msgpack.packb(reply, use_bin_type=True)  # type: ignore[no-any-return]
    except (Exception, SystemExit) as exc:  # the handler's failure is the task's outcome
        if isinstance(exc, TypeError | ValueError | OverflowError) and "value" in locals():
            error = ["ResultNotSerializable", f"the handler's result cannot be sent: {exc}", ""]
        else:
            error = [type(exc).__name__, str(exc), traceback.format_exc()]
        reply = [task_id, False, error, time.perf_counter() - started]
        return msgpack.packb(reply, use_bin_type=True)  # type: ignore[no-any-return]


def die_with_parent() -> None:
    """Asks Linux to SIGKILL this slot when its daemon dies, even by kill -9.

    Otherwise an orphaned slot would compute on until its task ends (it only notices the daemon
    is gone at the next read), and the broker has redelivered that task elsewhere already.
    """
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the EOF on stdin still stops it, later
        return
    if os.getppid() != parent:  # the daemon died before the request took effect
        os._exit(0)


def main() -> int:
    # The daemon decides when a slot stops; Ctrl-C on a terminal must not fail a running task.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the handler's prints go to stderr
    sys.stdout = sys.stderr
    frames_in = sys.stdin.buffer
    cache: dict[str, Callable[[object], object]] = {}
    while True:
        request = read_frame(frames_in)
        if request is None:
            return 0
        if not (isinstance(request, list) and len(request) == 3):
            raise SystemExit(
                f"slot protocol error: expected [handler, task_id, payload], got {request!r:.200}"
            )
        handler, task_id, payload = request
        reply = run_one(str(handler), str(task_id), payload, cache)
        frames_out.write(HEADER.pack(len(reply)) + reply)
        frames_out.flush()


if __name__ == "__main__":
    sys.exit(main())
