"""Which handlers a daemon agrees to run: its ``--allow`` patterns.

A handler string names code that a daemon imports, so it is remote code execution unless it
matches one of the daemon's patterns. The scheduler uses this check to plan (a job only gets
slots on daemons that allow it) and to refuse jobs nobody would run; the daemon keeps its own
copy of the check and enforces it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase


def allowed(handler: str, patterns: Iterable[str]) -> bool:
    """True if ``handler`` ("module:function") matches one of the fnmatch ``patterns``.

    Patterns match the whole string, case-sensitively and the same on every OS; ``*`` also
    matches ``.`` and ``:``, so ``examples.*`` allows ``examples.math:square``.
    """
    return any(fnmatchcase(handler, pattern) for pattern in patterns)
