"""Moves: slots taken from jobs above their fair share for jobs below it, without flapping.

A job's *deviation* is its slots minus its fair share (fractional). A move gives one slot of a
donor (deviation > 0) on some daemon to a receiver (deviation < 0) that may run there, and only
if all of these hold:

- **Kueue's rule**, in slots against the fair share: the receiver's deviation after the move is
  strictly below the donor's before it (Kueue's ``LessThanInitialShare``). Each move lowers the
  sum of squared deviations, so no sequence of moves under fixed shares can return to a state,
  and two jobs never trade a slot back and forth. For two jobs with equal shares this is exactly
  "receiver's share after <= donor's share after" (``LessThanOrEqualToFinalShare``), which
  cannot be used as such: in slots per importance it strands a job two slots below its share
  when the donors are many small jobs each a fraction of a slot above theirs (a test shows it).
- **Deadband**: one of the two is at least ``deadband`` slots off its share. Integer slots
  leave a job up to a slot off a fractional share; pairs that are both closer than the deadband
  are rounding noise and do not trade, however the shares wobble. It is a condition on the
  pair, not on the receiver alone, because a donor a slot and a half over its share must still
  be able to give to receivers that are each only half a slot short. A receiver below its
  ``min_slots`` ignores the deadband.
- **Hold**: the donor got a slot on that daemon at least ``min_hold`` ago.

Receivers are served neediest first (below their minimum first, then by deviation, older job on
ties); each takes from the donor furthest above its share (newest job on ties), on the donor's
daemon where the slot frees soonest, then where the receiver has the fewest slots (spread), or,
for a receiver at least :data:`PACK_DEFICIT` slots below its share and a slot that frees at
once, where it has the most (packed: fewer daemons change). When allow-lists leave a receiver no
direct donor, a short chain through other jobs may serve it (:mod:`~truba.scheduler.chains`,
same rule between its two ends, same hold on every slot taken).

When no daemon restricts handlers, every job ends within one slot of its share (a property
test); with allow-lists, chains of up to three moves make it so in all but rare cases.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from tests.unit.scheduler.planner_v2.chains import Chains, Hop
from tests.unit.scheduler.planner_v2.donor_daemons import DonorDaemons
from tests.unit.scheduler.planner_v2.draft import DraftAssignment
from tests.unit.scheduler.planner_v2.drains import Drains
from tests.unit.scheduler.planner_v2.handler_pools import HandlerPools
from tests.unit.scheduler.planner_v2.waterfill import KEY_DIGITS

EPS: Final = 1e-9
PACK_DEFICIT: Final = 512
"""Slots: a receiver at least this far below its share takes its donors' slots packed, on the
daemons where it already has the most, instead of spread over the daemons where it has the
fewest. A new job on a busy 10,000-daemon cluster (15,000 slots short) then changes about 2,500
daemons instead of every one (each change is a gRPC write and a daemon to reach), and a daemon
lost still costs it a fraction of a percent of its slots. Below it (every cluster of fewer
slots, and every small adjustment) the plans are as before: spread. Chosen per (donor,
receiver) pair when its heap is built (:class:`~truba.scheduler.donor_daemons.DonorDaemons`)."""


@dataclass(frozen=True)
class Outcome:
    """How many moves were made, and whether the cap or a hold stopped a wanted one."""

    moves: int
    settled: bool


def rebalance(
    draft: DraftAssignment,
    targets: Mapping[str, float],
    floors: Mapping[str, int],
    ranks: Mapping[str, int],
    *,
    pools: HandlerPools,
    slots: Mapping[str, int],
    handler: Mapping[str, str],
    on_hold: Callable[[str, str], bool],
    deadband: float,
    max_moves: int,
    drains: Drains | None = None,
) -> Outcome:
    """Makes moves on ``draft`` until none is allowed or ``max_moves`` were made.

    Args:
        draft: the assignment, changed in place.
        targets: fair share per job (every job on the draft has one).
        floors: slots per job that ignore the deadband while missing (its min_slots, as far as
            its share covers them).
        ranks: stable order per job, older first.
        pools: which daemons may run which handler.
        slots: daemon id -> capacity (chains may end in a free slot).
        handler: job id -> handler.
        on_hold: whether a job's slots on a daemon are too fresh to take (daemon, job).
        drains: when a slot taken from a job on a daemon would be free (graceful preemption);
            None: at once everywhere.
    """
    drains = drains or Drains(None, 0.0)
    chains = Chains(draft, pools, slots, handler, on_hold, drains)
    return _Rebalance(draft, targets, floors, ranks, pools, handler, on_hold, chains, deadband, drains).run(
        max_moves
    )


class _Rebalance:
    def __init__(
        self,
        draft: DraftAssignment,
        targets: Mapping[str, float],
        floors: Mapping[str, int],
        ranks: Mapping[str, int],
        pools: HandlerPools,
        handler: Mapping[str, str],
        on_hold: Callable[[str, str], bool],
        chains: Chains,
        deadband: float,
        drains: Drains,
    ) -> None:
        self.draft = draft
        self.drains = drains
        self.floor = {j: n for j, n in floors.items() if n > 0}
        """The floors that can be missed (most jobs have none: 0)."""
        self.ranks = ranks
        self.pools = pools
        self.handler = handler
        self.on_hold = on_hold
        self.chains = chains
        self.deadband = deadband
        self.dev = {j: draft.totals.get(j, 0) - t for j, t in targets.items()}
        self.daemons = DonorDaemons(draft, pools, handler, on_hold, drains, self._packs)
        self.key = {j: round(d, KEY_DIGITS) for j, d in self.dev.items()}
        """Each job's deviation as the heaps order it (rounded: float noise makes no order)."""
        self.receivers: list[tuple[bool, float, int, str]] = []
        self.donors: list[tuple[float, int, str]] = []
        self.blocked = False
        self.skipped: list[str] = []
        """Receivers nothing could serve, until the next move."""
        for job in self.dev:
            self._push(job)

    def _packs(self, receiver: str) -> bool:
        """Whether ``receiver`` is far enough below its share to take slots packed."""
        return -self.dev[receiver] >= PACK_DEFICIT - EPS

    def _below_floor(self, job: str) -> bool:
        floor = self.floor.get(job)
        return floor is not None and self.draft.totals.get(job, 0) < floor

    def _shift(self, job: str, by: int) -> None:
        dev = self.dev[job] = self.dev[job] + by
        self.key[job] = round(dev, KEY_DIGITS)

    def _push(self, job: str) -> None:
        dev = self.dev[job]
        if dev < -EPS:
            heapq.heappush(self.receivers, (not self._below_floor(job), self.key[job], self.ranks[job], job))
        elif dev > EPS:
            heapq.heappush(self.donors, (-self.key[job], -self.ranks[job], job))

    def run(self, max_moves: int) -> Outcome:
        moves = 0
        while True:
            hops = self._next()
            if hops is None:
                return Outcome(moves, not self.blocked)
            cost = sum(giver is not None for _, giver, _ in hops)
            if moves + cost > max_moves:
                return Outcome(moves, False)
            for daemon, giver, taker in hops:
                if giver is None:
                    self.draft.add(daemon, taker)
                else:
                    self.draft.move(daemon, giver, taker)
                self.chains.moved(daemon, giver, taker)
                self.daemons.moved(daemon, giver, taker)
            donor, receiver = hops[0][1], hops[-1][2]
            if donor is not None:
                self._shift(donor, -1)
                self._push(donor)
            self._shift(receiver, 1)
            self._push(receiver)
            # Any move may open a way for a receiver that had none (a new donor, a job holding
            # slots in a new pool): try them again, so a plan's result is a fixed point.
            for job in self.skipped:
                self._push(job)
            self.skipped.clear()
            moves += cost

    def _next(self) -> list[Hop] | None:
        """The next move (or chain of moves) to make, or None if none is allowed."""
        while self.receivers:
            entry = self.receivers[0]
            receiver = entry[3]
            if entry[:2] != (not self._below_floor(receiver), self.key[receiver]) or entry[1] >= -EPS:
                heapq.heappop(self.receivers)  # stale: the job's slots changed since
                continue
            found, stop = self._donor_for(receiver)
            if found is not None:
                return [(found[0], found[1], receiver)]
            # A chain may end in a free slot instead of a donor: then only the receiver's own
            # distance from its share decides (receivers further down are closer to theirs).
            wants_free = self._below_floor(receiver) or -self.dev[receiver] >= self.deadband - EPS
            if stop and not (wants_free and self.chains.has_free()):
                return None
            is_donor = _nobody if stop else functools.partial(self._allowed, receiver)
            chain = self.chains.find(receiver, is_donor, free_ok=wants_free)
            if chain is not None:
                return chain
            heapq.heappop(self.receivers)
            self.skipped.append(receiver)
        return None

    def _allowed(self, receiver: str, donor: str) -> bool:
        """Whether the rule (Kueue's, the deadband) lets ``donor`` give ``receiver`` a slot."""
        r_dev = self.dev[receiver]
        d_dev = self.dev[donor]
        outside = self._below_floor(receiver) or max(-r_dev, d_dev) >= self.deadband - EPS
        return d_dev > EPS and d_dev - r_dev > 1 + EPS and outside

    def _donor_for(self, receiver: str) -> tuple[tuple[str, str] | None, bool]:
        """(daemon, donor) for ``receiver``; else (None, whether no later receiver can have one)."""
        tried: list[tuple[float, int, str]] = []
        first = True
        found: tuple[str, str] | None = None
        stop = False
        held_back = False
        floor = self._below_floor(receiver)
        # The top donor is looked at in place and popped only to look past it (into ``tried``,
        # pushed back after): the usual move takes from the top one and pops nothing.
        donors = self.donors
        while donors:
            entry = donors[0]
            donor = entry[2]
            if -entry[0] != self.key[donor] or entry[0] >= -EPS:
                heapq.heappop(donors)  # stale
                continue
            if not self._allowed(receiver, donor):
                # Donors further down are closer to their share: none passes either. Receivers
                # further down are closer to theirs, so if this was the top donor, none can.
                stop = first and not floor
                break
            first = False
            daemon, held = self._daemon_for(donor, receiver)
            held_back = held_back or held
            if daemon is not None:
                found = (daemon, donor)
                break
            tried.append(heapq.heappop(donors))
        for entry in tried:
            heapq.heappush(self.donors, entry)
        if found is None and held_back:
            self.blocked = True
        return found, stop

    def _daemon_for(self, donor: str, receiver: str) -> tuple[str | None, bool]:
        """The donor's daemon to take from: where its slot frees soonest (graceful preemption,
        :class:`~truba.scheduler.drains.Drains`), then where the receiver has the fewest slots,
        the donor the most, lowest id on ties, among those that may run the receiver's handler and are not
        on hold (:class:`~truba.scheduler.donor_daemons.DonorDaemons`); and whether some daemon
        was ruled out by the hold (when none is found)."""
        return self.daemons.pick(donor, receiver)


def _nobody(job: str) -> bool:
    return False
