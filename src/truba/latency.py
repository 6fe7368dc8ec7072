"""Outcome latency: the seconds from a task's submission to the moment its outcome was taken,
counted in fixed buckets (a histogram), as the client measures it and the scheduler exports it.

The buckets are fixed (:data:`BOUNDS`, 5 ms to 1 h), the same in every client and scheduler, so
counts add up across reports and the scheduler exports them as a Prometheus histogram as they
are. Counts are per bucket (not cumulative): ``counts[i]`` is the outcomes with a latency at
most ``BOUNDS[i]`` and above the bound before it; the last one counts those above the last bound.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Final, final

BOUNDS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
"""Upper bounds of the buckets, seconds (Prometheus' ``le``); one more bucket holds the rest."""
BUCKETS: Final = len(BOUNDS) + 1


@final
class LatencyCounts:
    """Outcomes counted by latency bucket, and the sum of their latencies in seconds."""

    __slots__ = ("counts", "sum")

    def __init__(self, counts: Sequence[int] | None = None, total: float = 0.0) -> None:
        if counts is not None and len(counts) != BUCKETS:
            raise ValueError(f"latency counts: {BUCKETS} buckets expected, got {len(counts)}")
        self.counts: list[int] = [0] * BUCKETS if counts is None else list(counts)
        self.sum = total

    def observe(self, seconds: float) -> None:
        """One outcome ``seconds`` after its submission (the task path: a bisect and two adds)."""
        self.counts[bisect_left(BOUNDS, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        """Outcomes counted."""
        return sum(self.counts)

    def copy(self) -> LatencyCounts:
        return LatencyCounts(self.counts, self.sum)

    def __add__(self, other: LatencyCounts) -> LatencyCounts:
        return LatencyCounts(
            [a + b for a, b in zip(self.counts, other.counts, strict=True)], self.sum + other.sum
        )

    def __sub__(self, other: LatencyCounts) -> LatencyCounts:
        """The outcomes counted here and not in ``other`` (an earlier state of the same counts)."""
        counts = [max(0, a - b) for a, b in zip(self.counts, other.counts, strict=True)]
        return LatencyCounts(counts, max(0.0, self.sum - other.sum))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LatencyCounts) and (self.counts, self.sum) == (other.counts, other.sum)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LatencyCounts({self.counts!r}, {self.sum!r})"

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, outcomes at most le)`` per bound, then ``("+Inf", all)``: Prometheus' buckets."""
        buckets, seen = [], 0
        for bound, count in zip((*BOUNDS, float("inf")), self.counts, strict=True):
            seen += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), seen))
        return buckets

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) estimated as Prometheus' ``histogram_quantile`` does:
        linearly within its bucket (from 0 in the first); in the last bucket, the last bound.
        None when nothing was counted."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q: must be 0..1, got {q}")
        total = self.count
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if index == len(BOUNDS):
                    return BOUNDS[-1]
                lower = BOUNDS[index - 1] if index else 0.0
                return lower + (BOUNDS[index] - lower) * max(0.0, rank - seen) / count
            seen += count
        return BOUNDS[-1]
