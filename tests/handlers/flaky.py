"""Handlers that fail on some attempts, counting their calls in a file the payload names."""

from __future__ import annotations

from pathlib import Path


class Busy(Exception):
    """A transient failure a job lists in ``retry_on``."""


class StillBusy(Busy):
    """A subclass: ``retry_on=[Busy]`` retries it too."""


def _calls(path: str) -> int:
    counter = Path(path)
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    return calls


def busy_twice(path: str) -> int:
    """Raises StillBusy on the first two calls for ``path``, then returns the call count."""
    calls = _calls(path)
    if calls <= 2:
        raise StillBusy(f"call {calls}: busy")
    return calls


def broken(path: str) -> int:
    """Raises ValueError, which no job retries, every time."""
    raise ValueError(f"call {_calls(path)}: broken")
