"""The prefetch concern: how many unsettled deliveries a listener may hold, changeable at runtime.

A :class:`Window` is shared by the leaves of one stack (one per broker) and by whoever decides
the size: the daemon sets it from its free slots (late binding: a daemon never hoards tasks it is
not running). Every leaf opened later — after a reopen too — starts with the current size; open
leaves are resized at once. The window is applied by the leaf (``basic.qos`` on RabbitMQ), so
deliveries beyond it are never sent to this consumer in the first place.

Over several brokers the window is a *total*: a stack of ``leaves`` listeners may hold up to
``size`` deliveries on each while ``split`` is off, or ``ceil(size / leaves)`` on each while it
is on. The daemon splits while every slot of the job is busy (so it holds no task another
daemon could run: RabbitMQ's prefetch cannot span connections) and lifts the split when a slot
found nothing to do (the tasks may sit on one broker only, at the end of a job).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from truba.pipes.errors import PipeError

log = logging.getLogger(__name__)


class Window:
    """A prefetch size and the leaves that apply it."""

    def __init__(self, size: int, *, leaves: int = 1) -> None:
        if size < 1:
            raise ValueError(f"prefetch window must be >= 1, got {size}")
        self.size = size
        self.leaves = max(1, leaves)
        self.split = False
        self._appliers: list[Callable[[int], Awaitable[None]]] = []

    @property
    def leaf_size(self) -> int:
        """What each leaf applies now."""
        return -(-self.size // self.leaves) if self.split else self.size

    async def set_split(self, split: bool) -> None:
        """Turns the split over leaves on or off (see the module docstring)."""
        if split == self.split or self.leaves == 1:
            return
        self.split = split
        await self._apply()

    def watch(self, apply: Callable[[int], Awaitable[None]]) -> None:
        """Registers a leaf's resize function (``RabbitListener.set_prefetch``)."""
        self._appliers.append(apply)

    def unwatch(self, apply: Callable[[int], Awaitable[None]]) -> None:
        with contextlib.suppress(ValueError):
            self._appliers.remove(apply)

    async def resize(self, size: int) -> None:
        """Sets the size on every watching leaf; a leaf whose channel is gone is skipped."""
        if size < 1:
            raise ValueError(f"prefetch window must be >= 1, got {size}")
        if size == self.size:
            return
        self.size = size
        await self._apply()

    async def _apply(self) -> None:
        size = self.leaf_size
        appliers = list(self._appliers)
        results = await asyncio.gather(*(apply(size) for apply in appliers), return_exceptions=True)
        for apply, result in zip(appliers, results, strict=True):
            if isinstance(result, PipeError):  # that leaf is gone (reopened): forget it
                self.unwatch(apply)
            elif isinstance(result, BaseException):
                raise result
        log.debug("pipe.prefetch.resized", extra={"size": size})
