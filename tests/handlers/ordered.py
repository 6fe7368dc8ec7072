"""A handler for per-key order tests: it writes when each attempt of a keyed task starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.handlers.flaky import Busy


def run(payload: list[object]) -> list[object]:
    """``[log path, key, seq, seconds]`` or ``[..., "busy once"]``: appends ``key seq start_ns``
    to the log (every attempt, killed ones too), sleeps ``seconds``, raises ``Busy`` at the
    first attempt of a task marked busy once, and returns ``[key, seq, start_ns, end_ns]``
    (``time.monotonic_ns``: one clock for every process of the machine)."""
    path, key, seq, seconds, *busy = payload
    start = time.monotonic_ns()
    descriptor = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, f"{key} {seq} {start}\n".encode())  # one write: lines never mix
    finally:
        os.close(descriptor)
    if seconds:
        time.sleep(float(seconds))  # type: ignore[arg-type]
    if busy:
        tried = Path(f"{path}.{key}.{seq}.tried")
        if not tried.exists():
            tried.touch()
            raise Busy(f"{key} {seq}: busy, try again")
    return [key, seq, start, time.monotonic_ns()]
