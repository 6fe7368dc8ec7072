"""Waiting in tests: poll a condition until it holds, with a deadline (never a bare sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(
    condition: Callable[[], object], timeout: float = 10.0, what: str = "condition", every: float = 0.01
) -> None:
    """Returns once ``condition()`` is true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"{what} not reached within {timeout} s")
