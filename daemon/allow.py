"""The allow-list: which handlers a daemon agrees to import.

A job names its code as ``"package.module:function"``; importing it is running remote code, so a
daemon imports only handlers that match one of its ``--allow`` fnmatch patterns over the whole
string (``"examples.*"`` allows every function of every module under ``examples``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Final

HANDLER_RE: Final = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def is_valid_handler(handler: str) -> bool:
    """True for strings shaped like ``package.module:function``."""
    return HANDLER_RE.match(handler) is not None


def is_allowed(handler: str, patterns: Iterable[str]) -> bool:
    """True when ``handler`` is well formed and matches one of ``patterns``."""
    return is_valid_handler(handler) and any(fnmatch.fnmatchcase(handler, p) for p in patterns)
