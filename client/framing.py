"""How many tasks a task frame may carry: about :data:`FRAME_WORK` seconds of handler time.

A frame is delivered whole to one daemon (its members are then spread over that daemon's free
slots), so a frame of long tasks would make one daemon hold work another could run: frames are
sized by how long the job's tasks take, learned from their outcomes (each result carries its
handler's time). Millisecond tasks get big frames, where the per-message cost of AMQP matters;
tasks of :data:`FRAME_WORK` or more go one per message, where it does not.
"""

from __future__ import annotations

from typing import Final

from truba.pipes.frame import FrameLimits

FRAME_WORK: Final = 0.005
"""Seconds of handler time one task frame carries at most."""
FIRST_FRAME: Final = 8
"""Tasks per frame before any outcome has told how long the job's tasks take."""
MOST_PER_FRAME: Final = 128
_DECAY: Final = 0.1


class FrameSizer:
    """Keeps ``limits.max_messages`` at :data:`FRAME_WORK` over the tasks' observed duration.

    The estimate is a peak EWMA: one slow task shrinks frames at once; fast ones grow them back
    slowly, so a job of mixed tasks errs on the side of late binding.
    """

    def __init__(self, limits: FrameLimits, *, work: float = FRAME_WORK, most: int = MOST_PER_FRAME) -> None:
        self.limits = limits
        self._work = work
        self._most = most
        self._seconds: float | None = None
        limits.max_messages = min(FIRST_FRAME, most)

    @property
    def task_seconds(self) -> float | None:
        """The current estimate of a task's handler time (None before the first outcome)."""
        return self._seconds

    def observe(self, seconds: float) -> None:
        """One task's handler time (from its outcome)."""
        current = self._seconds
        if current is None or seconds > current:
            self._seconds = seconds
        else:
            self._seconds = current + (seconds - current) * _DECAY
        fits = int(self._work / self._seconds) if self._seconds > 0 else self._most
        self.limits.max_messages = max(1, min(self._most, fits))
