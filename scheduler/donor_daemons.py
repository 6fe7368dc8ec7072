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
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Final, final

from truba.scheduler.draft import DraftAssignment
from truba.scheduler.drains import IDLE, RESOLUTION, Drains
from truba.scheduler.handler_pools import HandlerPools

Pair = tuple[str, str]
"""(donor, receiver)."""


@final
class _Pair:
    """One (donor, receiver) pair's heap and what is fixed for it during the plan."""

    __slots__ = ("donor", "fit", "heap", "held", "packs", "receiver")

    def __init__(self, donor: str, receiver: str, packs: bool) -> None:
        self.donor = donor
        self.receiver = receiver
        self.packs = packs
        self.heap: list[tuple[int, int, int, str]] = []
        self.held: set[str] = set()
        """Daemons the receiver may use where the donor's slots are on hold."""
        self.fit: dict[str, Sequence[float] | None] = {}
        """Daemon -> the donor's expected task ends there (:meth:`Drains.ends`; empty when ends
        are unknown) if the daemon qualifies (the receiver may run there, the donor's slots are
        not on hold), None if not: both are fixed for the plan, so each daemon is judged once
        per pair, when first offered."""


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
        self._now = self._drains.now if self._drains is not None else 0.0
        self._pairs: dict[Pair, _Pair] = {}
        self._as_donor: dict[str, list[_Pair]] = {}
        self._as_receiver: dict[str, list[_Pair]] = {}
        self._packing: dict[str, list[_Pair]] = {}
        """Receiver -> its pairs that pack (see :meth:`_key`)."""

    def pick(self, donor: str, receiver: str) -> tuple[str | None, bool]:
        """The daemon to take from (None: none qualifies), and whether a daemon where the donor
        holds slots was ruled out by the hold (only computed when none qualifies, the only case
        in which the caller reads it)."""
        pair = self._pairs.get((donor, receiver))
        if pair is None:
            pair = self._build(donor, receiver)
        heap = pair.heap
        packs = pair.packs
        free_all = self._drains is None
        by_job = self._draft.by_job
        theirs = by_job.get(donor, _NONE)
        mine = by_job.get(receiver, _NONE)
        while heap:
            drain, m, minus_n, daemon = heap[0]
            n = theirs.get(daemon, 0)
            if not n:
                heapq.heappop(heap)  # the donor has nothing there any more
                continue
            now = mine.get(daemon, 0)
            if packs and (free_all or drain == IDLE):  # as _placing, inline: the hot loop
                if minus_n == -n and m == -now:
                    return daemon, False  # current (the drain is a function of n: current too)
            elif minus_n == -n and m == now:
                return daemon, False
            ends = pair.fit[daemon]  # judged when its first entry was made: it qualifies
            assert ends is not None
            heapq.heapreplace(heap, self._key(packs, ends, daemon, n, now))  # put right
        held = any(theirs.get(daemon, 0) for daemon in pair.held)
        return None, held

    def moved(self, daemon: str, giver: str | None, taker: str) -> None:
        """A slot on ``daemon`` passed from ``giver`` (None: it was free) to ``taker``. Only the
        keys that became smaller get a fresh entry: those of pairs where ``taker`` gives (it
        has one more slot there), where ``taker`` receives and packs (one more slot of the
        receiver there is a smaller key where the slot frees at once), and where ``giver``
        receives (one fewer is a smaller key where it spreads; a packing pair's key there may
        be either, so it gets one too)."""
        by_job = self._draft.by_job
        pairs = self._as_donor.get(taker)
        if pairs:
            n = by_job.get(taker, _NONE).get(daemon, 0)
            for pair in pairs:
                self._offer(pair, daemon, n)
        pairs = self._packing.get(taker)
        if pairs:  # a packing receiver's every move (a new job's 15,000): _offer, inline
            m = by_job[taker][daemon]
            for pair in pairs:
                n = by_job.get(pair.donor, _NONE).get(daemon, 0)
                if n <= 0:
                    continue
                ends = pair.fit.get(daemon, _UNSEEN)
                if ends is _UNSEEN:
                    ends = self._fit(pair, daemon)
                if ends is None:
                    continue
                entry = self._key(True, ends, daemon, n, m)
                heap = pair.heap
                if heap and heap[0][3] == daemon:
                    heapq.heapreplace(heap, entry)
                else:
                    heapq.heappush(heap, entry)
        if giver is not None:
            pairs = self._as_receiver.get(giver)
            if pairs:
                for pair in pairs:
                    self._offer(pair, daemon, by_job.get(pair.donor, _NONE).get(daemon, 0))

    def _build(self, donor: str, receiver: str) -> _Pair:
        pair = self._pairs[(donor, receiver)] = _Pair(
            donor, receiver, self._packs is not None and self._packs(receiver)
        )
        self._as_donor.setdefault(donor, []).append(pair)
        self._as_receiver.setdefault(receiver, []).append(pair)
        packs = pair.packs
        if packs:
            self._packing.setdefault(receiver, []).append(pair)
        # Every daemon of the donor is judged and keyed here (the first pick of a pair): at
        # 10,000 daemons this loop is a fifth of a new job's plan, so :meth:`_fit` and
        # :meth:`_key` are written out (the pair is new: no daemon judged yet).
        mine = self._draft.by_job.get(receiver, _NONE)
        heap = pair.heap
        fits = pair.fit
        runs_there = self._pools.may_run
        handler = self._handler[receiver]
        on_hold = self._on_hold
        drains = self._drains
        key = self._key
        for daemon, n in self._draft.by_job.get(donor, _NONE).items():
            if n <= 0:
                continue
            if not runs_there(daemon, handler):
                fits[daemon] = None
            elif on_hold(daemon, donor):
                pair.held.add(daemon)
                fits[daemon] = None
            elif drains is None:
                fits[daemon] = ()
                m = mine.get(daemon, 0)
                heap.append((0, -m if packs else m, -n, daemon))
            else:
                ends = fits[daemon] = drains.ends(daemon, donor)
                heap.append(key(packs, ends, daemon, n, mine.get(daemon, 0)))
        heapq.heapify(heap)
        return pair

    def _fit(self, pair: _Pair, daemon: str) -> Sequence[float] | None:
        """``pair.fit[daemon]``, judged on the first ask."""
        fit = pair.fit.get(daemon, _UNSEEN)
        if fit is not _UNSEEN:
            return fit
        fit = None
        if not self._pools.may_run(daemon, self._handler[pair.receiver]):
            pass
        elif self._on_hold(daemon, pair.donor):
            pair.held.add(daemon)
        else:
            fit = self._drains.ends(daemon, pair.donor) if self._drains is not None else ()
        pair.fit[daemon] = fit
        return fit

    def _offer(self, pair: _Pair, daemon: str, n: int) -> None:
        """Gives ``daemon`` a current entry in ``pair``'s heap if it qualifies (``n``: the
        donor's slots there): in place of its entry at the top, if it is there (the daemon just
        picked), else pushed."""
        if n <= 0:
            return
        ends = pair.fit.get(daemon, _UNSEEN)
        if ends is _UNSEEN:
            ends = self._fit(pair, daemon)
        if ends is None:
            return
        entry = self._key(
            pair.packs, ends, daemon, n, self._draft.by_job.get(pair.receiver, _NONE).get(daemon, 0)
        )
        heap = pair.heap
        if heap and heap[0][3] == daemon:
            heapq.heapreplace(heap, entry)
        else:
            heapq.heappush(heap, entry)

    def _key(
        self, packs: bool, ends: Sequence[float], daemon: str, n: int, m: int
    ) -> tuple[int, int, int, str]:
        """``daemon``'s key for a pair whose donor has ``n`` slots there, its tasks there
        expected to end at ``ends``, and whose receiver has ``m``: the drain
        (:meth:`Drains.next_free`, inline), then :meth:`_placing`."""
        if self._drains is None:
            return 0, -m if packs else m, -n, daemon
        draining = len(ends) - n
        if draining < 0:
            return IDLE, -m if packs else m, -n, daemon
        drain = round((ends[draining] - self._now) / RESOLUTION)
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


_NONE: Final[Mapping[str, int]] = {}
"""No slots anywhere (read only)."""
_UNSEEN: Final[Sequence[float]] = (math.nan,)
"""A daemon not judged yet for a pair (compared by identity)."""
