"""The heartbeat interval a cluster is asked for, within the scheduler's heartbeat budget.

Every heartbeat costs the scheduler gRPC's per-message work (about 0.2-0.3 ms of CPU on a small
machine, most of it in grpc.aio and its C core, whatever the heartbeat says), so 10,000 daemons at
1 s would take several cores. Above ``budget × base`` daemons, each is asked for the smallest
multiple of the configured interval that keeps all heartbeats within the budget.
"""

from __future__ import annotations

import math
from typing import Final

DEFAULT_HEARTBEAT_BUDGET: Final = 2000.0
"""Heartbeats per second all daemons together send at most, by default: 2,000 daemons at 1 s
cost the scheduler about half a core."""


def interval_for(daemons: int, base: float, budget: float) -> float:
    """The interval ``daemons`` daemons are asked for: ``base``, or when their heartbeats would
    exceed ``budget`` per second (0: no budget) the smallest multiple of ``base`` that keeps them
    within (10,000 daemons, 1 s, 2,000/s: 5 s)."""
    if budget <= 0 or daemons <= budget * base:
        return base
    return math.ceil(daemons / budget / base - 1e-9) * base
