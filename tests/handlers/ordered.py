"""A handler for per-key order tests: it writes when each attempt of a keyed task starts."""

from __future__ import annotations

import os
import time


def run(payload: list[object]) -> list[object]:
    """``[log path, key, seq, seconds]``: appends ``key seq start_ns`` to the log (every attempt,
    killed ones too), sleeps ``seconds``, and returns ``[key, seq, start_ns, end_ns]``
    (``time.monotonic_ns``: one clock for every process of the machine)."""
    path, key, seq, seconds = payload
    start = time.monotonic_ns()
    descriptor = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, f"{key} {seq} {start}\n".encode())  # one write: lines never mix
    finally:
        os.close(descriptor)
    if seconds:
        time.sleep(float(seconds))  # type: ignore[arg-type]
    return [key, seq, start, time.monotonic_ns()]
