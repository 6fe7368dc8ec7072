from __future__ import annotations

import random

from truba.backoff import Backoff
from truba.daemon.control import RECONNECT_BACKOFF


def test_backoff_is_full_jitter_bounded_by_the_cap() -> None:
    assert (RECONNECT_BACKOFF.base, RECONNECT_BACKOFF.cap, RECONNECT_BACKOFF.attempts) == (0.2, 10.0, None)
    backoff = Backoff(base=0.2, cap=10.0, rng=random.Random(7).uniform)
    delays = [backoff.delay(attempt) for attempt in range(12) for _ in range(20)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert max(backoff.delay(0) for _ in range(100)) <= 0.2
    # Jitter: repeated attempts at the same level do not all wait the same time.
    assert len({round(backoff.delay(5), 6) for _ in range(20)}) > 10


def test_backoff_grows_until_the_cap() -> None:
    upper = Backoff(base=0.2, cap=10.0, rng=lambda lo, hi: hi)
    assert [upper.delay(a) for a in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
