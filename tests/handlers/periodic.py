"""A handler for schedule tests: each run appends when it started and ended, and who ran it."""

from __future__ import annotations

import os
import time


def record(payload: dict[str, object]) -> float:
    """Appends ``S <time> <daemon pid>`` to ``payload["path"]``, sleeps ``payload["sleep"]``
    seconds, appends ``E <time> <daemon pid>``; returns the time it started. One ``write`` per
    line on an ``O_APPEND`` file: lines of concurrent runs never mix."""
    path, sleep = str(payload["path"]), float(payload["sleep"])  # type: ignore[arg-type]
    began = time.time()
    _line(path, f"S {began:.6f} {os.getppid()}\n")
    time.sleep(sleep)
    _line(path, f"E {time.time():.6f} {os.getppid()}\n")
    return began


def _line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
