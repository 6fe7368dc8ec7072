"""Bounded steps for the daemon's shutdown: a step that hangs is logged with every pending task's
stack and given up, so the daemon still exits (its supervisor would otherwise kill it later,
with no word on where it waited).

Only the steps after the runners closed go through here: by then every end is confirmed and
acked (or, after a bounded wait, left unacked for the broker to redeliver), so giving up on
closing a slot, a template, a broker connection or the scheduler link loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from types import FrameType
from typing import Final

log = logging.getLogger(__name__)

STEP_TIMEOUT: Final = 5.0
"""Seconds one shutdown step may take before it is logged and given up."""
FRAMES_SHOWN: Final = 4
"""Innermost frames shown per pending task when a step is stuck."""
MAX_DEPTH: Final = 64
"""Awaited coroutines followed at most, per task."""


async def bounded(step: str, awaitable: Awaitable[object], timeout: float | None = None) -> bool:
    """Awaits ``awaitable`` for at most ``timeout`` seconds (default :data:`STEP_TIMEOUT`);
    False (and an error logged with the pending tasks' stacks) if it did not finish: it is
    cancelled then."""
    timeout = STEP_TIMEOUT if timeout is None else timeout
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("daemon.shutdown.step_failed", extra={"step": step, "error": repr(error)})
        return True
    log.error(
        "daemon.shutdown.stuck",
        extra={"step": step, "timeout": timeout, "pending": pending_stacks(exclude=task)},
    )
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    return False


def pending_stacks(exclude: asyncio.Future[object] | None = None) -> list[str]:
    """One line per pending task of the running loop: its name and innermost frames (followed
    down the chain of awaited coroutines: a task's own stack holds its outermost frame only)."""
    current = asyncio.current_task()
    lines = []
    for task in asyncio.all_tasks():
        if task is current or task is exclude or task.done():
            continue
        frames = _awaited_frames(task.get_coro())[-FRAMES_SHOWN:]
        where = " < ".join(f"{frame.f_code.co_qualname}:{frame.f_lineno}" for frame in reversed(frames))
        lines.append(f"{task.get_name()}: {where or repr(task.get_coro())}")
    return sorted(lines)


def _awaited_frames(awaitable: object) -> list[FrameType]:
    """The frames of a suspended coroutine and of the coroutines it awaits, outermost first."""
    frames: list[FrameType] = []
    seen = 0
    while awaitable is not None and seen < MAX_DEPTH:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
        seen += 1
    return frames
