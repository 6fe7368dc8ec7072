"""Capped exponential backoff with full jitter, the one retry policy of truba.

The pipes' retry and reopen layers, the daemon's scheduler link, the scheduler's queue janitor
and the client's lifecycle calls all wait between tries with a :class:`Backoff`. The clock
(``sleep``) and the randomness (``rng``) are injected, so tests run without real waits.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff: attempt ``n`` waits a random time in ``[0, min(cap, base·2ⁿ)]``.

    ``attempts`` bounds the tries (None: forever). ``sleep`` and ``rng`` are injectable.
    """

    attempts: int | None = 5
    base: float = 0.05
    cap: float = 5.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: Callable[[float, float], float] = field(default=random.uniform)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after try number ``attempt`` (0-based) failed."""
        return self.rng(0.0, min(self.cap, self.base * 2 ** min(attempt, 60)))

    def gives_up_after(self, attempt: int) -> bool:
        """True when try number ``attempt`` (0-based) was the last one allowed."""
        return self.attempts is not None and attempt + 1 >= self.attempts
