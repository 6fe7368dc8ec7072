"""Daemons grouped into *pools*: those that allow exactly the same of the current jobs' handlers.

Fair shares are computed per pool, not per daemon (:mod:`~truba.scheduler.fairshare`): a
deployment has thousands of daemons but a few ``--allow`` lists, and daemons whose lists differ
in text but admit the same handlers are one pool. A daemon that admits none of the handlers is
in no pool. Matching a handler against a list is remembered across plans: it is pure, and the
same few (handler, list) pairs come back every plan.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import final

from tests.unit.scheduler.planner_v2.allow import allowed


@functools.lru_cache(maxsize=65536)
def allows(handler: str, patterns: tuple[str, ...]) -> bool:
    """:func:`~truba.scheduler.allow.allowed`, remembered."""
    return allowed(handler, patterns)


@final
class HandlerPools:
    """HandlerPools of ``daemons`` for ``handlers``, numbered in a stable order (by handler set).

    Args:
        daemons: (daemon id, slots, allow patterns), in the order members are listed.
        handlers: the handlers of the jobs being planned.
    """

    def __init__(self, daemons: Sequence[tuple[str, int, tuple[str, ...]]], handlers: Iterable[str]) -> None:
        ordered = sorted(set(handlers))
        signature: dict[tuple[str, ...], tuple[str, ...]] = {}
        for _, _, patterns in daemons:
            if patterns not in signature:
                signature[patterns] = tuple(h for h in ordered if allows(h, patterns))
        keys = sorted({s for s in signature.values() if s})
        index = {k: i for i, k in enumerate(keys)}
        self.members: list[list[str]] = [[] for _ in keys]
        """Daemon ids per pool."""
        self.capacity: list[int] = [0] * len(keys)
        """Slots per pool."""
        self.of_daemon: dict[str, int | None] = {}
        """Pool per daemon id (None: it allows none of the handlers)."""
        for daemon_id, slots, patterns in daemons:
            pool = index.get(signature[patterns])
            self.of_daemon[daemon_id] = pool
            if pool is not None:
                self.members[pool].append(daemon_id)
                self.capacity[pool] += max(slots, 0)
        self.of_handler: dict[str, frozenset[int]] = {h: frozenset() for h in ordered}
        for i, key in enumerate(keys):
            if self.capacity[i] > 0:
                for h in key:
                    self.of_handler[h] = self.of_handler[h] | {i}
        """HandlerPools with slots that may run each handler."""

    def may_run(self, daemon_id: str, handler: str) -> bool:
        """Whether ``daemon_id`` may run ``handler`` (both known to this grouping)."""
        pool = self.of_daemon.get(daemon_id)
        return pool is not None and pool in self.of_handler.get(handler, frozenset())
