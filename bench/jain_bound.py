"""The best Jain's index a placement could reach while some jobs drain: a bound for bench/fairness.py.

With graceful preemption a job whose share fell keeps running its tasks until they end: its
running slots can only fall, one per task end, whatever the planner does (taking its soonest
ending slots is the best it can do). Given those *draining* jobs as they are at a tick, the other
jobs' running slots could at best be placed anyhow: any split of the slots the draining jobs
leave (at most the cluster's less theirs, each job at most its demand). :func:`best_jain` is the
highest Jain's index of running/ideal over all such splits: no choice of which slots to move, and
no number of moves, does better at that tick unless the draining jobs drain faster.

Jain's index of ratios r is (sum r)^2 / (n sum r^2). Maximised over the free ratios r_j in
[0, u_j] with sum x_j r_j <= room (x_j: the job's ideal), its stationary points are
r_j = clamp(c - d x_j, 0, u_j) for a level c and a slope d (d = 0 when the room does not bind,
else the d that uses the room exactly): a one-parameter family, searched over c on a grid, then a
finer one around the best.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]


def jain(ratios: Sequence[float]) -> float:
    """Jain's index of ``ratios`` (1.0: all equal)."""
    total = sum(ratios)
    squares = sum(r * r for r in ratios)
    return total * total / (len(ratios) * squares) if squares > 0 else 0.0


def best_jain(fixed: Sequence[float], free: Sequence[tuple[float, float]], room: float) -> float:
    """The highest Jain's index of ``fixed`` ratios together with one ratio per ``free`` job.

    Args:
        fixed: ratios (running/ideal) of the jobs that cannot change (the draining ones).
        free: (ideal, most slots it could run) per other job; ideal > 0.
        room: slots the free jobs may run in all.
    """
    if not free:
        return jain(fixed)
    x = np.array([ideal for ideal, _ in free], dtype=np.float64)
    u = np.array([most / ideal for ideal, most in free], dtype=np.float64)
    fix = np.array(fixed, dtype=np.float64)
    # At a stationary point c = sum r^2 / sum r <= the largest ratio, and free ratios are <= c:
    # so c is at most the largest fixed ratio (any level will do when none is fixed).
    top = float(fix.max()) if len(fix) and fix.max() > 0 else 1.0
    best, c_best = _search(np.linspace(0.0, top, 101), x, u, fix, room)
    step = top / 100
    finer, _ = _search(np.linspace(max(0.0, c_best - step), c_best + step, 101), x, u, fix, room)
    return max(best, finer)


def _search(levels: Floats, x: Floats, u: Floats, fix: Floats, room: float) -> tuple[float, float]:
    """The best Jain's index over the levels c (and the c), each with its slope d."""
    d = _slopes(levels, x, u, room)
    ratios = np.clip(levels[:, None] - d[:, None] * x[None, :], 0.0, u[None, :])
    total = ratios.sum(axis=1) + fix.sum()
    squares = (ratios * ratios).sum(axis=1) + float((fix * fix).sum())
    n = ratios.shape[1] + len(fix)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(squares > 0, total * total / (n * squares), 0.0)
    i = int(np.argmax(values))
    return float(values[i]), float(levels[i])


def _slopes(levels: Floats, x: Floats, u: Floats, room: float) -> Floats:
    """Per level c, the smallest d >= 0 with sum x clamp(c - d x, 0, u) <= room (bisection)."""

    def used(d: Floats) -> Floats:
        placed = np.clip(levels[:, None] - d[:, None] * x[None, :], 0.0, u[None, :])
        result: Floats = (placed * x[None, :]).sum(axis=1)
        return result

    lo = np.zeros_like(levels)
    hi = np.full_like(levels, float(levels.max() / x.min()) + 1.0)  # c - hi x <= 0: nothing placed
    binding = used(lo) > room
    for _ in range(45):
        mid = (lo + hi) / 2
        over = used(mid) > room
        lo = np.where(over, mid, lo)
        hi = np.where(over, hi, mid)
    return np.where(binding, hi, 0.0)
