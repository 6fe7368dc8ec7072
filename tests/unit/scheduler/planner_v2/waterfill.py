"""Water-filling, the two primitives the planner is built from: a fluid level and a unit hand-out.

:func:`level` raises one water level λ over items with weights ``w``, floors ``lo`` and ceilings
``hi``; item *i* holds ``clamp(w[i] * λ, lo[i], hi[i])`` (:func:`at_level`). That is weighted
max-min fairness over one pool: nobody can get more without taking from someone who has less
per unit of weight, floors and ceilings aside.

:func:`distribute` is its integer twin: it hands out whole units one at a time, each to the item
whose next unit has the smallest key (item *i*'s k-th unit has key ``keys[i] + k``), ties to the
lower rank. With ``keys[i] = held - target`` that is the largest-remainder method generalised
to a non-empty start. It answers in O(n log n), not O(units): planning 10,000 slots per call
must not loop per slot.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Final

KEY_DIGITS: Final = 9
"""Keys are rounded to this many decimals, so float noise never decides a tie (ranks do)."""


def level(weights: Sequence[float], lo: Sequence[float], hi: Sequence[float], capacity: float) -> float:
    """The water level λ at which ``sum(at_level(...)) == capacity``; ``inf`` if every ceiling fits.

    Requires ``0 <= lo[i] <= hi[i]``, ``weights[i] > 0`` and ``sum(lo) <= capacity`` (returns
    0.0 when the floors alone fill it). O(n log n): one sort of the 2n breakpoints.
    """
    if sum(hi) <= capacity:
        return math.inf
    # Between breakpoints the total is const + slope * λ; each item starts rising at lo/w and
    # stops at hi/w.
    const = 0.0
    events: list[tuple[float, float, float]] = []
    for w, low, high in zip(weights, lo, hi, strict=True):
        const += low
        events.append((low / w, w, -low))
        events.append((high / w, -w, high))
    if const >= capacity:
        return 0.0
    events.sort()
    slope = 0.0
    for at, d_slope, d_const in events:
        if slope > 0 and const + slope * at >= capacity:
            return (capacity - const) / slope
        slope += d_slope
        const += d_const
    return math.inf  # unreachable: sum(hi) > capacity


def at_level(weight: float, lo: float, hi: float, lam: float) -> float:
    """What one item holds at water level ``lam``."""
    return min(hi, max(lo, weight * lam))


def distribute(
    keys: Sequence[float], room: Sequence[int], total: int, ranks: Sequence[int] | None = None
) -> list[int]:
    """Units per item: ``total`` units, each to the smallest next key, at most ``room[i]`` to item i.

    Ties go to the smaller ``ranks[i]`` (default: the index). If the rooms add up to less than
    ``total``, every item gets its room. The result equals handing out units one by one from a
    heap (the fallback, used only if float rounding upsets the fast path's counts).
    """
    n = len(keys)
    rank = list(range(n)) if ranks is None else list(ranks)
    room = [max(0, r) for r in room]
    if total <= 0:
        return [0] * n
    if sum(room) <= total:
        return room
    quantised = [round(k, KEY_DIGITS) for k in keys]
    # The fluid level θ at which sum(clamp(θ - key, 0, room)) == total; one below it, every
    # item's units with key < θ fit, and at most one more per item lies in [θ, θ + 1).
    theta = _fluid_level(quantised, room, total) - 1.0
    counts = [min(r, max(0, math.ceil(theta - k))) for k, r in zip(quantised, room, strict=True)]
    left = total - sum(counts)
    nexts = [
        (round(quantised[i] + counts[i], KEY_DIGITS), rank[i], i)
        for i in range(n)
        if counts[i] < room[i] and quantised[i] + counts[i] < theta + 1.0
    ]
    if not 0 <= left <= len(nexts):
        return _by_heap(quantised, room, total, rank)
    for _, _, i in sorted(nexts)[:left]:
        counts[i] += 1
    return counts


def _fluid_level(keys: Sequence[float], room: Sequence[int], total: int) -> float:
    const = 0.0
    slope = 0
    events: list[tuple[float, int, float]] = []
    for k, r in zip(keys, room, strict=True):
        if r > 0:
            events.append((k, 1, -k))
            events.append((k + r, -1, k + r))
    events.sort()
    for at, d_slope, d_const in events:
        if slope > 0 and const + slope * at >= total:
            return (total - const) / slope
        slope += d_slope
        const += d_const
    return math.inf  # unreachable: sum(room) > total


def _by_heap(keys: Sequence[float], room: Sequence[int], total: int, rank: Sequence[int]) -> list[int]:
    counts = [0] * len(keys)
    heap = [(keys[i], rank[i], i) for i in range(len(keys)) if room[i] > 0]
    heapq.heapify(heap)
    for _ in range(total):
        if not heap:
            break
        _, r, i = heapq.heappop(heap)
        counts[i] += 1
        if counts[i] < room[i]:
            heapq.heappush(heap, (round(keys[i] + counts[i], KEY_DIGITS), r, i))
    return counts
