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
the first ask. Every qualifying daemon has an entry no greater than its current key: a move that
makes a daemon's key *smaller* (the donor gained a slot there, or the receiver lost one) pushes a
fresh entry (:meth:`moved`); one that makes it larger (the usual case: the receiver gained, the
donor gave) pushes nothing, and the old entry, now too small, is put right when it reaches the
top (replaced by the current key, or dropped when the donor has no slot there any more). The
drain is a function of the donor's slots there, so a key is current when its counts are. So the
first current entry at the top is exactly the minimum the scan found, at O(log daemons) per
move. (Pushing a fresh entry on every change, as before, cost three pushes and as many stale
pops per move: a third of a 15,000-move plan.)

A receiver far below its share (:data:`~truba.scheduler.moves.PACK_DEFICIT`) *packs* instead:
among slots that free at once (idle ones, or any when no ends are known) the daemon where it
has the *most* slots comes first, key ``(drain, -receiver's slots, -donor's slots, daemon)``; a
slot that drains still spreads (see :meth:`DonorDaemons._placing`). Whether a pair packs is
decided when its heap is built. For such a pair a move that gives the receiver a slot makes the
daemon's key smaller where it frees at once: :meth:`moved` pushes a fresh entry for it too.

Within one plan the hold is fixed (the times of the last gains and ``now`` do not change), and
so is whether a daemon may run a handler: both are decided once per daemon and pair.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import final

from tests.unit.scheduler.planner_v2.draft import DraftAssignment
from tests.unit.scheduler.planner_v2.drains import IDLE, Drains
from tests.unit.scheduler.planner_v2.handler_pools import HandlerPools

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
        packs: whether a receiver's pairs pack (asked once per pair, when its heap is built;
            None: none does, every pair spreads).
    """

    def __init__(
        self,
        draft: DraftAssignment,
        pools: HandlerPools,
        handler: Mapping[str, str],
        on_hold: Callable[[str, str], bool],
        drains: Drains | None = None,
        packs: Callable[[str], bool] | None = None,
    ) -> None:
        self._draft = draft
        self._packs = packs
        self._pools = pools
        self._handler = handler
        self._on_hold = on_hold
        self._drains = drains if drains is not None and drains.known else None
        self._heaps: dict[Pair, list[tuple[int, int, int, str]]] = {}
        self._held: dict[Pair, set[str]] = {}
        """Daemons the receiver may use where the donor's slots are on hold."""
        self._as_donor: dict[str, list[Pair]] = {}
        self._as_receiver: dict[str, list[Pair]] = {}
        self._packing: dict[str, list[Pair]] = {}
        """Receiver -> its pairs that pack (see :meth:`_key`)."""
        self._packs_pair: dict[Pair, bool] = {}

    def pick(self, donor: str, receiver: str) -> tuple[str | None, bool]:
        """The daemon to take from (None: none qualifies), and whether a daemon where the donor
        holds slots was ruled out by the hold (only computed when none qualifies, the only case
        in which the caller reads it)."""
        pair = (donor, receiver)
        heap = self._heaps.get(pair)
        if heap is None:
            heap = self._build(pair)
        packs = self._packs_pair[pair]
        free_all = self._drains is None
        theirs = self._draft.by_job.get(donor, {})
        mine = self._draft.by_job.get(receiver, {})
        while heap:
            drain, m, minus_n, daemon = heap[0]
            n = theirs.get(daemon, 0)
            if not n:
                heapq.heappop(heap)  # the donor has nothing there any more
                continue
            now = mine.get(daemon, 0)
            if packs and (free_all or drain == IDLE):  # as _placing, inline: the hot loop
                now = -now
            if minus_n == -n and m == now:
                return daemon, False  # current (the drain is a function of n: current too)
            heapq.heapreplace(heap, self._key(packs, daemon, donor, n, mine.get(daemon, 0)))  # put right
        held = any(theirs.get(daemon, 0) for daemon in self._held[pair])
        return None, held

    def moved(self, daemon: str, giver: str | None, taker: str) -> None:
        """A slot on ``daemon`` passed from ``giver`` (None: it was free) to ``taker``. Only the
        keys that became smaller get a fresh entry: those of pairs where ``taker`` gives (it
        has one more slot there), where ``taker`` receives and packs (one more slot of the
        receiver there is a smaller key where the slot frees at once), and where ``giver``
        receives (one fewer is a smaller key where it spreads; a packing pair's key there may
        be either, so it gets one too)."""
        by_job = self._draft.by_job
        for pair in self._as_donor.get(taker, ()):
            self._offer(pair, daemon, by_job.get(taker, {}).get(daemon, 0))
        for pair in self._packing.get(taker, ()):
            self._offer(pair, daemon, by_job.get(pair[0], {}).get(daemon, 0))
        if giver is not None:
            for pair in self._as_receiver.get(giver, ()):
                self._offer(pair, daemon, by_job.get(pair[0], {}).get(daemon, 0))

    def _build(self, pair: Pair) -> list[tuple[int, int, int, str]]:
        donor, receiver = pair
        self._heaps[pair] = []
        self._held[pair] = set()
        packs = self._packs_pair[pair] = self._packs is not None and self._packs(receiver)
        self._as_donor.setdefault(donor, []).append(pair)
        self._as_receiver.setdefault(receiver, []).append(pair)
        if packs:
            self._packing.setdefault(receiver, []).append(pair)
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
        entry = self._key(
            self._packs_pair[pair], daemon, donor, n, self._draft.by_job.get(receiver, {}).get(daemon, 0)
        )
        if push:
            heapq.heappush(self._heaps[pair], entry)
        else:
            self._heaps[pair].append(entry)

    def _key(self, packs: bool, daemon: str, donor: str, n: int, m: int) -> tuple[int, int, int, str]:
        """``daemon``'s key for a pair whose donor has ``n`` slots there and receiver ``m``."""
        drain = self._drain(daemon, donor, n)
        return drain, self._placing(packs, drain, m), -n, daemon

    def _placing(self, packs: bool, drain: int, m: int) -> int:
        """The key's second part: the receiver's slots there, fewest first (spread) or, for a
        packing pair where the slot frees at once, most first. Slots that drain (graceful
        preemption) spread: their ends are estimates, and on one daemon the k-th slot taken
        frees at the k-th of the donor's task ends there, where k slots taken on k daemons
        free at the first end of each; packing those made a graceful job's wait for its share
        longer (``bench/fairness.py``, see docs/scheduler.md)."""
        if packs and (self._drains is None or drain == IDLE):
            return -m
        return m

    def _drain(self, daemon: str, donor: str, n: int) -> int:
        return self._drains.next_free(daemon, donor, n) if self._drains is not None else 0
