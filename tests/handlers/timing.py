"""Handlers that report when they ran, for preemption and scheduling tests."""

from __future__ import annotations

import time


def started_at(seconds: float) -> float:
    """Sleeps ``seconds`` and returns the wall-clock time it started."""
    began = time.time()
    time.sleep(seconds)
    return began
