"""Keeps the garbage collector out of a plan and the pushes after it.

At 10,000 daemons a plan allocates millions of small objects (the draft's rows, the move heaps,
the new assignment, the hold times) and keeps hundreds of thousands of them: collections ran
inside the plan (a quarter to a third of its CPU), and the first young pass after it walked
every survivor, 100-400 ms on a loaded machine, just when the new job's assignments were being
written.
:class:`GcPause` turns the collector off for the block and then *freezes* what is alive
(``gc.freeze``: O(1), the tracked objects move to a generation no pass walks). Objects still die
by reference count as before; only garbage in reference cycles among frozen objects waits for
:meth:`GcPause.thaw`, which the scheduler calls every :data:`THAW_EVERY` seconds: the frozen
objects go back to the oldest generation and one full collection (timed and logged) reclaims
those cycles, once, at a known moment instead of after every plan.
"""

from __future__ import annotations

import gc
import logging
import time
from types import TracebackType
from typing import Final, final

log = logging.getLogger(__name__)

THAW_EVERY: Final = 600.0
"""Seconds between full collections of the frozen objects (:meth:`GcPause.thaw`)."""


@final
class GcPause:
    """``with pause:`` runs the block without collections and freezes what it left alive."""

    def __init__(self) -> None:
        self._enabled: list[bool] = []
        self.frozen = 0
        """Blocks ended (each one froze the live objects)."""

    def __enter__(self) -> None:
        self._enabled.append(gc.isenabled())
        gc.disable()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        enabled = self._enabled.pop()
        if self._enabled:
            return  # nested: the outer block freezes
        gc.freeze()
        self.frozen += 1
        if enabled:
            gc.enable()

    def thaw(self) -> int:
        """Unfreezes everything and collects it all (one full pass); returns what it collected."""
        objects = gc.get_freeze_count()
        began = time.perf_counter()
        gc.unfreeze()
        collected = gc.collect()
        log.info(
            "sched.gc.thawed",
            extra={
                "objects": objects,
                "collected": collected,
                "ms": round((time.perf_counter() - began) * 1000, 1),
            },
        )
        return collected
