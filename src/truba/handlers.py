"""Marks for handler functions: ``@truba.handlers.batch`` for handlers that take many tasks at once.

A batch handler receives a list of payloads and returns one result per payload, in order::

    import truba.handlers

    @truba.handlers.batch(max_size=64, max_wait=0.05)
    def embed(texts: list[str]) -> list[list[float]]:
        return model.encode(texts).tolist()

The daemon hands one slot up to ``max_size`` tasks at a time, or whatever arrived within
``max_wait`` seconds after the first; each task still gets its own outcome. Worth it when one call
on many inputs costs much less than many calls (vectorised or GPU code, per-call overhead).

This module is imported by slot processes and by user code, so it imports nothing but the
standard library: the mark is a plain attribute on the function, read with :func:`batch_spec`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

ATTRIBUTE: Final = "__truba_batch__"

F = TypeVar("F", bound=Callable[..., object])


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """How a batch handler wants its tasks: at most ``max_size`` per call, and after the first
    task arrives, at most ``max_wait`` seconds of waiting for more."""

    max_size: int
    max_wait: float

    def __post_init__(self) -> None:
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or self.max_size < 1:
            raise ValueError(f"max_size must be an int >= 1, got {self.max_size!r}")
        if not (math.isfinite(self.max_wait) and self.max_wait >= 0):
            raise ValueError(f"max_wait must be finite and >= 0, got {self.max_wait!r}")


def batch(*, max_size: int = 64, max_wait: float = 0.05) -> Callable[[F], F]:
    """Marks ``f(payloads: list) -> list`` as a batch handler; see the module docstring."""
    spec = BatchSpec(max_size, float(max_wait))

    def mark(function: F) -> F:
        setattr(function, ATTRIBUTE, spec)
        return function

    return mark


def batch_spec(function: object) -> BatchSpec | None:
    """The function's batch mark, or None for a handler that takes one task at a time."""
    spec = getattr(function, ATTRIBUTE, None)
    return spec if isinstance(spec, BatchSpec) else None


__all__ = ["BatchSpec", "batch", "batch_spec"]
