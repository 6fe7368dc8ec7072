"""Handlers for the fork server tests; slots import them as ``tests.unit.daemon.preloaded``."""

from __future__ import annotations

import os
import time

IMPORTED_BY = os.getpid()
"""The process that imported this module: a template, when preloaded, else the slot itself."""


def imported_elsewhere(_: object) -> bool:
    """True when the module was imported before this slot existed (preloaded by its template)."""
    return IMPORTED_BY != os.getpid()


def sleep(seconds: float) -> int:
    """Sleeps, then returns the slot's pid."""
    time.sleep(seconds)
    return os.getpid()
