"""The donor's daemon a move takes a slot from, found without scanning the donor's daemons.

A move gives a receiver one slot of a donor on the donor's daemon where that slot frees soonest
(with graceful preemption and expected task ends known, :class:`~truba.scheduler.drains.Drains`;
otherwise every slot frees at once), then where the receiver has the fewest slots (spread), the
donor the most, lowest daemon id on ties, skipping daemons that
may not run the receiver's handler and those where the donor's slots are on hold
(:mod:`~truba.scheduler.moves`). Scanning the donor's daemons for each move costs
O(daemons) a move: a job taking its share of a 10,000-daemon cluster by 15,000 moves took
minutes of planning. :class:`DonorDaemons` keeps, per (donor, receiver) pair asked about, a
heap of ``(drain, receiver's slots, -donor's slots, daemon)`` over the daemons that qualify, built on
the first ask, and pushes a fresh entry whenever a move changes one of the two jobs on a daemon
(:meth:`changed`); entries whose key is no longer the current one are dropped when they reach
the top (the drain is a function of the donor's slots there, so it is current when they are).
So the heap's first current entry is exactly the minimum the scan found, at
O(log daemons) per move.

Within one plan the hold is fixed (the times of the last gains and ``now`` do not change), and
so is whether a daemon may run a handler: both are decided once per daemon and pair.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import final

from tests.unit.scheduler.planner_v1.draft import DraftAssignment
from tests.unit.scheduler.planner_v1.drains import Drains
from tests.unit.scheduler.planner_v1.handler_pools import HandlerPools

Pair = tuple[str, str]
"""(donor, receiver)."""


@final
class DonorDaemons:
    """Per (donor, receiver): the donor's daemon to take a slot from; told of every move.

    Args:
        draft: the assignment being built (read; the caller changes it and calls :meth:`changed`).
        pools: which daemons may run which handler.
        handler: job id -> handler.
        on_hold: whether a job's slots on a daemon are too fresh to take (daemon, job); fixed
            for the life of this object.
        drains: when the next slot taken from a job on a daemon frees (None: at once).
    """

    def __init__(
        self,
        draft: DraftAssignment,
        pools: HandlerPools,
        handler: Mapping[str, str],
        on_hold: Callable[[str, str], bool],
        drains: Drains | None = None,
    ) -> None:
        self._draft = draft
        self._pools = pools
        self._handler = handler
        self._on_hold = on_hold
        self._drains = drains if drains is not None and drains.known else None
        self._heaps: dict[Pair, list[tuple[int, int, int, str]]] = {}
        self._held: dict[Pair, set[str]] = {}
        """Daemons the receiver may use where the donor's slots are on hold."""
        self._as_donor: dict[str, list[Pair]] = {}
        self._as_receiver: dict[str, list[Pair]] = {}

    def pick(self, donor: str, receiver: str) -> tuple[str | None, bool]:
        """The daemon to take from (None: none qualifies), and whether a daemon where the donor
        holds slots was ruled out by the hold (only computed when none qualifies, the only case
        in which the caller reads it)."""
        pair = (donor, receiver)
        heap = self._heaps.get(pair)
        if heap is None:
            heap = self._build(pair)
        theirs = self._draft.by_job.get(donor, {})
        mine = self._draft.by_job.get(receiver, {})
        while heap:
            _, m, minus_n, daemon = heap[0]
            n = theirs.get(daemon, 0)
            if n and minus_n == -n and m == mine.get(daemon, 0):
                return daemon, False
            heapq.heappop(heap)  # stale: a move changed either job there since (a newer entry is in)
        held = any(theirs.get(daemon, 0) for daemon in self._held[pair])
        return None, held

    def changed(self, daemon: str, job: str | None) -> None:
        """``job``'s slots on ``daemon`` changed (a move gave or took one); None: nothing to do."""
        if job is None:
            return
        by_job = self._draft.by_job
        for pair in self._as_donor.get(job, ()):
            self._offer(pair, daemon, by_job.get(job, {}).get(daemon, 0))
        for pair in self._as_receiver.get(job, ()):
            self._offer(pair, daemon, by_job.get(pair[0], {}).get(daemon, 0))

    def _build(self, pair: Pair) -> list[tuple[int, int, int, str]]:
        donor, receiver = pair
        self._heaps[pair] = []
        self._held[pair] = set()
        self._as_donor.setdefault(donor, []).append(pair)
        self._as_receiver.setdefault(receiver, []).append(pair)
        for daemon, n in self._draft.by_job.get(donor, {}).items():
            self._offer(pair, daemon, n, push=False)
        heap = self._heaps[pair]
        heapq.heapify(heap)
        return heap

    def _offer(self, pair: Pair, daemon: str, n: int, *, push: bool = True) -> None:
        """Adds ``daemon``'s current entry to ``pair``'s heap if it qualifies (``n``: the donor's
        slots there)."""
        donor, receiver = pair
        if n <= 0 or not self._pools.may_run(daemon, self._handler[receiver]):
            return
        if self._on_hold(daemon, donor):
            self._held[pair].add(daemon)
            return
        drain = self._drains.next_free(daemon, donor, n) if self._drains is not None else 0
        entry = (drain, self._draft.by_job.get(receiver, {}).get(daemon, 0), -n, daemon)
        if push:
            heapq.heappush(self._heaps[pair], entry)
        else:
            self._heaps[pair].append(entry)
