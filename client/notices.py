"""One-line notices the SDK owes its user: an outage began or ended, a job was left running.

A notice is a log record like any other (a constant event name, data in fields), at warning or
info. An application that configured no logging would otherwise see nothing, or, through
Python's last-resort handler, only the bare event name; so then the notice's text is written to
stderr instead, as one line starting with ``truba:``. Every other record of ``truba`` loggers
goes nowhere in that case (:func:`quiet_by_default`): a library does not print tracebacks of
faults it absorbs.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

NULL_HANDLER: Final = logging.NullHandler()


def quiet_by_default() -> None:
    """Records of ``truba`` loggers reach only handlers the application configured (Python's
    advice for libraries: without one, the last-resort handler would print warnings)."""
    top = logging.getLogger("truba")
    if NULL_HANDLER not in top.handlers:
        top.addHandler(NULL_HANDLER)


def notice(
    logger: logging.Logger, event: str, text: str, *, level: int = logging.WARNING, **fields: object
) -> None:
    """Logs ``event`` with ``fields``, or writes ``truba: <text>`` to stderr when the application
    configured no handler that would show it."""
    if _configured(logger):
        logger.log(level, event, extra={**fields, "text": text})
    else:
        print(f"truba: {text}", file=sys.stderr, flush=True)


def _configured(logger: logging.Logger) -> bool:
    """Whether a handler other than ours would take the logger's records."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(handler is not NULL_HANDLER for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False
