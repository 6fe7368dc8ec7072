"""How big a frame may grow and how long a message may wait for one, shared by an owner's frame
senders and changed while they run; and the owners' holds (see :mod:`truba.pipes.frame`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class FrameLimits:
    """How big a frame may grow and how long a message may wait for one; read at every send,
    so a change applies at once to every sender sharing the object.

    ``max_messages`` 1 turns packing off. ``eager`` frames may be in flight before messages
    wait to be packed (0: always gather, up to ``max_delay``).
    """

    max_messages: int = 128
    max_bytes: int = 256 * 1024
    max_delay: float = 0.005
    eager: int = 1
    _holds: int = field(default=0, init=False, repr=False, compare=False)
    _on_release: list[Callable[[], None]] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_bytes < 1 or self.max_delay < 0 or self.eager < 0:
            raise ValueError("frame limits: max_messages, max_bytes >= 1; max_delay, eager >= 0")

    @property
    def holding(self) -> bool:
        """Some owner holds messages back (:meth:`hold`): none goes out alone."""
        return self._holds > 0

    def hold(self) -> None:
        """Until the matching :meth:`release`, every message waits for a frame (up to
        ``max_delay``, as under load) instead of going out alone. For an owner that knows more
        messages follow within moments (a daemon running chunks of short tasks): they then
        share frames from the first one on."""
        self._holds += 1

    def release(self) -> None:
        """Ends a :meth:`hold`. When the last one ends, what was gathered goes out at once,
        unless frames are in flight (then it waits as under load)."""
        self._holds = max(0, self._holds - 1)
        if not self._holds:
            for released in list(self._on_release):
                released()

    def on_release(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback`` whenever the last :meth:`hold` is released; returns what
        unregisters it."""
        self._on_release.append(callback)
        return functools.partial(_discard, self._on_release, callback)


def _discard(callbacks: list[Callable[[], None]], callback: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)
