"""The handler of bench/slot_overhead.py, imported by the slots as ``bench.spin_handler``."""

from __future__ import annotations

import time


def spin(seconds: float) -> float:
    """Busy-waits ``seconds`` (the handler under test; runs in slots, imported by name)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return seconds
