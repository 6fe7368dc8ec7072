"""Logs the garbage collector's slow passes: they stop the scheduler's event loop.

A full collection walks every tracked object; at 10,000 daemons (their sessions, streams, tasks
and buffers) that is a pause every heartbeat, push and plan waits behind. :class:`GcWatch` times
each pass (``gc.callbacks``) and logs ``sched.gc.slow`` for one over :data:`SLOW_GC` seconds,
with its generation and what it collected, and counts the passes and their time per
generation (:attr:`GcWatch.seconds`).
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Final, final

log = logging.getLogger(__name__)

SLOW_GC: Final = 0.05
"""Seconds a collection may take before it is logged."""
THRESHOLDS: Final = (50_000, 100, 10)
"""The collector's thresholds while the scheduler runs (Python's: 700, 10, 10). Most of what a
stream allocates per message lives until its next message (seconds): with Python's thresholds it
outlives two collections, lands in the oldest generation and makes full collections, which walk
every object of every daemon's session, frequent (0.3-1.3 s each at 10,000 daemons on a loaded
machine, every few seconds, collecting next to nothing). Larger young generations let it die
young."""


_installed: list[GcWatch] = []
"""The watches installed in this process."""
_saved: list[int] = []
"""The process's thresholds before the first of them."""


@final
class GcWatch:
    """Times the collector's passes while installed (:meth:`install`, :meth:`remove`)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        """Wall seconds spent collecting, per generation, since installed."""
        self.passes = [0, 0, 0]
        self._began = 0.0

    def install(self) -> None:
        """Starts timing passes and sets :data:`THRESHOLDS`; the process's own come back when
        the last watch installed in it is removed (several schedulers may share a process)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
            if not _installed:
                _saved[:] = gc.get_threshold()
                gc.set_threshold(*THRESHOLDS)
            _installed.append(self)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
            _installed.remove(self)
            if not _installed:
                gc.set_threshold(*_saved)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        generation = info.get("generation", 2)
        self.seconds[generation] += took
        self.passes[generation] += 1
        if took >= SLOW_GC:
            log.info(
                "sched.gc.slow",
                extra={
                    "generation": generation,
                    "ms": round(took * 1000, 1),
                    "collected": info.get("collected", 0),
                },
            )
