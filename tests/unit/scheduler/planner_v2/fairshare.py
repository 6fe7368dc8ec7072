"""Weighted max-min fair shares when each job may use only some pools of slots.

A *pool* is the daemons that allow the same handlers (thousands of daemons share a few
``--allow`` lists, so there are few pools). Job *j* may use the pools in ``eligible[j]``, wants
between ``lo[j]`` and ``hi[j]`` slots, and weighs ``weights[j]`` (its importance).

On one pool this is plain water-filling (:func:`truba.scheduler.waterfill.level`). Over several
it is *progressive filling*: raise one level λ for every job until some set of pools S is full
with the jobs that can use nothing else; those jobs keep what they have at that λ (they cannot
grow, and growing anyone else there would take from them), S leaves the game, and the rest
fill on. This is the weighted lexicographically max-min fair allocation of the fluid problem.

The full set S is found by Newton's method over a max-flow: check whether every job can hold
its share at λ (a flow from jobs to pools); if not, the pools reachable in the residual graph
are a set that is over-subscribed (Hall's condition fails there), so lower λ to the level that
exactly fills it, and check again. Jobs with the same eligible pools are one node, so the
network has (distinct eligibility sets + pools) nodes whatever the number of jobs and daemons.

Floors (min_slots) come first: if they do not all fit, the floors themselves are shared max-min
fairly (nobody's floor is honoured in full at the expense of another's entirely), and jobs
without one get what the floors leave.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tests.unit.scheduler.planner_v2.waterfill import at_level, level

Eligibility = frozenset[int]


@dataclass(frozen=True)
class Shares:
    """Fair shares: per job in total and per pool, and the pools in the order they filled."""

    targets: list[float]
    by_pool: list[dict[int, float]]
    """How each job's target splits over pools (one valid split; used to place free slots)."""
    fill_order: list[int]
    """HandlerPools, those that filled up first (the most contended) first."""


def fair_shares(
    weights: Sequence[float],
    lo: Sequence[float],
    hi: Sequence[float],
    eligible: Sequence[Eligibility],
    capacity: Sequence[float],
) -> Shares:
    """Weighted max-min fair shares of pools with ``capacity``; see the module docstring.

    Requires ``0 <= lo[j] <= hi[j]`` and ``weights[j] > 0``; a job with no eligible pool gets 0.
    """
    floors = list(lo)
    if any(floors) and not _fits(floors, eligible, capacity):
        floors = _fill(weights, [0.0] * len(floors), floors, eligible, capacity).targets
    return _fill(weights, floors, hi, eligible, capacity)


def _fits(amounts: Sequence[float], eligible: Sequence[Eligibility], capacity: Sequence[float]) -> bool:
    pools = frozenset(range(len(capacity)))
    network = _Network(amounts, eligible, range(len(amounts)), pools, capacity)
    return network.flow >= sum(amounts) - _tolerance(capacity, pools)


def _tolerance(capacity: Sequence[float], pools: frozenset[int]) -> float:
    return 1e-9 * (1.0 + sum(capacity[p] for p in pools))


def _fill(
    weights: Sequence[float],
    lo: Sequence[float],
    hi: Sequence[float],
    eligible: Sequence[Eligibility],
    capacity: Sequence[float],
) -> Shares:
    n = len(weights)
    targets = [0.0] * n
    by_pool: list[dict[int, float]] = [{} for _ in range(n)]
    fill_order: list[int] = []
    pools = frozenset(p for p in range(len(capacity)) if capacity[p] > 0)
    active = [j for j in range(n) if eligible[j] & pools and hi[j] > 0]

    def level_of(jobs: Sequence[int], room: float) -> float:
        return level([weights[j] for j in jobs], [lo[j] for j in jobs], [hi[j] for j in jobs], room)

    while active:
        full = pools
        members = active
        lam = level_of(active, sum(capacity[p] for p in pools))
        network: _Network | None = None
        if not all(eligible[j] >= pools for j in active):
            for _ in range(len(pools) + 1):
                amounts = [0.0] * n
                for j in active:
                    amounts[j] = at_level(weights[j], lo[j], hi[j], lam)
                network = _Network(amounts, eligible, active, pools, capacity)
                if network.flow >= sum(amounts[j] for j in active) - _tolerance(capacity, pools):
                    break
                full = network.reachable_pools()
                members = [j for j in active if eligible[j] & pools <= full]
                lam = min(lam, level_of(members, sum(capacity[p] for p in full)))
        for j in members:
            targets[j] = at_level(weights[j], lo[j], hi[j], lam)
            by_pool[j] = _split(j, targets[j], eligible[j] & full, capacity, network)
        fill_order.extend(sorted(full))
        if full == pools or math.isinf(lam):
            break
        pools = pools - full
        gone = set(members)
        active = [j for j in active if j not in gone and eligible[j] & pools]
    filled = set(fill_order)
    fill_order.extend(p for p in range(len(capacity)) if p not in filled)
    return Shares(targets, by_pool, fill_order)


def _split(
    job: int, target: float, pools: frozenset[int], capacity: Sequence[float], network: _Network | None
) -> dict[int, float]:
    """One way to hold ``target`` over ``pools``: as the flow routed the job's class, else by size."""
    if target <= 0 or not pools:
        return {}
    if len(pools) == 1:
        return dict.fromkeys(pools, target)
    weights = network.routes(job) if network is not None else {}
    weights = {p: f for p, f in weights.items() if p in pools and f > 0}
    if not weights:
        weights = {p: capacity[p] for p in pools}
    total = sum(weights.values())
    return {p: target * f / total for p, f in sorted(weights.items())}


class _Network:
    """Max-flow from job classes (same eligible pools) to pools, by shortest augmenting paths."""

    def __init__(
        self,
        amounts: Sequence[float],
        eligible: Sequence[Eligibility],
        jobs: Sequence[int] | range,
        pools: frozenset[int],
        capacity: Sequence[float],
    ) -> None:
        classes: dict[Eligibility, int] = {}
        supply: list[float] = []
        self._class_of: dict[int, int] = {}
        for j in jobs:
            key = eligible[j] & pools
            if key not in classes:
                classes[key] = len(supply)
                supply.append(0.0)
            self._class_of[j] = classes[key]
            supply[classes[key]] += amounts[j]
        self._pools = sorted(pools)
        m = len(supply)
        self._m = m
        # Nodes: 0 source, 1..m classes, m+1..m+k pools, m+k+1 sink.
        size = m + len(self._pools) + 2
        self._sink = size - 1
        self._residual: list[dict[int, float]] = [{} for _ in range(size)]
        pool_node = {p: m + 1 + i for i, p in enumerate(self._pools)}
        for key, c in classes.items():
            self._edge(0, 1 + c, supply[c])
            for p in key:
                self._edge(1 + c, pool_node[p], math.inf)
        for p, node in pool_node.items():
            self._edge(node, self._sink, capacity[p])
        self._eps = _tolerance(capacity, pools)
        self.flow = self._max_flow()

    def _edge(self, a: int, b: int, cap: float) -> None:
        self._residual[a][b] = self._residual[a].get(b, 0.0) + cap
        self._residual[b].setdefault(a, 0.0)

    def _max_flow(self) -> float:
        total = 0.0
        while True:
            parent = self._search()
            if self._sink not in parent:
                return total
            path = []
            node = self._sink
            while node != 0:
                path.append((parent[node], node))
                node = parent[node]
            push = min(self._residual[a][b] for a, b in path)
            for a, b in path:
                self._residual[a][b] -= push
                self._residual[b][a] += push
            total += push

    def _search(self) -> dict[int, int]:
        parent = {0: 0}
        queue = deque([0])
        while queue:
            node = queue.popleft()
            for nxt, cap in self._residual[node].items():
                if cap > self._eps and nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        return parent

    def reachable_pools(self) -> frozenset[int]:
        """HandlerPools reachable from the source in the residual graph: an over-subscribed set."""
        reached = self._search()
        return frozenset(p for i, p in enumerate(self._pools) if self._m + 1 + i in reached)

    def routes(self, job: int) -> dict[int, float]:
        """Flow from ``job``'s class into each pool (the reverse edge's residual is the flow)."""
        node = 1 + self._class_of[job]
        return {p: self._residual[self._m + 1 + i].get(node, 0.0) for i, p in enumerate(self._pools)}
