"""Chains of moves for jobs that share no daemon with any donor or free slot (allow-lists).

With allow-lists a job below its share may be unable to take a slot directly from any job
above its share (none of the donor's daemons allow it), or to use a free slot (no free daemon
allows it). It can still get one through jobs in between: it takes a slot of job B on a daemon
it may use, B takes one of C on another daemon, and so on until the last job is a donor, or
takes a free slot. Only the ends change their totals; each job in between gives up one slot
and gets one elsewhere (its task there is interrupted, so chains are short and tried only when
no direct move exists).

The search is breadth-first over jobs, so the shortest chain wins; a job's slots that are on
hold are not taken (as for direct moves).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, final

from truba.scheduler.draft import DraftAssignment
from truba.scheduler.drains import Drains
from truba.scheduler.handler_pools import HandlerPools

MAX_HOPS: Final = 3
"""Most slots a chain takes from jobs (so at most two jobs in between a donor and the receiver)."""

Hop = tuple[str, str | None, str]
"""(daemon, giver, taker): one slot on daemon passes from giver (None: a free slot) to taker."""


@final
class Chains:
    """Finds chains on ``draft``; keep one per round and tell it about every move (:meth:`moved`).

    Args:
        pools: which daemons are in which pool, and which pools may run which handler.
        slots: daemon id -> its capacity.
        handler: job id -> handler.
        on_hold: whether a job's slots on a daemon are too fresh to take (daemon, job).
        drains: when a slot taken from a job on a daemon would be free (None: at once).
    """

    def __init__(
        self,
        draft: DraftAssignment,
        pools: HandlerPools,
        slots: Mapping[str, int],
        handler: Mapping[str, str],
        on_hold: Callable[[str, str], bool],
        drains: Drains | None = None,
    ) -> None:
        self._draft = draft
        self._drains = drains or Drains(None, 0.0)
        self._pools = pools
        self._slots = slots
        self._handler = handler
        self._on_hold = on_hold
        self._free: dict[int, int] | None = None
        """Free slots per pool (counted when first needed)."""
        self._holders: dict[int, dict[str, int]] = {}
        """Per pool (built when first needed): job -> slots there that may be taken."""

    def find(self, receiver: str, is_donor: Callable[[str], bool], free_ok: bool) -> list[Hop] | None:
        """The shortest chain to ``receiver`` from a donor (``is_donor``) or, if ``free_ok``, a free
        slot, as hops to apply in order."""
        taken_from: dict[str, tuple[str, int]] = {}  # job -> (the job that takes its slot, pool)
        seen = {receiver}
        expanded: set[int] = set()  # a pool's holders are all reached the first time it is entered
        frontier = [receiver]
        for _ in range(MAX_HOPS):
            following: list[str] = []
            for taker in frontier:
                for pool in sorted(self._pools_of(taker) - expanded):
                    expanded.add(pool)
                    for giver in sorted(self._holders_in(pool)):  # not dict order: a pure function
                        if giver in seen:
                            continue
                        seen.add(giver)
                        taken_from[giver] = (taker, pool)
                        if is_donor(giver):
                            return self._hops(giver, taken_from)
                        free = self._free_pool(giver) if free_ok else None
                        if free is not None:
                            return [
                                (self._free_daemon(giver, free), None, giver),
                                *self._hops(giver, taken_from),
                            ]
                        following.append(giver)
            frontier = following
        return None

    def has_free(self) -> bool:
        """Whether some daemon that may run some job has a free slot."""
        return any(self._free_slots().values())

    def moved(self, daemon: str, giver: str | None, taker: str) -> None:
        """Keeps the indexes right after a slot on ``daemon`` passed from ``giver`` to ``taker``."""
        if self._free is None and not self._holders:
            return  # no chain was looked for yet: nothing to keep (the usual plan)
        pool = self._pools.of_daemon.get(daemon)
        if pool is None:
            return
        if giver is None and self._free is not None:
            self._free[pool] -= 1
        if pool not in self._holders:
            return
        holders = self._holders[pool]
        if giver is not None and not self._on_hold(daemon, giver):
            holders[giver] -= 1
            if not holders[giver]:
                del holders[giver]
        if not self._on_hold(daemon, taker):
            holders[taker] = holders.get(taker, 0) + 1

    def _pools_of(self, job: str) -> frozenset[int]:
        return self._pools.of_handler.get(self._handler[job], frozenset())

    def _free_slots(self) -> dict[int, int]:
        if self._free is None:
            self._free = {
                pool: sum(max(0, self._slots[d] - self._draft.used[d]) for d in members)
                for pool, members in enumerate(self._pools.members)
            }
        return self._free

    def _free_pool(self, job: str) -> int | None:
        """A pool with a free slot that ``job`` may use, if any."""
        free = self._free_slots()
        return next((pool for pool in sorted(self._pools_of(job)) if free[pool] > 0), None)

    def _free_daemon(self, job: str, pool: int) -> str:
        """A daemon of ``pool`` with a free slot, where ``job`` has the fewest slots."""
        mine = self._draft.by_job.get(job, {})
        return min(
            (mine.get(d, 0), d) for d in self._pools.members[pool] if self._draft.used[d] < self._slots[d]
        )[1]

    def _holders_in(self, pool: int) -> dict[str, int]:
        if pool not in self._holders:
            holders: dict[str, int] = {}
            for daemon in self._pools.members[pool]:
                for job, n in self._draft.by_daemon[daemon].items():
                    if not self._on_hold(daemon, job):
                        holders[job] = holders.get(job, 0) + n
            self._holders[pool] = holders
        return self._holders[pool]

    def _hops(self, donor: str, taken_from: Mapping[str, tuple[str, int]]) -> list[Hop]:
        hops: list[Hop] = []
        giver = donor
        while giver in taken_from:
            taker, pool = taken_from[giver]
            hops.append((self._daemon(giver, taker, pool), giver, taker))
            giver = taker
        return hops

    def _daemon(self, giver: str, taker: str, pool: int) -> str:
        """The giver's daemon in ``pool`` to take from: where its slot frees soonest, then where the
        taker has the fewest slots (spread)."""
        theirs = self._draft.by_job[giver]
        mine = self._draft.by_job.get(taker, {})
        candidates = [
            (self._drains.next_free(d, giver, n), mine.get(d, 0), -n, d)
            for d, n in theirs.items()
            if self._pools.of_daemon.get(d) == pool and not self._on_hold(d, giver)
        ]
        return min(candidates)[3]
